"""The server's token as watch() uses it: read as the server reads its own (stripped, so a
token from a file's line works), URL-encoded in the printed URL, and one that no request can
carry said in one line with the run recorded to its file."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ServerProc, wait_for

import torchscope
from torchscope.sessionfile import iter_events


def _sessions(srv: ServerProc, token: str) -> list[dict[str, Any]]:
    req = urllib.request.Request(srv.url + "/api/sessions", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        out: list[dict[str, Any]] = json.loads(r.read())
    return out


def _run(path: Path, server: str, token: str) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchscope.watch(model, opt, server=server, record=path, token=token) as w:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    return w


def test_a_token_with_its_files_newline_reaches_the_server(tmp_path: Path) -> None:
    token = "a+b/c=d"
    with ServerProc(tmp_path / "data", extra=["--token", token]) as srv:
        w = _run(tmp_path / "run.tscope", srv.url, token + "\n")
        assert w.url == f"{srv.url}/sessions/{w.session_id}?token=a%2Bb%2Fc%3Dd"
        assert wait_for(lambda: any(s["id"] == w.session_id and s.get("steps") == 3 for s in _sessions(srv, token)))


def test_a_token_with_a_newline_inside_is_said_and_the_run_recorded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ServerProc(tmp_path / "data", extra=["--token", "good"]) as srv:
        path = tmp_path / "run.tscope"
        _run(path, srv.url, "go\nod")
        err = capsys.readouterr().err
        said = [ln for ln in err.splitlines() if "control character" in ln]
        assert said == [f"torchscope: the token holds a control character (a newline?), which no browser or HTTP "
                        f"client can send: not sending to {srv.url}, recording to {path} only"], err
        assert "not reachable" not in err and "?token=go" not in err
        assert _sessions(srv, "good") == []  # nothing was sent
    assert sum(e["kind"] == "step" for e in iter_events(path)) == 3


def test_a_wrong_token_is_said_as_a_refusal_to_the_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The server answers a wrong token with 401: the run's last line said it "never answered",
    after the line saying it refused the token."""
    with ServerProc(tmp_path / "data", extra=["--token", "good"]) as srv:
        path = tmp_path / "run.tscope"
        _run(path, srv.url, "bad")
        err = capsys.readouterr().err
    assert "refused TORCHSCOPE_TOKEN" in err and "never answered" not in err, err
    assert (f"torchscope: the server {srv.url} refused this run; the file is complete: with TORCHSCOPE_TOKEN set to "
            f"its token, torchscope open {path} --port {srv.port} shows the whole run there") in err, err
    assert sum(e["kind"] == "step" for e in iter_events(path)) == 3
