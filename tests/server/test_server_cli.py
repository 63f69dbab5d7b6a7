"""The `torchscope` CLI as a user runs it: real subprocesses, real files, real ports."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXAMPLES, ServerProc, free_port, run_script
from server_helpers import frame_of_line, run_frames, write_file

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


def test_open_of_a_file_the_server_refuses_starts_no_server(tmp_path: Path) -> None:
    """A body the CLI's check (headers and checksums) does not show bad -- a record that is not
    JSON, its checksum right -- is refused by the server `open` started: that server used to
    stay behind on the port."""
    frames = run_frames("cli", steps=3)
    bad = write_file(tmp_path / "bad.tscope", [frames[0], frame_of_line(1, b"not json"), *frames[2:]])
    port = free_port()
    res = cli("open", str(bad), "--port", str(port), "--no-browser", "--data", str(tmp_path / "d"))
    line = one_line_error(res)
    offset = 16 + len(frames[0])
    assert res.returncode == 2
    assert line == f"torchscope open: bad.tscope is corrupt at byte {offset}: frame holds a record that is not JSON"
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
    assert fields["status"].strip() == "finished" and fields["ranks"].strip() == "1 (rank 0)"
    assert "note" not in fields
    # a killed writer's file: its last frame cut short is not read, and info says so
    frames = run_frames("cli-info", steps=7, graph_steps=(0, 5), end=False)
    torn = write_file(tmp_path / "torn.tscope", [*frames[:-1], frames[-1][:30]])
    res = cli("info", str(torn))
    assert res.returncode == 0, res.stderr
    fields = dict(line.split(":", 1) for line in res.stdout.splitlines())
    assert fields["note"].strip() == (f"{torn} is incomplete: the 30 bytes after its last whole frame were "
                                      "dropped (the run was killed, or the file was cut short)")
    assert fields["status"].strip() == "ended unexpectedly"


@pytest.mark.parametrize("command", ["info", "doctor", "open"])
def test_a_bad_file_is_named_by_the_path_given(tmp_path: Path, command: str) -> None:
    """Runs of one experiment grid are all called run.tscope: the error names the one given,
    not its basename (it said only "run.tscope is empty")."""
    (tmp_path / "lr-0.01").mkdir()
    bad = tmp_path / "lr-0.01" / "run.tscope"
    bad.write_bytes(b"")
    extra = ["--no-browser", "--port", "1"] if command == "open" else []
    line = one_line_error(cli(command, str(bad), *extra))
    assert f"{bad} is empty" in line, line


def test_open_on_a_port_another_program_holds_says_so(tmp_path: Path) -> None:
    """It said only 'could not start a server ... see server.log'.  The other program answers
    HTTP (a notebook server, another dashboard): it is not waited for as a server starting."""
    path = write_file(tmp_path / "run.tscope", run_frames("cli-open", steps=2))
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        port = other.server_address[1]
        res = cli("open", str(path), "--port", str(port), "--no-browser", "--data", str(tmp_path / "data"))
    finally:
        other.shutdown()
        other.server_close()
    line = one_line_error(res)
    assert res.returncode == 2 and f"port {port} is in use by another program" in line  # as `serve` exits


def test_open_waits_for_a_server_still_starting_on_its_port(tmp_path: Path) -> None:
    """A server binds its port, then imports and opens its store, and answers a second or more
    later; `torchscope open` in that window (right after a training script's watch() started
    one) said "port ... is in use by another program".  The server is held (SIGSTOP) between
    binding its port and answering, as a loaded machine holds it."""
    path = write_file(tmp_path / "run.tscope", run_frames("cli-open", steps=3))
    port, data = free_port(), tmp_path / "data"
    srv = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(port), "--quiet",
                            "--data", str(data)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.005)
        os.kill(srv.pid, signal.SIGSTOP)
        opener = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "open", str(path), "--port", str(port),
                                   "--no-browser"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # well past the one-second probe
        assert opener.poll() is None, opener.communicate()
        os.kill(srv.pid, signal.SIGCONT)
        out, err = opener.communicate(timeout=120)
        assert opener.returncode == 0, err
        assert f"port {port} takes connections but answers nothing yet (a server starting?)" in err
        assert out.strip() == f"http://127.0.0.1:{port}/sessions/cli-open"
        assert (data / "torchscope.db").exists()  # the run went to that server, started by no one else
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/sessions/cli-open", timeout=10) as r:
            assert json.loads(r.read())["steps"] == 3
    finally:
        os.kill(srv.pid, signal.SIGCONT)
        srv.terminate()
        srv.wait(30)


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
        assert "already on this server" not in res.stderr and "--data" not in res.stderr
        again = cli("open", str(path), "--port", str(srv.port), "--no-browser")  # the same file twice
        assert again.returncode == 0 and again.stdout == res.stdout, again.stderr
        assert f"{path} is already on this server (the same run): nothing new imported" in again.stderr
        # --data is for a server the command starts: this one stores elsewhere, and the user is told
        other = cli("open", str(path), "--port", str(srv.port), "--no-browser", "--data", str(tmp_path / "mine"))
        assert other.returncode == 0, other.stderr
        assert (f"note: a server was already running at {srv.url}; it stores the run in its own data directory, "
                f"not in --data {tmp_path / 'mine'}") in other.stderr
        assert not (tmp_path / "mine").exists()
        assert srv.get("/api/sessions/cli-open")["steps"] == 4  # type: ignore[index]
    finally:
        srv.stop()


def test_open_of_several_files_imports_each_and_pairs_two(tmp_path: Path) -> None:
    """`torchscope open a.tscope b.tscope` (a shell's `runs/*.tscope`): each imported, its URL
    printed; two runs also get the Compare page's URL (QA 48d: "unrecognized arguments").  A bad
    file among them is said, and the others imported (QA 51c: one stray file imported nothing)."""
    a = write_file(tmp_path / "a.tscope", run_frames("cli-a", steps=3))
    b = write_file(tmp_path / "b.tscope", run_frames("cli-b", steps=5))
    srv = ServerProc(tmp_path / "data").start()
    try:
        res = cli("open", str(a), str(b), "--port", str(srv.port), "--no-browser")
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == [f"{srv.url}/sessions/cli-a", f"{srv.url}/sessions/cli-b"]
        assert f"both runs side by side: {srv.url}/compare?a=cli-a&b=cli-b" in res.stderr
        assert srv.get("/api/sessions/cli-a")["steps"] == 3 and srv.get("/api/sessions/cli-b")["steps"] == 5  # type: ignore[index]
        bad = tmp_path / "bad.tscope"
        bad.write_bytes(b"not a session file")
        c = write_file(tmp_path / "c.tscope", run_frames("cli-c", steps=2))
        refused = cli("open", str(c), str(bad), "--port", str(srv.port), "--no-browser")
        assert refused.returncode == 2 and "bad.tscope" in refused.stderr and "Traceback" not in refused.stderr
        assert any(x["id"] == "cli-c" for x in srv.get("/api/sessions"))  # type: ignore[union-attr, index]
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
            line = proc.stdout.readline()
            assert line, "the demo ended without printing its URL on a line of its own"
            url = line.strip()
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
        # it trains two models: the page printed is one, and the user is told where the other is
        assert f"its MLP run is beside it in the sessions list at {srv.url}/" in err, err
        assert sum(str(s["name"]).endswith("mlp") for s in srv.get("/api/sessions")) == 1  # type: ignore[union-attr]
        for s in srv.get("/api/sessions"):  # type: ignore[union-attr]
            # closed by their watches, not "ended unexpectedly"; a run the Ctrl-C stopped says so
            assert s["status"] in ("interrupted", "finished"), s
        assert srv.get(f"/api/sessions/{sid}")["status"] == "interrupted"  # type: ignore[index]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        srv.stop()


def test_a_mistyped_port_names_the_server_already_running(tmp_path: Path) -> None:
    """`open --port` of a port where nothing answers starts a second, empty server there (QA 42:
    a typo'd port showed the run alone in a new store, unsaid): the usual server, running, is named."""
    import os
    import re
    import signal

    srv = ServerProc(tmp_path / "data").start()
    try:
        path = write_file(tmp_path / "run.tscope", run_frames("cli-typo", steps=2))
        res = cli("open", str(path), "--port", str(free_port()), "--no-browser", "--data", str(tmp_path / "d"),
                  env=_bare_env(TORCHSCOPE_SERVER=srv.url))
        assert res.returncode == 0, res.stderr
        pid = re.search(r"\(pid (\d+)\)", res.stderr)
        assert pid, res.stderr
        os.kill(int(pid[1]), signal.SIGTERM)
        assert "note: no server answered at http://127.0.0.1:" in res.stderr, res.stderr
        assert res.stderr.strip().endswith(f"a torchscope server is also running at {srv.url}"), res.stderr
    finally:
        srv.stop()


def _bare_env(**extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("TORCHSCOPE_SERVER", "TORCHSCOPE_TOKEN")}
    return {**env, **extra}


def test_open_follows_TORCHSCOPE_SERVER_and_its_token(tmp_path: Path) -> None:
    """`open` used the server on --port's default (starting a second one there, unsaid) whatever
    $TORCHSCOPE_SERVER said; now it goes where watch() sends runs, with $TORCHSCOPE_TOKEN, or to
    --server."""
    token = "t0ken-of-the-env"
    path = write_file(tmp_path / "run.tscope", run_frames("cli-env", steps=3))
    srv = ServerProc(tmp_path / "data", extra=["--token", token]).start()
    try:
        res = cli("open", str(path), "--no-browser", "--data", str(tmp_path / "elsewhere"),
                  env=_bare_env(TORCHSCOPE_SERVER=srv.url + "/", TORCHSCOPE_TOKEN=token))
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"{srv.url}/sessions/cli-env?token={token}"
        # no server started: only that --data (for a server started here) went unused
        assert res.stderr == (f"torchscope open: note: a server was already running at {srv.url}; it stores the run in "
                              f"its own data directory, not in --data {tmp_path / 'elsewhere'}\n"), res.stderr
        assert not (tmp_path / "elsewhere").exists()
        again = write_file(tmp_path / "again.tscope", run_frames("cli-flag", steps=2))
        res = cli("open", str(again), "--no-browser", "--server", srv.url,
                  env=_bare_env(TORCHSCOPE_SERVER="http://127.0.0.1:1", TORCHSCOPE_TOKEN=token))
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"{srv.url}/sessions/cli-flag?token={token}"  # --server wins
    finally:
        srv.stop()


@pytest.mark.parametrize(("args", "env", "expect"), [
    (["open", "F", "--no-browser"], {"TORCHSCOPE_SERVER": "notaurl"},
     "torchscope open: TORCHSCOPE_SERVER='notaurl' is not an http(s) URL (e.g. http://127.0.0.1:6150)"),
    (["demo", "--no-browser", "--server", "ftp://x"], {},
     "torchscope demo: --server 'ftp://x' is not an http(s) URL (e.g. http://127.0.0.1:6150)"),
    (["open", "F", "--server", "http://127.0.0.1:1", "--port", "2"], {},
     "torchscope open: give --server or --port, not both"),
])
def test_a_bad_server_is_one_line(tmp_path: Path, args: list[str], env: dict[str, str], expect: str) -> None:
    path = write_file(tmp_path / "run.tscope", run_frames("cli-bad-server", steps=1))
    res = cli(*[str(path) if a == "F" else a for a in args], env=_bare_env(**env))
    assert one_line_error(res) == expect and res.returncode == 2


def test_a_server_started_in_the_background_is_named_with_its_pid(tmp_path: Path) -> None:
    """It used to say nothing (`open`) or "(it keeps running after this script)" (watch()):
    now its URL, its pid and how to stop it."""
    import os
    import re
    import signal

    path = write_file(tmp_path / "run.tscope", run_frames("cli-started", steps=2))
    port = free_port()
    # (the usual server, $TORCHSCOPE_SERVER's, answers nowhere: no note of it)
    res = cli("open", str(path), "--port", str(port), "--no-browser", "--data", str(tmp_path / "d"),
              env=_bare_env(TORCHSCOPE_SERVER="http://127.0.0.1:1"))
    assert res.returncode == 0, res.stderr
    m = re.fullmatch(rf"torchscope open: started a torchscope server at http://127\.0\.0\.1:{port} in the "
                     r"background \(pid (\d+)\); it keeps running after this ends: stop it with `kill (\d+)`",
                     res.stderr.strip())
    assert m and m[1] == m[2], res.stderr
    pid = int(m[1])
    try:
        assert "torchscope.server.cli" in Path(f"/proc/{pid}/cmdline").read_bytes().decode().replace("\0", " ")
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) == 0
    finally:
        os.kill(pid, signal.SIGTERM)
    # watch() says the same of the server it starts
    code = ("import torch, torchscope; m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), 0.1)\n"
            f"w = torchscope.watch(m, o, record={str(tmp_path / 'w.tscope')!r})\n"
            "for _ in range(3): o.zero_grad(); m(torch.randn(4, 2)).sum().backward(); o.step()\n"
            "w.close()\n")
    port = free_port()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=_bare_env(TORCHSCOPE_SERVER=f"http://127.0.0.1:{port}",
                                       TORCHSCOPE_DATA=str(tmp_path / "wd")))
    m = re.search(rf"no server answered at http://127\.0\.0\.1:{port}; started a torchscope server at "
                  rf"http://127\.0\.0\.1:{port} in the background \(pid (\d+)\).*stop it with `kill (\d+)`", run.stderr)
    assert run.returncode == 0 and m and m[1] == m[2], run.stderr
    os.kill(int(m[1]), signal.SIGTERM)


def test_watch_with_a_malformed_TORCHSCOPE_SERVER_records_to_the_file_only(tmp_path: Path) -> None:
    """It said "started one in the background" and started nothing."""
    code = ("import torch, torchscope; m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), 0.1)\n"
            f"w = torchscope.watch(m, o, record={str(tmp_path / 'w.tscope')!r})\n"
            "for _ in range(3): o.zero_grad(); m(torch.randn(4, 2)).sum().backward(); o.step()\n"
            "w.close()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=_bare_env(TORCHSCOPE_SERVER="notaurl"))
    assert run.returncode == 0, run.stderr
    assert ("torchscope: TORCHSCOPE_SERVER='notaurl' is not an http(s) URL; recording to the file only"
            in run.stderr.splitlines())
    assert "started" not in run.stderr and "never answered" not in run.stderr, run.stderr
    res = cli("info", str(tmp_path / "w.tscope"))
    assert res.returncode == 0 and "status:          finished" in res.stdout


def test_info_of_several_files(tmp_path: Path) -> None:
    a = write_file(tmp_path / "a.tscope", run_frames("cli-a", steps=2))
    b = write_file(tmp_path / "b.tscope", run_frames("cli-b", steps=5))
    res = cli("info", str(a), str(b))
    assert res.returncode == 0, res.stderr
    blocks = [dict((k, v.strip()) for k, v in (ln.split(":", 1) for ln in block.splitlines()))
              for block in res.stdout.strip().split("\n\n")]
    assert [(f["file"], f["steps"]) for f in blocks] == [(str(a), "2"), (str(b), "5")]
    # one unreadable among them: its one line, the others' summaries, exit 2
    res = cli("info", str(a), str(tmp_path / "missing.tscope"), str(b))
    assert res.returncode == 2 and res.stderr.strip() == f"torchscope info: {tmp_path / 'missing.tscope'}: no such file"
    assert res.stdout.count("name:") == 2


def test_doctor_reads_a_file_damaged_in_the_middle(tmp_path: Path) -> None:
    frames = run_frames("cli-doc", steps=12, per_frame=2)
    data = bytearray(file_header() + b"".join(frames))
    offset = 16 + sum(map(len, frames[:4]))
    data[offset + FRAME_HEADER_SIZE + 3] ^= 0xFF
    path = tmp_path / "mid.tscope"
    path.write_bytes(bytes(data))
    res = cli("doctor", str(path))
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr
    assert f"mid.tscope is damaged at byte {offset:,}" in res.stderr, res.stderr
    assert f"the {len(data) - offset:,} bytes from there to its end were dropped" in res.stderr


def test_serve_texts(tmp_path: Path) -> None:
    """`--data FILE` says it is a file; uvicorn's INFO lines only with --verbose; the token page
    of a server on 127.0.0.1 does not claim it is reachable from other machines."""
    import urllib.error
    import urllib.request

    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    line = one_line_error(cli("serve", "--data", str(notes), "--port", str(free_port())))
    assert line == (f"torchscope serve: the data directory {notes} is a file, not a directory: give --data a "
                    "directory (created if missing)")
    for extra, expect_info in (([], False), (["--verbose"], True)):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(port),
                                 "--data", str(tmp_path / "d"), "--token", "tok", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            from conftest import wait_for

            assert wait_for(lambda port=port: socket.socket().connect_ex(("127.0.0.1", port)) == 0)
            req = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"Accept": "text/html"})
            with pytest.raises(urllib.error.HTTPError) as page:
                urllib.request.urlopen(req, timeout=10)
            assert "needs its token" in (text := page.value.read().decode()) and "other machines" not in text
        finally:
            proc.terminate()
            out, err = proc.communicate(timeout=30)
        assert out.startswith(f"torchscope dashboard: http://127.0.0.1:{port}/?token=tok")
        assert ("INFO:" in err) == expect_info, err
        assert ('"GET / HTTP/1.1" 401' in out) == expect_info, out  # uvicorn's access lines go to stdout


@pytest.mark.parametrize("command", ["serve", "open", "demo", "info", "doctor"])
def test_every_command_help_has_examples(command: str) -> None:
    res = cli(command, "--help")
    assert res.returncode == 0 and "\nexamples:\n  torchscope " + command in res.stdout
    if command in ("open", "demo"):
        assert "TORCHSCOPE_SERVER" in res.stdout and "TORCHSCOPE_TOKEN" in res.stdout and "--server" in res.stdout


def test_a_token_no_request_can_carry_is_one_line(tmp_path: Path) -> None:
    """A token with a newline inside (pasted from two lines): `serve` and `open` refuse it in
    one line -- no server that nobody could open, no header error from http.client."""
    bad = "first\nsecond"
    res = cli("serve", "--port", str(free_port()), "--data", str(tmp_path / "d"), "--token", bad, env=_bare_env())
    assert one_line_error(res) == ("torchscope serve: the token holds a control character (a newline?), which no "
                                   "browser or HTTP client can send: choose one without") and res.returncode == 2
    path = write_file(tmp_path / "run.tscope", run_frames("cli-bad-token", steps=1))
    res = cli("open", str(path), "--no-browser", "--server", "http://127.0.0.1:1", env=_bare_env(TORCHSCOPE_TOKEN=bad))
    assert one_line_error(res).startswith("torchscope open: TORCHSCOPE_TOKEN: the token holds a control character")
    assert res.returncode == 2


def test_a_token_read_from_a_file_keeps_no_newline(tmp_path: Path) -> None:
    """TORCHSCOPE_TOKEN=$(cat token.txt) keeps the file's last newline in some shells' uses
    (`export TORCHSCOPE_TOKEN="$(<f)"` does not, `read`-less env files do): stripped, as the
    server strips its own, and URL-encoded in the printed URL."""
    token = "a+b/c=d"
    path = write_file(tmp_path / "run.tscope", run_frames("cli-nl-token", steps=2))
    with ServerProc(tmp_path / "data", extra=["--token", token]) as srv:
        res = cli("open", str(path), "--no-browser", "--server", srv.url, env=_bare_env(TORCHSCOPE_TOKEN=token + "\n"))
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"{srv.url}/sessions/cli-nl-token?token=a%2Bb%2Fc%3Dd"


SLOW_RUN = '''
import sys, time
import torch
import torchscope
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torchscope.watch(model, opt, server=None, record=sys.argv[1]):
    for _ in range(int(sys.argv[2])):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        time.sleep(0.05)
print("trained", flush=True)
time.sleep(float(sys.argv[3]))  # the process outlives its run: a notebook's kernel
'''


@contextlib.contextmanager
def _slow_run(tmp_path: Path, steps: int, linger: float) -> Iterator[tuple[Path, subprocess.Popen[str], ServerProc]]:
    """A run of ``steps`` steps recording to a file (its process living ``linger`` s after it),
    once the file holds 5 steps, and a server; both stopped after."""
    import time

    from torchscope.sessionfile import iter_events

    script, path = tmp_path / "slow.py", tmp_path / "slow.tscope"
    script.write_text(SLOW_RUN)
    train = subprocess.Popen([sys.executable, str(script), str(path), str(steps), str(linger)], stdout=subprocess.PIPE, text=True)
    srv = ServerProc(tmp_path / "data").start()
    try:
        deadline = time.monotonic() + 60
        while not (path.exists() and sum(1 for e in iter_events(path) if e["kind"] == "step") >= 5):
            assert time.monotonic() < deadline and train.poll() is None, f"{path} never held 5 steps"
            time.sleep(0.1)
        yield path, train, srv
    finally:
        train.kill()
        train.wait()
        srv.stop()


def test_open_follows_a_file_its_run_is_still_writing(tmp_path: Path) -> None:
    """`torchscope open` of a file its run (this machine's process) still writes: the server
    says "running", not "ended unexpectedly" (what it said before), and the command imports the
    file again as it grows until the run's end event is in -- although the process lives on --
    so the server ends with every step and "finished"."""
    import time

    with _slow_run(tmp_path, 120, 30) as (path, train, srv):
        opener = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "open", str(path), "--port",
                                   str(srv.port), "--no-browser"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sid = None
        statuses, seen = set(), []
        while opener.poll() is None:
            for row in srv.get("/api/sessions"):  # type: ignore[union-attr]
                sid = row["id"]
                statuses.add(row["status"])
                seen.append(row["steps"])
            time.sleep(0.2)
        out, err = opener.communicate()
        assert opener.returncode == 0, err
        assert out.strip() == f"{srv.url}/sessions/{sid}"
        assert "slow.tscope is still being written by its run" in err and "slow.tscope's run has ended" in err, err
        assert train.poll() is None  # the process lives on: its end event stopped the following
        assert "running" in statuses and statuses <= {"running", "finished"}, statuses  # never "ended unexpectedly"
        assert len(set(seen)) > 2 and seen == sorted(seen)  # imported again and again as it grew
        row = srv.get(f"/api/sessions/{sid}")
        assert row["steps"] == 120 and row["status"] == "finished", row  # type: ignore[index]


def test_open_no_follow_imports_a_growing_file_as_it_is(tmp_path: Path) -> None:
    with _slow_run(tmp_path, 400, 0) as (path, train, srv):
        res = cli("open", str(path), "--port", str(srv.port), "--no-browser", "--no-follow")
        assert res.returncode == 0 and "following" not in res.stderr, res.stderr
        # said, not left to read later as a killed run (QA 49b)
        assert (f"{path}'s run is still writing it: imported as it is now; open it again for the rest (without "
                "--no-follow, open follows it to its end)") in res.stderr, res.stderr
        assert train.poll() is None  # (returned while the run goes on)
        sid = res.stdout.strip().rsplit("/", 1)[1]
        row = srv.get(f"/api/sessions/{sid}")
        assert row["status"] == "running" and 5 <= row["steps"] < 400, row  # type: ignore[index]


def test_open_of_several_files_says_which_runs_are_still_writing(tmp_path: Path) -> None:
    """Several files are imported as they are: one whose run is still writing it is said to be,
    with the command that follows it (QA 48e: neither followed, nothing said)."""
    done = write_file(tmp_path / "done.tscope", run_frames("cli-done", steps=2))
    with _slow_run(tmp_path, 400, 0) as (path, train, srv):
        res = cli("open", str(done), str(path), "--port", str(srv.port), "--no-browser")
        assert res.returncode == 0 and train.poll() is None, res.stderr
        assert f"{path}'s run is still writing it: imported as it is now" in res.stderr, res.stderr
        assert f"torchscope open {path})" in res.stderr and f"{done}'s run" not in res.stderr


def test_an_extra_argument_is_told_by_its_commands_parser(tmp_path: Path) -> None:
    """``torchscope doctor a.tscope --bogus`` said "torchscope: unrecognized arguments: --bogus
    (see torchscope --help)", the top-level parser's words for a command's mistake (QA 36c).
    (Several files are the doctor's arguments since QA 51c.)"""
    res = cli("doctor", "a.tscope", "--bogus")
    assert res.returncode == 2
    assert one_line_error(res) == "torchscope doctor: unrecognized arguments: --bogus (see torchscope doctor --help)"
    res = cli("info", "--port", "1", "a.tscope")
    assert one_line_error(res) == "torchscope info: unrecognized arguments: --port (see torchscope info --help)"
    assert one_line_error(cli("--bogus")) == "torchscope: unrecognized arguments: --bogus (see torchscope --help)"


def test_the_doctor_help_example_with_settings_runs(tmp_path: Path) -> None:
    """Its example read "--set KEY=VALUE   (keys below)", with nothing below; it is a command
    that runs now."""
    path = tmp_path / "p05.tscope"
    run_script(EXAMPLES / "pitfalls" / "p05_missing_zero_grad.py", "--record", str(path))
    example = next(line.strip() for line in cli("doctor", "--help").stdout.splitlines() if "--set" in line
                   and line.strip().startswith("torchscope doctor"))
    res = cli(*example.replace("run.tscope", str(path)).split()[1:])
    assert res.returncode == 1 and "P5" in res.stdout, (example, res.stdout, res.stderr)


def test_serve_says_where_a_db_url_put_the_store(tmp_path: Path) -> None:
    """``--db sqlite:///dir/x.db`` is relative to the working directory (SQLAlchemy's form); the
    startup line named only --data, and QA 36c looked for the store there."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(port), "--data",
                             str(tmp_path / "data"), "--db", "sqlite:///rel/x.db"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("torchscope dashboard: http://127.0.0.1:") and f"(data: {tmp_path / 'rel' / 'x.db'})" in line, line
        assert (tmp_path / "rel" / "x.db").exists()
    finally:
        proc.kill()
        proc.communicate()


def test_a_server_that_answers_during_the_probe_is_used(tmp_path: Path) -> None:
    """The server on the port answers while the command probes it (it bound its port after the
    first look, and was ready a moment later: `torchscope serve --port P &` then `open` at once,
    QA 49d): it is that server, not "another program".  Held with SIGSTOP past the first look,
    let go in the middle of the one-second probe."""
    from torchscope.server.client import ensure_server

    port = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "serve", "--port", str(port), "--quiet",
                            "--data", str(tmp_path / "data")])
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # ready, then held: it takes connections and answers none
            with contextlib.suppress(OSError), urllib.request.urlopen(base + "/api/health", timeout=1):
                break
            time.sleep(0.05)
        os.kill(srv.pid, signal.SIGSTOP)
        threading.Timer(1.5, os.kill, (srv.pid, signal.SIGCONT)).start()  # the first look times out at 1 s
        assert ensure_server(base, str(tmp_path / "other")) == (base, None)
    finally:
        os.kill(srv.pid, signal.SIGCONT)
        srv.terminate()
        srv.wait(30)
