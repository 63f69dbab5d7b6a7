"""QA 53b: file names that are not UTF-8, and session ids that are no names.

- `torchscope open FILE`, FILE's name holding a byte that is not UTF-8 (a Latin-1 name from an
  old disk), died of a UnicodeEncodeError traceback building the upload; `doctor --json` of such
  a file died in the JSON encoder (exit 1, which CI reads as an error-level finding, not the 2 of
  unreadable input); `info`, `doctor` and `serve` died printing such a name (or a data directory's
  path) where stdout is strict (a UTF-8 locale's); a server whose data directory's path has such
  a byte failed every import (500); `serve --host` with one: a TypeError traceback;
- the ingest took the session ids ``.`` and ``..`` (a session the dashboard can neither open nor
  delete: browsers resolve the path step away), and a session event naming another session than
  the URL (stored under the URL's id, its export said the other one).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProc
from server_helpers import run_frames, write_file
from test_server_cli import _bare_env, cli, one_line_error
from test_server_qa52 import _upload


def _strict(**extra: str) -> dict[str, str]:
    """The environment of a UTF-8 locale's terminal: stdout refuses what is not UTF-8 (this
    sandbox's C.UTF-8 locale would write the name's own bytes, hiding the bug)."""
    return _bare_env(PYTHONIOENCODING="utf-8:strict", **extra)


def _latin1(directory: Path, name: bytes, data: bytes) -> Path:
    path = directory / os.fsdecode(name)
    path.write_bytes(data)
    return path


def _escaped(path: Path | str) -> str:
    """How the CLI names a path with such a byte: ``\\udcff``, as Python writes it on stderr."""
    return str(path).encode("utf-8", "backslashreplace").decode()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    good = write_file(tmp_path / "good.tscope", run_frames("qa53b-good0001", steps=3))
    plain = write_file(tmp_path / "plain.tscope", run_frames("qa53b-latin001", steps=4))
    return {"good": good, "plain": plain,  # (the same file as latin1, named in ASCII)
            "latin1": _latin1(tmp_path, b"caf\xe9-run\xff.tscope", plain.read_bytes()),
            "bad": _latin1(tmp_path, b"bad\xfe.tscope", b"xx")}


# ------------------------------------------------------------------ open
def test_open_imports_a_file_whose_name_is_not_utf8(tmp_path: Path, files: dict[str, Path]) -> None:
    with ServerProc(tmp_path / "data") as srv:
        res = cli("open", "--server", srv.url, "--no-browser", "--no-follow", str(files["latin1"]), env=_strict())
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        assert res.stdout.strip() == f"{srv.url}/sessions/qa53b-latin001"
        assert srv.get("/api/sessions/qa53b-latin001")["steps"] == 4  # type: ignore[index]
        # several files, one of them unreadable too: the others imported, each bad one said in its line
        res = cli("open", "--server", srv.url, "--no-browser", "--no-follow", str(files["good"]), str(files["bad"]),
                  str(files["latin1"]), env=_strict())
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stdout.split() == [f"{srv.url}/sessions/qa53b-good0001", f"{srv.url}/sessions/qa53b-latin001"]
        assert f"torchscope open: {_escaped(files['bad'])} is not a torchscope session file" in res.stderr
        assert "2 of 3 files imported; 1 refused" in res.stderr


def test_the_upload_names_such_a_file_in_utf8() -> None:
    from torchscope.server.client import form_name
    from torchscope.server.upload import safe_name

    assert form_name(os.fsdecode(b"caf\xe9.tscope")) == "caf?.tscope"
    assert form_name('a"b\r\n.tscope') == "a%22b%0D%0A.tscope"  # (as browsers send them)
    assert form_name("café.tscope") == "café.tscope"
    assert safe_name(form_name(os.fsdecode(b"caf\xe9.tscope"))) == safe_name(os.fsdecode(b"caf\xe9.tscope"))


# ------------------------------------------------------------------ doctor --json
def _json(res: Any) -> Any:
    assert "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


def test_doctor_json_names_a_non_utf8_file_in_valid_json(files: dict[str, Path]) -> None:
    good, latin1, bad, plain = str(files["good"]), str(files["latin1"]), str(files["bad"]), str(files["plain"])
    ascii_named = cli("doctor", "--json", good, plain, env=_strict())  # (these synthetic runs have findings)
    res = cli("doctor", "--json", good, latin1, env=_strict())
    assert res.returncode == ascii_named.returncode in (0, 1)
    assert _json(res) == [{**x, "file": _escaped(latin1) if x["file"] == plain else x["file"]}
                          for x in _json(ascii_named)]
    res = cli("doctor", "--json", latin1, env=_strict())  # one readable file: its findings alone
    assert res.returncode == ascii_named.returncode and _json(res) == _json(ascii_named)[1]["findings"]
    # unreadable: exit 2 (bad input), as for any unreadable file -- not 1, an error-level finding
    res = cli("doctor", "--json", bad, env=_strict())
    assert res.returncode == 2
    out = _json(res)
    assert out["file"] == _escaped(bad) and out["error"].startswith(f"{_escaped(bad)} is not a torchscope session")
    res = cli("doctor", "--json", good, bad, latin1, env=_strict())
    assert res.returncode == 2
    assert [(x["file"], "error" in x) for x in _json(res)] == [(good, False), (_escaped(bad), True),
                                                                (_escaped(latin1), False)]


# ------------------------------------------------------------------ text outputs
@pytest.mark.parametrize(("command", "which"), [
    ("info", ("latin1",)), ("info", ("good", "latin1")), ("info", ("good", "bad", "latin1")),
    ("doctor", ("latin1",)), ("doctor", ("good", "latin1", "bad"))])
def test_text_outputs_name_a_non_utf8_file_escaped(files: dict[str, Path], command: str,
                                                   which: tuple[str, ...]) -> None:
    """As for the same files named in ASCII, the name escaped (was: a UnicodeEncodeError traceback)."""
    res = cli(command, *(str(files[w]) for w in which), env=_strict())
    ascii_named = cli(command, *(str(files["plain" if w == "latin1" else w]) for w in which), env=_strict())
    assert res.returncode == ascii_named.returncode and "Traceback" not in res.stderr, res.stderr
    assert res.stdout == ascii_named.stdout.replace(str(files["plain"]), _escaped(files["latin1"]))
    assert _escaped(files["latin1"]) in res.stdout or (command, which) == ("info", ("latin1",))


def test_a_data_directory_whose_path_is_not_utf8_serves_and_imports(tmp_path: Path, files: dict[str, Path]) -> None:
    data = tmp_path / os.fsdecode(b"d\xe9ta")
    with ServerProc(data) as srv:
        res = cli("open", "--server", srv.url, "--no-browser", "--no-follow", str(files["good"]), env=_strict())
        assert res.returncode == 0, res.stderr  # was: "the server refused good.tscope: Internal Server Error"
        assert srv.get("/api/sessions/qa53b-good0001")["steps"] == 3  # type: ignore[index]


def test_serve_refuses_a_host_that_is_not_utf8_in_one_line(tmp_path: Path) -> None:
    host = os.fsdecode(b"h\xff")  # (was: TypeError: encoding of hostname failed, a traceback)
    res = cli("serve", "--port", "1", "--data", str(tmp_path / "data"), "--host", host, env=_strict())
    assert one_line_error(res) == f"torchscope serve: cannot bind {host!r}:1 (not a host name or address)"
    assert res.returncode == 2


# ------------------------------------------------------------------ session ids
def _post(srv: ServerProc, path: str, body: bytes | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(srv.url + path, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_ingest_refuses_session_ids_of_dots_alone(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv:
        for sid in ("..", ".", "...", "%2e%2e", ".%2E"):
            for path, body in ((f"/api/ingest/{sid}/0", b"".join(run_frames(sid.replace("%2e", ".").replace(
                    "%2E", "."), steps=2))), (f"/api/ingest/{sid}/0/next", None)):
                code, out = _post(srv, path, body)
                assert code == 422, (path, out)
                assert "a session id cannot be dots alone" in out["detail"][0]["msg"], out
        for path in ("/api/sessions/%2e%2e", "/api/sessions/%2e%2e/export", "/compare?a=..&b=x"):
            code, out = _post(srv, path)
            assert code == 422 and "dots alone" in out["detail"][0]["msg"], (path, out)
        # what the capture sends: its 16 hex digits on every rank, and ids of other clients
        for sid, rank in (("0123456789abcdef", 0), ("0123456789abcdef", 1), (".hidden-run", 0), ("a..b", 0),
                          ("host:run@2+1=x_y-z", 0)):
            code, out = _post(srv, f"/api/ingest/{sid}/{rank}", b"".join(run_frames(sid, steps=2, rank=rank)))
            assert (code, out) == (200, {"next_seq": 3}), (sid, out)
            assert srv.get(f"/api/sessions/{sid}")["steps"] == 2  # type: ignore[index]
        # a file whose session event says "..": imported under an id of its own, as a file without one
        res = _upload(srv, "dots.tscope", write_file(tmp_path / "dots.tscope", run_frames("..", steps=2)).read_bytes())
        assert res["id"].startswith("import-") and res["frames"] == 3


def test_the_ingest_refuses_a_session_event_of_another_session(tmp_path: Path) -> None:
    """Stored under the URL's id, its export said the other one: imported again, it landed there."""
    with ServerProc(tmp_path / "data") as srv:
        code, out = _post(srv, "/api/ingest/qa53b-url0001/0", b"".join(run_frames("qa53b-body001", steps=2)))
        assert (code, out) == (400, {"detail": "frame 0: its session event is of session 'qa53b-body001', not "
                                               "'qa53b-url0001' (the URL's)"})
        assert srv.get("/api/sessions") == []
        # the same run under its own id: taken
        code, out = _post(srv, "/api/ingest/qa53b-body001/0", b"".join(run_frames("qa53b-body001", steps=2)))
        assert (code, out) == (200, {"next_seq": 3})
