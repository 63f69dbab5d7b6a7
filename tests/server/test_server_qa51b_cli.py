"""QA 51c's CLI findings, as a user meets them: real `torchscope` subprocesses, real files, a real
server on a real port.

- `open` of several files with bad ones among them imports the good ones, says each bad one,
  and exits 2 (it imported nothing and named only the first bad file);
- `doctor` of several files (a usage error before), each under a header, exit 2/1/0;
- a gzip'd session file is said to be one (`open`, `info`, `doctor`, the import);
- `open --no-follow` of a live run the server already holds says one thing, not two;
- a server bound beyond loopback keeps its generated token across restarts, in a file only its
  owner reads, in a data directory only its owner reads, and prints the LAN address."""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from conftest import ServerProc, free_port, wait_for
from server_helpers import frame_of_line, run_frames, session_event, step_event, write_file
from test_server_cli import cli, one_line_error

from torchscope.sessionfile import encode_frame, index

GZIP_SAID = "is gzip-compressed, not a torchscope session file itself: gunzip it first"


def _run(path: Path, sid: str, nan_from: int | None = None) -> Path:
    """A finished 12-step run the doctor finds clean, or whose loss turns NaN at ``nan_from``
    (P4, an error-level finding)."""
    steps = []
    for s in range(12):
        ev = step_event(s)
        ev["grads"].update(none=[], norm=[0.5, 0.5])  # every parameter gets its gradient, a steady one
        if nan_from is not None and s >= nan_from:
            ev["loss"] = math.nan
        steps.append(ev)
    end = {"kind": "end", "t": 2000.0, "status": "finished", "steps": 12}
    return write_file(path, [encode_frame(0, [session_event(sid)]), encode_frame(1, steps), encode_frame(2, [end])])


def _gzipped(src: Path, dst: Path) -> Path:
    dst.write_bytes(gzip.compress(src.read_bytes()))
    return dst


def _ids(srv: ServerProc) -> set[str]:
    return {str(s["id"]) for s in srv.get("/api/sessions")}  # type: ignore[union-attr, index]


# ---------------------------------------------------------------------- open: several files
def test_open_of_several_files_imports_the_good_ones_and_says_each_bad_one(tmp_path: Path) -> None:
    a = write_file(tmp_path / "a.tscope", run_frames("qa51b-a", steps=3))
    c = write_file(tmp_path / "c.tscope", run_frames("qa51b-c", steps=4))
    gz = _gzipped(a, tmp_path / "gz_as.tscope")  # gzip bytes under a .tscope name, as mailed
    missing = tmp_path / "missing.tscope"
    with ServerProc(tmp_path / "data") as srv:
        res = cli("open", str(a), str(gz), str(missing), str(c), "--port", str(srv.port), "--no-browser")
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stdout.split() == [f"{srv.url}/sessions/qa51b-a", f"{srv.url}/sessions/qa51b-c"]
        assert _ids(srv) == {"qa51b-a", "qa51b-c"}
        lines = res.stderr.strip().splitlines()
        assert f"torchscope open: {gz} {GZIP_SAID} (gzip -dc {gz} > run.tscope)" in lines, lines
        assert f"torchscope open: {missing}: no such file" in lines, lines
        assert lines[-1] == "torchscope open: 2 of 4 files imported; 2 refused (said above)", lines
        # two runs imported: side by side, as with two good files
        assert f"both runs side by side: {srv.url}/compare?a=qa51b-a&b=qa51b-c" in res.stderr


def test_open_goes_on_after_a_file_the_server_refuses(tmp_path: Path) -> None:
    """A file whose damage only the server sees (a record that is not JSON, its checksum right)
    is refused by the server: said, and the files after it imported."""
    frames = run_frames("qa51b-bad", steps=3)
    bad = write_file(tmp_path / "bad.tscope", [frames[0], frame_of_line(1, b"not json"), *frames[2:]])
    good = write_file(tmp_path / "good.tscope", run_frames("qa51b-good", steps=2))
    with ServerProc(tmp_path / "data") as srv:
        res = cli("open", str(bad), str(good), "--port", str(srv.port), "--no-browser")
        assert res.returncode == 2, res.stderr
        assert res.stdout.split() == [f"{srv.url}/sessions/qa51b-good"]
        assert "torchscope open: bad.tscope is corrupt at byte" in res.stderr, res.stderr
        assert res.stderr.strip().splitlines()[-1] == "torchscope open: 1 of 2 files imported; 1 refused (said above)"
        assert _ids(srv) == {"qa51b-good"}


def test_open_of_only_bad_files_says_each_and_starts_no_server(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tscope"
    empty.write_bytes(b"")
    gz = _gzipped(write_file(tmp_path / "a.tscope", run_frames("x", steps=2)), tmp_path / "a.tscope.gz")
    port = free_port()
    res = cli("open", str(empty), str(gz), "--port", str(port), "--no-browser", "--data", str(tmp_path / "d"))
    assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        f"torchscope open: {empty} is empty, not a torchscope session file",
        f"torchscope open: {gz} {GZIP_SAID} (gzip -dc {gz} > run.tscope)",
        "torchscope open: none of the 2 files was imported (each is said above)"]
    assert not (tmp_path / "d").exists()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


# ---------------------------------------------------------------------- gzip'd files
def test_a_gzipped_file_is_said_to_be_one(tmp_path: Path) -> None:
    """`info`, `doctor` and `open` of one file (one line, exit 2) and the import route (the
    dashboard's words come from it)."""
    gz = _gzipped(write_file(tmp_path / "run.tscope", run_frames("qa51b-gz", steps=2)), tmp_path / "run.tscope.gz")
    for command in ("info", "doctor", "open"):
        extra = ["--no-browser", "--port", "1"] if command == "open" else []
        line = one_line_error(cli(command, str(gz), *extra))
        assert line == f"torchscope {command}: {gz} {GZIP_SAID} (gzip -dc {gz} > run.tscope)", line
    with ServerProc(tmp_path / "data") as srv:
        boundary = "qa51bboundary"
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"mailed.tscope\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode() + gz.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
        req = urllib.request.Request(srv.url + "/api/sessions/import", data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError("a gzip'd file was imported")
        except urllib.error.HTTPError as exc:
            assert exc.code == 400
            detail = json.loads(exc.read())["detail"]
        # the upload's own name, never the server's temporary path
        assert detail == f"mailed.tscope {GZIP_SAID} (gzip -dc mailed.tscope > run.tscope)", detail
        assert _ids(srv) == set()


# ---------------------------------------------------------------------- doctor: several files
def test_doctor_of_several_files(tmp_path: Path) -> None:
    nan = _run(tmp_path / "nan.tscope", "qa51b-nan", nan_from=5)
    clean = _run(tmp_path / "clean.tscope", "qa51b-clean")
    gz = _gzipped(clean, tmp_path / "clean.tscope.gz")
    one = cli("doctor", str(nan))  # one file: as ever, no header
    assert one.returncode == 1 and one.stdout.startswith(f"{nan}: ") and "==>" not in one.stdout
    # an error-level finding and a clean run: exit 1, each under its header
    res = cli("doctor", str(nan), str(clean))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stdout.startswith(f"==> {nan} <==\n{one.stdout}\n==> {clean} <==\n{clean}: no problems found"), res.stdout
    assert "torchscope doctor: 2 files: 1 with an error-level finding, 0 unreadable" in res.stderr
    # an unreadable file among them: exit 2, said in its turn, the others diagnosed all the same
    res = cli("doctor", str(clean), str(gz), str(nan))
    assert res.returncode == 2, res.stderr
    assert f"==> {gz} <==" in res.stdout and f"==> {nan} <==\n{nan}: " in res.stdout
    assert f"torchscope doctor: {gz} {GZIP_SAID}" in res.stderr
    assert "torchscope doctor: 3 files: 1 with an error-level finding, 1 unreadable" in res.stderr
    assert cli("doctor", str(clean), str(clean)).returncode == 0
    # --json: one list, each file's findings (an unreadable one's error)
    res = cli("doctor", str(nan), str(gz), str(clean), "--json")
    assert res.returncode == 2
    listed = json.loads(res.stdout)
    assert [x["file"] for x in listed] == [str(nan), str(gz), str(clean)]
    assert any(f["code"] == "P4" and f["severity"] == "error" for f in listed[0]["findings"])
    assert GZIP_SAID in listed[1]["error"] and "findings" not in listed[1]
    assert listed[2]["findings"] == []
    alone = json.loads(cli("doctor", str(nan), "--json").stdout)  # one file: the findings alone, as ever
    assert isinstance(alone, list) and alone == listed[0]["findings"]
    # a bad --set is said once, not once per file
    res = cli("doctor", str(nan), str(clean), "--set", "nokey=3")
    assert one_line_error(res).startswith("torchscope doctor: ") and res.returncode == 2


# ---------------------------------------------------------------------- open --no-follow of a live run
LIVE_RUN = '''
import sys, time
import torch
import torchscope
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = torchscope.watch(model, opt, server=sys.argv[2], record=sys.argv[1])
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
w.flush()
print("stepped", flush=True)
time.sleep(120)  # the run goes on (no end event), its file and the server's copy stay as they are
'''


def test_open_no_follow_of_a_live_run_the_server_has_says_one_thing(tmp_path: Path) -> None:
    """A run streaming to the server and recording its file: `open --no-follow` of the file
    imports nothing new.  It said "imported as it is now; open it again for the rest" and
    "already on this server (the same run): nothing new imported" both."""
    script, path = tmp_path / "live.py", tmp_path / "live.tscope"
    script.write_text(LIVE_RUN)
    with ServerProc(tmp_path / "data") as srv:
        train = subprocess.Popen([sys.executable, str(script), str(path), srv.url], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert train.stdout is not None and train.stdout.readline().strip() == "stepped"

            def server_has_the_file() -> bool:
                rows = srv.get("/api/sessions")
                if not rows:
                    return False
                ranks = srv.get(f"/api/sessions/{rows[0]['id']}")["rank_info"]  # type: ignore[index, call-overload]
                return bool(ranks[0]["frames"] >= len(index(path)[1]))

            assert wait_for(server_has_the_file, timeout=30)
            res = cli("open", str(path), "--port", str(srv.port), "--no-browser", "--no-follow")
            assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
            assert res.stderr.strip().splitlines() == [
                f"torchscope open: {path} is already on this server (the same run): nothing new imported"], res.stderr
            assert train.poll() is None  # (the run was going on throughout)
        finally:
            os.killpg(train.pid, signal.SIGKILL)
            train.communicate()


# ---------------------------------------------------------------------- serve: the token kept, the data dir private
@contextlib.contextmanager
def _serve(data: Path, *extra: str, env: dict[str, str], lines: int = 3) -> Iterator[tuple[int, list[str]]]:
    """`torchscope serve --host 0.0.0.0` on a free port: its port and the first ``lines`` lines
    it printed; stopped after."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "torchscope.server.cli", "serve", "--host", "0.0.0.0",
                             "--port", str(port), "--data", str(data), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        out = proc.stdout
        said: list[str] = []
        # read in a thread, so a server that prints fewer lines fails the test instead of hanging it
        reader = threading.Thread(target=lambda: said.extend(out.readline().rstrip("\n") for _ in range(lines)),
                                  daemon=True)
        reader.start()
        reader.join(60)
        assert len(said) == lines, f"serve printed only {said}"
        assert wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1).status == 200)
        yield port, said
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _token(line: str) -> str:
    found = re.search(r"\?token=([A-Za-z0-9_-]+)", line)
    assert found, line
    return found.group(1)


def test_an_exposed_server_keeps_its_generated_token_across_restarts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCHSCOPE_TOKEN"}
    data = tmp_path / "new" / "data"
    with _serve(data, env=env) as (port, lines):
        token = _token(lines[0])
        assert lines[0].startswith(f"torchscope dashboard: http://127.0.0.1:{port}/?token={token}")
        # the address other machines use, beside this machine's own
        there = re.fullmatch(rf"  from other machines: http://([^/]+):{port}/\?token={token}  \(bound to 0\.0\.0\.0: "
                             r"reachable from other machines\)", lines[1])
        assert there and there.group(1) not in ("127.0.0.1", "0.0.0.0", "localhost"), lines[1]
        assert lines[2].startswith(f"  token: a new one, kept in {data / 'token'} (the owner's alone) and used again"), lines[2]
        # what the server made is its owner's alone: the directory, the token, the store
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        assert stat.S_IMODE((data / "token").stat().st_mode) == 0o600
        assert (data / "token").read_text().strip() == token
        assert wait_for(lambda: (data / "torchscope.db").exists())
        for f in data.glob("torchscope.db*"):
            assert stat.S_IMODE(f.stat().st_mode) & 0o007 == 0, (f, oct(f.stat().st_mode))
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/sessions", headers={"Authorization": f"Bearer {token}"})
        assert urllib.request.urlopen(req, timeout=10).status == 200
    with _serve(data, env=env) as (port, lines):  # restarted: the same token, said to be the kept one
        assert _token(lines[0]) == token
        assert lines[2].startswith(f"  token: kept in {data / 'token'}"), lines[2]
    # a token given wins, and the kept one is left as it is
    with _serve(data, "--token", "given-token", env=env, lines=2) as (port, lines):
        assert _token(lines[0]) == "given-token" and "token:" not in lines[1], lines
    with _serve(data, env={**env, "TORCHSCOPE_TOKEN": "env-token"}, lines=2) as (port, lines):
        assert _token(lines[0]) == "env-token" and not any(x.startswith("  token:") for x in lines), lines
    assert (data / "token").read_text().strip() == token


def test_an_unusable_token_file_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCHSCOPE_TOKEN"}
    data = tmp_path / "data"
    data.mkdir()
    (data / "token").write_text("\n")
    res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "serve", "--host", "0.0.0.0", "--port",
                          str(free_port()), "--data", str(data)], capture_output=True, text=True, timeout=60, env=env)
    assert one_line_error(res) == (f"torchscope serve: the token file {data / 'token'} holds no usable token: delete "
                                   "it (a new one is made) or write one printable word in it")
    assert res.returncode == 2


def test_open_of_a_sweeps_files_gives_the_compare_page_of_all(tmp_path: Path) -> None:
    """`torchscope open sweep/*.tscope` of three to eight runs: all of them side by side, as two
    were (the Compare page takes up to eight since QA 51c)."""
    files = [write_file(tmp_path / f"s{k}.tscope", run_frames(f"sweep-{k}", steps=3)) for k in range(3)]
    with ServerProc(tmp_path / "data") as srv:
        res = cli("open", *map(str, files), "--port", str(srv.port), "--no-browser")
        assert res.returncode == 0, res.stderr
        line = next(x for x in res.stderr.splitlines() if "side by side" in x)
        assert line == f"torchscope open: all 3 runs side by side: {srv.url}/compare?runs=sweep-0%2Csweep-1%2Csweep-2", line
        with urllib.request.urlopen(line.split(": ", 2)[2], timeout=30) as page:
            assert 'data-runs="sweep-0,sweep-1,sweep-2"' in page.read().decode()
