"""The public surface: import cost boundaries, the generated schema page, argument errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO
from torch import nn

import torchscope
from torchscope._schemadoc import render


def test_import_does_not_pull_the_web_stack() -> None:
    code = (
        "import sys, torchscope\n"
        "bad = [m for m in ('fastapi', 'uvicorn', 'jinja2', 'starlette', 'pydantic') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert res.stdout.strip() == ""


def test_public_names() -> None:
    assert torchscope.__version__ == "0.1.0"
    assert callable(torchscope.watch) and callable(torchscope.load)
    assert isinstance(torchscope.Watch, type)


def test_event_schema_page_is_generated_from_schema() -> None:
    assert (REPO / "docs" / "event-schema.md").read_text() == render(), (
        "docs/event-schema.md is stale: python -m torchscope._schemadoc > docs/event-schema.md"
    )


def test_bad_mode_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        torchscope.watch(nn.Linear(2, 2), server=None, record=tmp_path / "x.tscope", mode="fast")
    assert not (tmp_path / "x.tscope").exists()


def test_watch_of_no_model_or_a_bad_count_is_a_clear_error(tmp_path: Path) -> None:
    """``watch(opt)`` (the model forgotten) raised AttributeError: 'SGD' object has no attribute
    'named_parameters'; ``sample_every=0`` was read as 1 without a word (QA 52a)."""
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"^torchscope: watch\(\) takes the model, an nn.Module, first; got SGD "
                                        r"\(the optimizer goes second: watch\(model, optimizer\)\)$"):
        torchscope.watch(opt, server=None, record=tmp_path / "x.tscope")  # type: ignore[arg-type]
    for bad in (0, -1, 2.5, "50"):
        with pytest.raises(ValueError, match=r"sample_every must be a whole number of steps, at least 1"):
            torchscope.watch(model, opt, server=None, record=tmp_path / "x.tscope", sample_every=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "x.tscope").exists()


def test_a_server_url_with_a_path_is_told_not_sent_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """``$TORCHSCOPE_SERVER`` with a path was sent to and refused "HTTP 404: {"detail":"Not Found"}",
    where `torchscope open` says what is wrong (QA 52a): the same words now, and the file only."""
    monkeypatch.setenv("TORCHSCOPE_SERVER", "http://127.0.0.1:9/x")
    model = nn.Linear(2, 2)
    w = torchscope.watch(model, record=tmp_path / "x.tscope")
    w.close()
    err = capfd.readouterr().err
    assert ("torchscope: TORCHSCOPE_SERVER='http://127.0.0.1:9/x': give the server's base URL (http://127.0.0.1:6150), "
            "without a path or user:password; recording to the file only") in err.splitlines(), err
    assert w.url is None and "started a torchscope server" not in err
    with pytest.raises(ValueError, match=r"^torchscope: server='http://u:p@127.0.0.1:9': give the server's base URL"):
        torchscope.watch(model, server="http://u:p@127.0.0.1:9", record=tmp_path / "y.tscope")
    assert not (tmp_path / "y.tscope").exists()


def test_a_server_that_is_no_url_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="server must be 'auto', None or an http"):
        torchscope.watch(nn.Linear(2, 2), server="notaurl", record=tmp_path / "x.tscope")
    assert not (tmp_path / "x.tscope").exists()


def test_a_web_server_that_is_not_torchscope_is_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Its HTML error page was printed whole as the warning."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = b"<html>\n<head><title>Error</title></head>\n<body>\n<h1>Not here</h1>\n</body>\n</html>\n"
            self.send_response(500)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        model = nn.Linear(2, 1)
        with torchscope.watch(model, server=f"http://127.0.0.1:{srv.server_address[1]}", record=tmp_path / "w.tscope"):
            model(torch.randn(3, 2)).sum().backward()
    finally:
        srv.shutdown()
    err = capfd.readouterr().err.splitlines()
    (warned,) = [line for line in err if "torchscope: server" in line]
    # (QA 45c: the page was printed raw on one line, and `open --port` of that port advised)
    assert "is another program, not a torchscope server (it answered HTTP 500)" in warned, warned
    assert "<html>" not in "\n".join(err)
    (end,) = [line for line in err if "the file is complete" in line]
    assert "--port N, with a free port N" in end, end


def test_close_twice_and_context_manager(tmp_path: Path) -> None:
    with torchscope.watch(nn.Linear(2, 2), server=None, record=tmp_path / "y.tscope") as w:
        assert w.path == str(tmp_path / "y.tscope") and w.url is None and w.session_id
    w.close()  # harmless
    assert (tmp_path / "y.tscope").stat().st_size > 16


def test_watching_a_watched_model_again_replaces_the_watch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A notebook cell run twice, or watch() called every epoch: the earlier watch is closed
    (its file complete), the model keeps one set of hooks, the new watch records what follows."""
    import torch

    from torchscope.sessionfile import iter_events

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses: list[float] = []

    def train(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())

    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    def optimizer_hooks() -> tuple[int, int]:  # the watch's are torch.optim's global step hooks
        return len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)

    before = optimizer_hooks()
    first, second = tmp_path / "first.tscope", tmp_path / "second.tscope"
    torchscope.watch(model, opt, server=None, record=first)
    train(3)
    w = torchscope.watch(model, opt, server=None, record=second)
    assert f"already watched (recording to {first})" in capsys.readouterr().err
    assert len(model._forward_hooks) == len(model._forward_pre_hooks) == 1
    assert optimizer_hooks() == (before[0] + 1, before[1] + 1)
    train(4)
    w.close()
    assert optimizer_hooks() == before
    a, b = list(iter_events(first)), list(iter_events(second))
    assert a[-1]["kind"] == "end" and a[-1]["steps"] == 3
    assert [e["loss"] for e in a if e["kind"] == "step"] == pytest.approx(losses[:3], rel=1e-6)
    assert [e["loss"] for e in b if e["kind"] == "step"] == pytest.approx(losses[3:], rel=1e-6)


def _end(path: Path) -> dict[str, object]:
    from torchscope.sessionfile import iter_events

    return [e for e in iter_events(path) if e["kind"] == "end"][-1]


@pytest.mark.parametrize(
    ("exc", "status", "message"),
    [
        (RuntimeError("CUDA out of memory\nmore lines"), "error", "RuntimeError: CUDA out of memory"),
        (KeyboardInterrupt(), "interrupted", "stopped by Ctrl-C (KeyboardInterrupt)"),
        (SystemExit(0), "finished", "exited early (SystemExit: 0)"),
    ],
)
def test_a_run_that_raises_ends_with_its_reason(exc: BaseException, status: str, message: str, tmp_path: Path) -> None:
    """The with-block's exception reaches the user unchanged; the session says how it ended."""
    import torch

    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "raised.tscope"
    with pytest.raises(type(exc)) as caught, torchscope.watch(model, opt, server=None, record=path):
        for i in range(3):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            if i == 1:
                raise exc
    assert caught.value is exc
    end = _end(path)
    assert (end["status"], end["message"], end["steps"]) == (status, message, 2)


def test_an_uncaught_exception_in_a_script_ends_the_session_as_error(tmp_path: Path) -> None:
    """No with-block: the exception is noted before atexit closes the watch; Python still prints
    the traceback and exits 1; ``torchscope info`` says why the run ended."""
    path = tmp_path / "crash.tscope"
    script = tmp_path / "crash.py"
    script.write_text(
        "import torch, torchscope\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        f"torchscope.watch(model, opt, server=None, record={str(path)!r})\n"
        "for i in range(3):\n"
        "    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "raise ValueError('loss became NaN at step 3')\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "Traceback" in run.stderr and "ValueError: loss became NaN at step 3" in run.stderr
    end = _end(path)
    assert (end["status"], end["message"], end["steps"]) == ("error", "ValueError: loss became NaN at step 3", 3)
    info = subprocess.run(
        [sys.executable, "-m", "torchscope.server.cli", "info", str(path)], capture_output=True, text=True, timeout=120
    )
    assert info.returncode == 0 and "error — ValueError: loss became NaN at step 3" in info.stdout


_TERM_LOOP = """
import signal, sys, torch, torchscope
stop = []
def theirs(signum, frame):
    stop.append(signum)
    if callable(prev):
        prev(signum, frame)
if sys.argv[2] == "before":  # the script's own handler, set before watch(): it stays the handler
    prev = None
    signal.signal(signal.SIGTERM, theirs)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torchscope.watch(model, opt, server=None, record=sys.argv[1])
if sys.argv[2] == "after":  # one set after watch() that calls the one it replaced, as Lightning's does
    prev = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, theirs)
i = 0
while not stop:
    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
    i += 1
    if i == 3:
        print("ready", flush=True)
print(f"stopped after {i} steps", flush=True)
"""


@pytest.mark.parametrize("handler", ["none", "after", "before"])
def test_sigterm_ends_the_run_as_interrupted(handler: str, tmp_path: Path) -> None:
    """SIGTERM (kill, a scheduler's preemption): with no handler of the script's own, the run
    ends "interrupted" and the process still dies of the signal; a handler set after watch()
    that calls the one it replaced lets the script stop cleanly, the run noted as interrupted;
    one set before watch() is left alone, and the run ends as the script makes it end."""
    import signal

    path = tmp_path / "term.tscope"
    script = tmp_path / "term.py"
    script.write_text(_TERM_LOOP)
    proc = subprocess.Popen([sys.executable, str(script), str(path), handler], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    end = _end(path)
    if handler == "none":
        assert proc.returncode == -signal.SIGTERM and out == ""
        assert end["status"] == "interrupted" and "SIGTERM" in end["message"] and end["steps"] >= 3
        return
    assert proc.returncode == 0 and out.startswith("stopped after ")
    steps = int(out.split()[2])
    if handler == "after":
        assert end["status"] == "interrupted" and "SIGTERM" in end["message"] and end["steps"] == steps
    else:
        assert end["status"] == "finished" and "message" not in end and end["steps"] == steps


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the point of the test
def test_a_training_thread_that_dies_ends_the_session_as_error(tmp_path: Path) -> None:
    """The loop in a thread of its own dies: its watch ends as error; an unrelated thread's
    exception before that did not count."""
    import threading

    import torch

    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "thread.tscope"
    w = torchscope.watch(model, opt, server=None, record=path)

    def bystander() -> None:
        raise ValueError("an unrelated thread")

    def loop() -> None:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        raise RuntimeError("the training thread died")

    for target in (bystander, loop):
        t = threading.Thread(target=target)
        t.start()
        t.join()
    w.close()
    end = _end(path)
    assert (end["status"], end["message"], end["steps"]) == ("error", "RuntimeError: the training thread died", 3)


def test_runs_are_named_after_their_script_and_two_watches_get_two_files(tmp_path: Path) -> None:
    """No ``name=`` and no ``record=``: a GAN's two ``nn.Sequential`` watches, started in the
    same second, are named after the script (not both "sequential"), write two files, and
    count the steps of their own optimizers."""
    from torchscope import load

    script = tmp_path / "train_gan.py"
    script.write_text(
        "import torch, torchscope\n"
        "g = torch.nn.Sequential(torch.nn.Linear(4, 4)); d = torch.nn.Sequential(torch.nn.Linear(4, 1))\n"
        "og = torch.optim.SGD(g.parameters(), lr=0.1); od = torch.optim.SGD(d.parameters(), lr=0.1)\n"
        "wg = torchscope.watch(g, og, server=None); wd = torchscope.watch(d, od, server=None)\n"
        "for _ in range(2):\n"
        "    od.zero_grad(); d(g(torch.randn(2, 4)).detach()).mean().backward(); od.step()\n"
        "    og.zero_grad(); (-d(g(torch.randn(2, 4)))).mean().backward(); og.step()\n"
        "print(wg.path); print(wd.path)\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    paths = run.stdout.split()
    assert len(paths) == 2 and paths[0] != paths[1]
    sessions = [load(tmp_path / p) for p in paths]
    assert [s.name for s in sessions] == ["train_gan", "train_gan"]
    # the critic's watch sees the generator's last backward through the critic, which its
    # optimizer never applies: no third step
    assert [len(s.steps) for s in sessions] == [2, 2] and all(s.status == "finished" for s in sessions)
    assert all(p.name.startswith("train_gan-") for p in (tmp_path / "torchscope-runs").iterdir())
