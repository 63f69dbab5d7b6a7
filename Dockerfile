# torchscope dashboard server.  CPU-only torch (the server never runs a model; the package
# depends on torch because the capture side ships in the same distribution).
FROM python:3.11-slim
WORKDIR /app
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY . /app
RUN pip install --no-cache-dir /app
VOLUME /data
EXPOSE 6150
# Bound to all interfaces inside the container, so a token is required: set TORCHSCOPE_TOKEN
# (docker-compose.yml does), or the server generates one and prints it in the URL.
CMD ["torchscope", "serve", "--host", "0.0.0.0", "--port", "6150", "--data", "/data"]
