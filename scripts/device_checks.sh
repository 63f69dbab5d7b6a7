#!/bin/bash
# One device session as one command (run from the repository root on a machine with a GPU):
# install, the CUDA checks (scripts/cuda_check.py), the GPU bench; results under ${OUT:-.}.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print(torch.__version__, torch.version.cuda)"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -1
date +%T
# full mode's C++ op recorder (~30 s to build; without it full mode records in Python)
timeout 120 python3 -m torchscope._native 2>&1 | tail -1
timeout 240 python3 scripts/cuda_check.py 2>&1 | grep -v "^torchscope: watching" | tee ${OUT:-.}/cuda_check.txt
echo "cuda_check rc=${PIPESTATUS[0]}"; date +%T
timeout ${BENCH_S:-200} python3 benchmarks/bench_capture.py --device cuda --models ${MODELS:-transformer,cnn,mlp,transformer-large,resnet20} 2>&1 | tee ${OUT:-.}/bench_cuda.txt | tail -30
date +%T
