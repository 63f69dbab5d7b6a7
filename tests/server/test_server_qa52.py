"""Fifty-second session: two of the fifty-first session's "found and not fixed".

- Two `torchscope serve` on one data directory both started (and both wrote one SQLite store):
  the second now refuses in one line naming the first's URL; a killed server's lock goes with
  it; `torchscope open` at another port on that directory uses the server that holds it.
- A rename or tags given on the server did not travel with the downloaded file: the download
  now ends with a labels record (``schema.LogEvent.labels``) that the import and `info` read,
  never stacked (downloaded, imported elsewhere, renamed and downloaded again: one record).
- The Compare page's refresh asks ``/memory`` and ``/metrics`` from a step on (``start``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from conftest import ServerProc, free_port
from server_helpers import run_frames, write_file
from test_server_cli import _bare_env, cli, one_line_error

import torchscope
from torchscope.sessionfile import index, iter_events


def _serve(data: Path, port: int) -> subprocess.CompletedProcess[str]:
    return cli("serve", "--port", str(port), "--data", str(data), "--quiet", timeout=60)


def test_a_second_server_on_one_data_directory_does_not_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = ServerProc(data).start()
    try:
        res = _serve(data, free_port())
        line = one_line_error(res)
        assert res.returncode == 2
        assert line == (f"torchscope serve: a torchscope server at {srv.url} (pid {srv.proc.pid}) already uses "  # type: ignore[union-attr]
                        f"the data directory {data}: open that one, or give this one another --data"), line
        assert srv.get("/api/health")["ok"] is True  # type: ignore[index]
        # the same port too: the data directory is said first (the port would only say "in use")
        assert "already uses the data directory" in one_line_error(_serve(data, srv.port))
    finally:
        srv.stop(signal.SIGKILL)  # killed: its lock goes with it, nothing to clean up
    again = ServerProc(data).start()  # a new server on that directory starts
    try:
        assert again.get("/api/health")["ok"] is True  # type: ignore[index]
    finally:
        again.stop()


def test_open_at_another_port_uses_the_server_of_its_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = write_file(tmp_path / "run.tscope", run_frames("qa52-open", steps=3))
    with ServerProc(data) as srv:
        res = cli("open", str(path), "--port", str(free_port()), "--data", str(data), "--no-browser")
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"{srv.url}/sessions/qa52-open"
        assert f"uses the data directory {data} (one server per data directory): using that one" in res.stderr
        assert "Traceback" not in res.stderr and "not in --data" not in res.stderr
        assert srv.get("/api/sessions/qa52-open")["steps"] == 3  # type: ignore[index]


def _upload(srv: ServerProc, name: str, data: bytes) -> dict[str, Any]:
    boundary = "qa52boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(srv.url + "/api/sessions/import", data=body, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return dict(json.loads(resp.read()))


def _patch(srv: ServerProc, sid: str, **fields: Any) -> None:
    req = urllib.request.Request(f"{srv.url}/api/sessions/{sid}", data=json.dumps(fields).encode(), method="PATCH",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def _export(srv: ServerProc, sid: str) -> bytes:
    with urllib.request.urlopen(f"{srv.url}/api/sessions/{sid}/export", timeout=30) as resp:
        return bytes(resp.read())


def _labels(path: Path) -> list[dict[str, Any]]:
    return [ev["labels"] for ev in iter_events(path) if ev.get("kind") == "log" and "labels" in ev]


def test_a_rename_and_tags_travel_with_the_downloaded_file(tmp_path: Path) -> None:
    original = write_file(tmp_path / "run.tscope", run_frames("qa52-labels", steps=6))
    sid = "qa52-labels"
    with ServerProc(tmp_path / "mine") as mine, ServerProc(tmp_path / "colleague") as colleague:
        _upload(mine, "run.tscope", original.read_bytes())
        assert _export(mine, sid) == original.read_bytes()  # nothing given: the file, byte for byte
        _patch(mine, sid, name="baseline lr=1e-3", tags=["baseline", "lr"])
        sent = tmp_path / "sent.tscope"
        sent.write_bytes(_export(mine, sid))
        assert _labels(sent) == [{"name": "baseline lr=1e-3", "tags": ["baseline", "lr"]}]
        # the colleague's server (a fresh data directory) shows the name and tags given
        got = _upload(colleague, "sent.tscope", sent.read_bytes())
        assert got["id"] == sid and got["new_frames"] == got["frames"]
        s = colleague.get(f"/api/sessions/{sid}")
        assert s["name"] == "baseline lr=1e-3" and s["tags"] == ["baseline", "lr"], s  # type: ignore[index]
        # the labels are no frame of the run: the colleague's store holds the run's own frames
        assert s["rank_info"][0]["frames"] == mine.get(f"/api/sessions/{sid}")["rank_info"][0]["frames"]  # type: ignore[index]
        # renamed there and downloaded again: one labels record, the last name -- not a stack
        _patch(colleague, sid, name="baseline, rerun")
        back = tmp_path / "back.tscope"
        back.write_bytes(_export(colleague, sid))
        assert _labels(back) == [{"name": "baseline, rerun", "tags": ["baseline", "lr"]}]
        # imported back where it came from: the same run (nothing new), the last name wins
        again = _upload(mine, "back.tscope", back.read_bytes())
        assert again["new_frames"] == 0
        assert mine.get(f"/api/sessions/{sid}")["name"] == "baseline, rerun"  # type: ignore[index]
    # `torchscope info` reads the downloaded file, and says the name and tags it carries
    res = subprocess.run([sys.executable, "-m", "torchscope.server.cli", "info", str(sent)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = dict(line.split(":", 1) for line in res.stdout.splitlines())
    assert lines["name"].strip() == "baseline lr=1e-3 (recorded as run)", res.stdout
    assert lines["tags"].strip() == "baseline, lr" and lines["status"].strip() == "finished", res.stdout
    assert lines["steps"].strip() == "6"
    # and the notebook reader: the name and tags given, the recorded one in its session record
    got = torchscope.load(sent)
    assert (got.name, got.tags, got.meta["name"]) == ("baseline lr=1e-3", ["baseline", "lr"], "run")
    plain = torchscope.load(original)
    assert (plain.name, plain.tags) == ("run", [])


def test_memory_and_metrics_from_a_step_on(tmp_path: Path) -> None:
    path = write_file(tmp_path / "run.tscope", run_frames("qa52-start", steps=12))
    with ServerProc(tmp_path / "data") as srv:
        _upload(srv, "run.tscope", path.read_bytes())
        whole = srv.get("/api/sessions/qa52-start/memory")
        part = srv.get("/api/sessions/qa52-start/memory?start=7")
        assert isinstance(whole, dict) and isinstance(part, dict)
        assert part["step"] == list(range(7, 12))
        assert part == {k: v[7:] for k, v in whole.items()}, (part, whole)
        assert srv.get("/api/sessions/qa52-start/metrics?start=7") == {}


def test_watch_says_when_the_server_it_started_exits(tmp_path: Path) -> None:
    """``watch()`` started a server on a free port whose data directory another server holds: that
    one exits at once (one server per data directory), and the run said "started a torchscope
    server ..." and then nothing (the grace for a booting server silenced it).  Now it says the
    server it started exited, and how to see why; training and the file are unharmed."""
    data = tmp_path / "data"
    code = ("import torch, torchscope, time; m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), 0.1)\n"
            f"w = torchscope.watch(m, o, record={str(tmp_path / 'w.tscope')!r})\n"
            "for _ in range(40):\n"
            "    o.zero_grad(); m(torch.randn(4, 2)).sum().backward(); o.step(); time.sleep(0.25)\n"
            "w.close()\n")
    port = free_port()
    with ServerProc(data):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path, env=_bare_env(TORCHSCOPE_SERVER=f"http://127.0.0.1:{port}",
                                                         TORCHSCOPE_DATA=str(data)))
    assert run.returncode == 0, run.stderr
    assert f"started a torchscope server at http://127.0.0.1:{port}" in run.stderr
    assert (f"torchscope: server http://127.0.0.1:{port} not reachable: the server started for it exited "
            f"(status 2; `torchscope serve --port {port}` says why); training continues") in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert "status:          finished" in cli("info", str(tmp_path / "w.tscope")).stdout


def test_a_files_labels_are_taken_as_a_patch_takes_them(tmp_path: Path) -> None:
    """A labels frame past a PATCH's limits (QA 52c: a 100,000-character name and 5,000 tags were
    stored) is cut to them; `open` of a file already there that changed only its name and tags
    said "nothing new imported" and no more."""
    from torchscope.server import labels

    original = write_file(tmp_path / "run.tscope", run_frames("qa52-limits", steps=4))
    seq = len(index(original)[1])  # numbered on from the file's frames, as a download's
    big = tmp_path / "big.tscope"
    big.write_bytes(original.read_bytes() + labels.labels_frame(seq, "N" * 100_000, [f"t{i}" for i in range(60)]))
    with ServerProc(tmp_path / "data") as srv:
        got = _upload(srv, "run.tscope", original.read_bytes())
        assert got["new_frames"] == got["frames"]
        res = cli("open", str(big), "--server", srv.url, "--no-browser")
        assert res.returncode == 0, res.stderr
        assert ("is already on this server (the same run): nothing new imported; its name and tags from the file "
                "were given to it") in res.stderr, res.stderr
        s = srv.get("/api/sessions/qa52-limits")
        assert s["name"] == "N" * 200 and s["tags"] == [f"t{i}" for i in range(50)], (len(s["name"]), len(s["tags"]))  # type: ignore[index]
        res = cli("open", str(original), "--server", srv.url, "--no-browser")
        assert res.stderr.strip().endswith("nothing new imported"), res.stderr
