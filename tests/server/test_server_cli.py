"""The `torchscope` CLI as a user runs it: real subprocesses, real files, real ports."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ServerProc
from server_helpers import run_frames, write_file

from torchscope.sessionfile import FRAME_HEADER_SIZE, file_header


def cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchscope.server.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    frames = run_frames("cli", steps=3)
    good = b"".join(frames)
    flipped = bytearray(frames[0])
    flipped[FRAME_HEADER_SIZE + 2] ^= 0xFF  # a byte of the first frame's body: its headers all read fine
    files = {
        "missing": d / "missing.tscope",
        "empty": d / "empty.tscope",
        "truncated": d / "truncated.tscope",
        "foreign": d / "notes.txt",
        "future": d / "future.tscope",
        "directory": d,
        "corrupt": d / "corrupt.tscope",
        "header": d / "header.tscope",
    }
    files["empty"].write_bytes(b"")
    files["header"].write_bytes(file_header())  # a run killed before its writer's first write
    files["truncated"].write_bytes(file_header() + good[:25])
    files["foreign"].write_text("just some notes\n")
    files["future"].write_bytes(file_header((7, 1)) + good)
    files["corrupt"].write_bytes(file_header() + bytes(flipped) + b"".join(frames[1:]))
    return files


NEEDLES = {"missing": "no such file", "empty": "empty", "truncated": "no complete frame",
           "foreign": "not a torchscope session file", "future": "newer torchscope", "directory": "directory",
           "corrupt": "checksum mismatch", "header": "holds no events: the run ended (or was killed) before its first"}


# every kind of bad file through `info`; `open` and `doctor` share its check, so two each
@pytest.mark.parametrize("command, kind", [*[("info", k) for k in NEEDLES], ("open", "missing"),
                                           ("open", "truncated"), ("doctor", "foreign"), ("doctor", "future"),
                                           ("doctor", "corrupt"), ("doctor", "header")])
def test_bad_files_one_line_nonzero(bad_files: dict[str, Path], command: str, kind: str) -> None:
    extra = ["--no-browser", "--port", "1"] if command == "open" else []
    res = cli(command, str(bad_files[kind]), *extra)
    line = one_line_error(res)
    assert NEEDLES[kind] in line
    assert res.returncode == 2  # as --help says: bad input (doctor's 1 is an error-level finding)


def test_open_of_a_file_the_server_refuses_starts_no_server(bad_files: dict[str, Path], tmp_path: Path) -> None:
    """A body the frame headers do not show damaged is refused by the server `open` started:
    that server used to stay behind on the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = cli("open", str(bad_files["corrupt"]), "--port", str(port), "--no-browser", "--data", str(tmp_path / "d"))
    line = one_line_error(res)
    assert res.returncode == 2 and line == "torchscope: corrupt.tscope is corrupt at byte 16: frame checksum mismatch"
    assert (tmp_path / "d" / "torchscope.db").exists()  # a server was started and stored ...
    with socket.socket() as s:  # ... and is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_info_summarizes(tmp_path: Path) -> None:
    path = write_file(tmp_path / "run.tscope", run_frames("cli-info", steps=7, graph_steps=(0, 5)))
    res = cli("info", str(path))
    assert res.returncode == 0, res.stderr
    fields = dict(line.split(":", 1) for line in res.stdout.splitlines())
    assert all(v.startswith(" ") for v in fields.values())  # a space after every label's colon
    assert fields["name"].strip() == "run" and fields["model"].strip() == "MLP"
    assert fields["steps"].strip() == "7" and fields["graphs captured"].strip() == "2"
    assert fields["status"].strip() == "finished" and fields["ranks"].strip() == "0"
    assert "torn tail" not in fields
    # a killed writer's file: its last frame cut short is not read, and info says so
    frames = run_frames("cli-info", steps=7, graph_steps=(0, 5), end=False)
    torn = write_file(tmp_path / "torn.tscope", [*frames[:-1], frames[-1][:30]])
    res = cli("info", str(torn))
    assert res.returncode == 0, res.stderr
    fields = dict(line.split(":", 1) for line in res.stdout.splitlines())
    assert fields["torn tail"].strip().startswith("30 B after the last whole frame")
    assert fields["status"].strip() == "ended unexpectedly"


def test_open_on_a_port_another_program_holds_says_so(tmp_path: Path) -> None:
    """It said only 'could not start a server ... see server.log'."""
    path = write_file(tmp_path / "run.tscope", run_frames("cli-open", steps=2))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        res = cli("open", str(path), "--port", str(port), "--no-browser", "--data", str(tmp_path / "data"))
    line = one_line_error(res)
    assert res.returncode != 0 and f"port {port} is in use by another program" in line


def test_version() -> None:
    from torchscope.server.config import version

    res = cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"torchscope {version()}"


def test_port_in_use_names_the_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        res = cli("serve", "--port", str(port), "--data", "/tmp/torchscope-unused")
    line = one_line_error(res)
    assert res.returncode == 2 and str(port) in line and "--port" in line


@pytest.mark.parametrize("args", [["serve", "--port", "0"], ["serve", "--port", "http"], ["frobnicate"],
                                  ["serve", "--db", "postgresql://db/x", "--port", "1"]])
def test_bad_arguments(args: list[str]) -> None:
    one_line_error(cli(*args))


def test_open_imports_into_a_running_server(tmp_path: Path) -> None:
    path = write_file(tmp_path / "run.tscope", run_frames("cli-open", steps=4))
    srv = ServerProc(tmp_path / "data").start()
    try:
        res = cli("open", str(path), "--port", str(srv.port), "--no-browser")
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"{srv.url}/sessions/cli-open"
        assert srv.get("/api/sessions/cli-open")["steps"] == 4  # type: ignore[index]
    finally:
        srv.stop()


def test_a_server_with_a_token_is_named_so(tmp_path: Path) -> None:
    """Against a token server: `open` prints a URL that opens (with ?token=), `demo` without the
    token stops at once with one line, and a watched run says the server wants a token, not that
    it cannot be reached."""
    import os
    import urllib.request

    token = "t0ken-for-the-test"
    path = write_file(tmp_path / "run.tscope", run_frames("cli-token", steps=2))
    srv = ServerProc(tmp_path / "data", extra=["--token", token]).start()
    bare = {k: v for k, v in os.environ.items() if k != "TORCHSCOPE_TOKEN"}
    try:
        res = cli("open", str(path), "--port", str(srv.port), "--no-browser", env={**bare, "TORCHSCOPE_TOKEN": token})
        assert res.returncode == 0, res.stderr
        url = res.stdout.strip()
        assert url == f"{srv.url}/sessions/cli-token?token={token}"
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200
        # a file larger than the socket's buffers, refused before its upload: not a "broken pipe"
        big = write_file(tmp_path / "big.tscope", run_frames("cli-big", steps=8000, graph_steps=tuple(range(0, 8000, 2))))
        assert big.stat().st_size > 2 << 20
        line = one_line_error(cli("open", str(big), "--port", str(srv.port), "--no-browser", env=bare))
        assert "needs its token" in line and "TORCHSCOPE_TOKEN" in line
        line = one_line_error(cli("open", str(path), "--port", str(srv.port), "--no-browser",
                                  env={**bare, "TORCHSCOPE_TOKEN": "not-the-token"}))
        assert "not this server's token" in line and "TORCHSCOPE_TOKEN" in line
        line = one_line_error(cli("demo", "--port", str(srv.port), "--no-browser", "--steps", "2", env=bare))
        assert "needs its token" in line and "TORCHSCOPE_TOKEN" in line
        code = ("import torch, torchscope; m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), 0.1)\n"
                f"w = torchscope.watch(m, o, server={srv.url!r}, record={str(tmp_path / 'w.tscope')!r})\n"
                "for _ in range(3): o.zero_grad(); m(torch.randn(4, 2)).sum().backward(); o.step()\n"
                "w.close()\n")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=bare)
        assert run.returncode == 0, run.stderr
        assert "needs its token" in run.stderr and "not reachable" not in run.stderr, run.stderr
    finally:
        srv.stop()


def test_help_lists_commands() -> None:
    res = cli("--help")
    assert res.returncode == 0
    for command in ("serve", "open", "demo", "info", "doctor"):
        assert command in res.stdout


def test_demo_shows_its_transformer_run_and_ctrl_c_ends_it_quietly(tmp_path: Path) -> None:
    """`torchscope demo` prints the page of its transformer run (not whichever run the server
    listed first), and Ctrl-C in the terminal -- SIGINT to the whole foreground process group,
    the demo's training too -- ends it with one line, no traceback, the runs closed."""
    import os
    import signal
    import time

    srv = ServerProc(tmp_path / "data").start()
    proc = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "demo", "--port", str(srv.port),
                             "--no-browser", "--steps", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, start_new_session=True)
    try:
        assert proc.stdout is not None
        url = ""
        while not url.startswith("http"):  # the demo's training prints its losses here too
            url = proc.stdout.readline().strip()
        sid = url.rsplit("/", 1)[-1]
        assert url == f"{srv.url}/sessions/{sid}"
        detail = srv.get(f"/api/sessions/{sid}")
        assert isinstance(detail, dict) and str(detail["name"]).endswith("transformer")
        deadline = time.monotonic() + 60
        while srv.get(f"/api/sessions/{sid}")["steps"] < 3 and time.monotonic() < deadline:  # type: ignore[index]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "demo stopped" in err, err
        for s in srv.get("/api/sessions"):  # type: ignore[union-attr]
            # closed by their watches, not "ended unexpectedly"; a run the Ctrl-C stopped says so
            assert s["status"] in ("interrupted", "finished"), s
        assert srv.get(f"/api/sessions/{sid}")["status"] == "interrupted"  # type: ignore[index]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        srv.stop()
