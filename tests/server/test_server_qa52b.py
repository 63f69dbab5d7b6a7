"""QA 52a's server findings, as a user meets them: a real `torchscope serve` on a real port, real
`torchscope` subprocesses, real files.

- `open` of nine or more files printed their URLs and no word that Compare takes at most eight
  (`MAX_COMPARE`); its `--help` said "two open side by side";
- a PATCH of tags `["a", ""]` stored an empty tag, where a blank name is refused;
- the Compare page's left-out runs (past eight) were named by their ids, and `?runs=X,X` compared
  a run with itself without a word;
- an ill-formed id in a Compare (or session) page's address showed the API's 422 JSON, its regex,
  to a browser, where an unknown id gets a sentence."""

from __future__ import annotations

import html
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from conftest import ServerProc
from server_helpers import run_frames, session_event, step_event, write_file
from test_server_cli import cli
from test_server_qa32 import finished_file, one_line, request, upload

from torchscope.server.config import MAX_COMPARE
from torchscope.server.labels import labels_frame
from torchscope.sessionfile import encode_frame

JSON = {"Content-Type": "application/json"}
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def _page(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(status, content type, body text) of a GET, an error status included."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read().decode()


def _data(page: str, name: str) -> str:
    found = re.search(rf'data-{name}="([^"]*)"', page)
    assert found, page[:2000]
    return html.unescape(found.group(1))


# ------------------------------------------------------------------ F5, F7: open of 9+ files


def test_open_of_more_runs_than_compare_takes_says_so_in_one_line(tmp_path: Path) -> None:
    n = MAX_COMPARE + 1
    files = [write_file(tmp_path / f"s{k}.tscope", run_frames(f"big-{k}", steps=3)) for k in range(n)]
    with ServerProc(tmp_path / "data") as srv:
        res = cli("open", *map(str, files), "--port", str(srv.port), "--no-browser")
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == [f"{srv.url}/sessions/big-{k}" for k in range(n)]
        said = [line for line in res.stderr.splitlines() if "Compare" in line]
        assert said == [f"torchscope open: {n} runs: Compare shows at most {MAX_COMPARE} side by side; tick the ones "
                        f"to compare on the sessions page: {srv.url}/"], res.stderr
        # eight are still the Compare page of all of them, without that line
        res = cli("open", *map(str, files[:MAX_COMPARE]), "--port", str(srv.port), "--no-browser")
        assert res.returncode == 0, res.stderr
        assert f"all {MAX_COMPARE} runs side by side: {srv.url}/compare?runs=" in res.stderr
        assert "at most" not in res.stderr


def test_open_help_says_two_to_eight_open_side_by_side() -> None:
    res = cli("open", "--help")
    assert res.returncode == 0
    text = " ".join(res.stdout.split())  # (argparse wraps the help)
    assert f"several: each imported; 2 to {MAX_COMPARE} runs open side by side on the Compare page" in text, text
    assert "two open side by side" not in text


# ------------------------------------------------------------------ F9: blank tags


def test_a_blank_tag_is_refused_as_a_blank_name_is(server: ServerProc, tmp_path: Path) -> None:
    assert upload(server, finished_file(tmp_path / "t.tscope", "tagged", steps=3))[0] == 200
    url = server.url + "/api/sessions/tagged"
    status, res = request(url, "PATCH", json.dumps({"tags": ["kept"]}).encode(), JSON)
    assert status == 200 and res["tags"] == ["kept"]
    for tags in (["a", ""], ["a", "   "], ["\u200b"], [" \u00a0\t"]):
        status, res = request(url, "PATCH", json.dumps({"tags": tags}).encode(), JSON)
        assert status == 422 and one_line(res["detail"]) == "tags: a tag needs a character that is not a space", tags
    status, res = request(url, "PATCH", json.dumps({"name": "  "}).encode(), JSON)  # (as the name)
    assert status == 422 and res["detail"] == "name: a name needs a character that is not a space"
    assert server.get("/api/sessions/tagged")["tags"] == ["kept"]  # type: ignore[index]
    # stripped, as a name is
    status, res = request(url, "PATCH", json.dumps({"tags": ["  lr=1e-3 ", "best"]}).encode(), JSON)
    assert status == 200 and res["tags"] == ["lr=1e-3", "best"]
    status, res = request(url, "PATCH", json.dumps({"tags": []}).encode(), JSON)  # no tags: still fine
    assert status == 200 and res["tags"] == []


def test_a_files_blank_tag_is_left_out_at_its_import(server: ServerProc, tmp_path: Path) -> None:
    """A downloaded file's labels (server/labels.py) go in as a PATCH would take them; the import
    cannot refuse the run for a tag, so a blank one is left out (as a blank name is)."""
    frames = [encode_frame(0, [session_event("labelled")]), encode_frame(1, [step_event(0), step_event(1)])]
    frames.append(labels_frame(2, "renamed", ["a", "", " b ", "\u200b"]))
    assert upload(server, write_file(tmp_path / "l.tscope", frames))[0] == 200
    got = server.get("/api/sessions/labelled")
    assert got["name"] == "renamed" and got["tags"] == ["a", "b"], got  # type: ignore[index]


# ------------------------------------------------------------------ F9: Compare's left-out and repeated runs


def test_compare_names_the_left_out_runs_and_compares_a_repeated_one_once(server: ServerProc, tmp_path: Path) -> None:
    ids = [f"cmp-{k:02d}" for k in range(MAX_COMPARE + 2)]
    for k, sid in enumerate(ids):
        assert upload(server, finished_file(tmp_path / f"{sid}.tscope", sid, steps=3, name=f"lr sweep {k}"))[0] == 200
    status, _, page = _page(server.url + "/compare?" + urllib.parse.urlencode({"runs": ",".join(ids + ["no-such"])}))
    assert status == 200
    assert _data(page, "runs") == ",".join(ids[:MAX_COMPARE])
    assert _data(page, "left-out") == ",".join(ids[MAX_COMPARE:] + ["no-such"])
    assert json.loads(_data(page, "left-out-names")) == [f"lr sweep {k}" for k in (8, 9)] + [None]
    assert _data(page, "repeated") == ""
    # the same id twice (and with a letter): compared once, and passed on as repeated
    a, b = ids[0], ids[1]
    for query in (f"runs={a},{a}", f"a={a}&b={a}", f"runs={a},{b},{a},{b}"):
        status, _, page = _page(f"{server.url}/compare?{query}")
        assert status == 200, query
        want = [a] if query.count(b) == 0 else [a, b]
        assert _data(page, "runs") == ",".join(want) and _data(page, "repeated") == ",".join(want), query
        assert _data(page, "left-out") == ""
    # past eight named, the repeats do not take a place: nine named ids, one twice, are eight runs
    status, _, page = _page(f"{server.url}/compare?runs={','.join([a, *ids[:MAX_COMPARE]])}")
    assert _data(page, "runs") == ",".join(ids[:MAX_COMPARE]) and _data(page, "left-out") == ""


# ------------------------------------------------------------------ F10: an ill-formed id in a browser


def test_an_ill_formed_id_is_a_sentence_for_a_browser_and_json_for_the_api(server: ServerProc, tmp_path: Path) -> None:
    assert upload(server, finished_file(tmp_path / "ok.tscope", "ok-run", steps=3))[0] == 200
    query = "/compare?runs=ok-run,bad/id%20x"
    status, ctype, page = _page(server.url + query, BROWSER)
    assert status == 422 and ctype.startswith("text/html"), (status, ctype, page[:500])
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert ('No session "bad/id x" on this server: that is not a session id (an id is 1 to 200 letters, digits '
            'and . _ : @ + = -, never a space or a /). All sessions') in text, text
    assert "pattern" not in page and "{" not in page.split("<body>")[1]
    assert 'href="/"' in page
    # a letter's id, a session page's id: the same sentence
    for path, given in (("/compare?a=ok-run&b=a%20b", "a b"), ("/sessions/bad%20id", "bad id")):
        status, ctype, page = _page(server.url + path, BROWSER)
        assert status == 422 and ctype.startswith("text/html"), path
        assert f"No session &quot;{given}&quot; on this server: that is not a session id" in page, page
    # anything else the address gets wrong: its parameter and what is wrong with it
    status, ctype, page = _page(server.url + "/compare?a=ok-run&b=ok-run&rank=-1", BROWSER)
    assert status == 422 and "rank: Input should be greater than or equal to 0." in page, page
    # the API, a script, keeps its JSON 422 (no input echoed)
    for headers in ({}, {"Accept": "application/json"}):
        status, ctype, body = _page(server.url + query, headers)
        assert status == 422 and ctype.startswith("application/json"), (headers, ctype)
        assert json.loads(body)["detail"][0]["loc"] == ["query", "runs"]
    status, _, body = _page(server.url + "/api/sessions/bad%20id", BROWSER)  # an API path: JSON for anyone
    assert status == 422 and json.loads(body)["detail"][0]["type"] == "string_pattern_mismatch"
