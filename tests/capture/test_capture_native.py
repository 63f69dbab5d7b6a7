"""Full mode's C++ op recorder (capture/native/): the records the Python recorder makes, checked
against it and against PyTorch; it keeps nothing alive and sees only the training thread."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from capture_models import make
from torch import nn

import torchscope
from torchscope import _native
from torchscope.sessionfile import iter_events
from torchscope.validate import validate_event


@pytest.fixture(scope="module", autouse=True)
def native() -> Any:
    ext = _native.get(block=True)
    # CI installs g++ and ninja (scripts/test.sh): a build failure here is a real failure
    assert ext is not None, f"the native recorder did not build: {_native._error}"
    return ext


def _train(tmp_path: Path, kind: str, native: bool, monkeypatch: pytest.MonkeyPatch, steps: int = 2) -> tuple[list[dict[str, Any]], list[float], list[torch.Tensor]]:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    torch.manual_seed(0)
    model, batch = make(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / f"{kind}-{'native' if native else 'python'}.tscope"
    losses = []
    with torchscope.watch(model, opt, server=None, record=path, mode="full"):
        for i in range(steps):
            x, y = batch(i)
            opt.zero_grad()
            out = model(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    graphs = [e for e in iter_events(path) if e["kind"] == "graph"]
    return graphs, losses, [p.detach().clone() for p in model.parameters()]


# A Python dispatch mode on the stack changes some decompositions (torch takes the
# subclass-safe path): ``add_`` becomes ``add``, ``_reshape_alias`` ``view``.  And autograd
# redispatches ``detach`` (for AccumulateGrad and saved outputs): a mode sees it, an observer not.
_MODE_DECOMPOSES = {"aten::add_": "aten::add", "aten::_reshape_alias": "aten::view"}
OPTIONAL = {"flags", "freed"}  # OpRecord fields written only where an op has any


def _ops(g: dict[str, Any], phase: str) -> list[tuple[Any, ...]]:
    t = g["tensors"]
    return [
        (
            _MODE_DECOMPOSES.get(o["name"], o["name"]),
            o["module"],
            o["src"],
            o["grad_mode"],
            tuple(tuple(t[i]["shape"]) for i in o["inputs"]),
            tuple(tuple(t[i]["shape"]) for i in o["outputs"]),
            tuple(f for f in o.get("flags", ()) if f != "inplace"),
        )
        for o in g["ops"]
        if o["phase"] == phase and o["name"] != "aten::detach"
    ]


@pytest.mark.parametrize("kind", ["zoo", "cnn", "transformer"])
def test_native_records_what_the_python_recorder_records(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nat, nat_losses, nat_params = _train(tmp_path, kind, True, monkeypatch)
    py, py_losses, py_params = _train(tmp_path, kind, False, monkeypatch)
    assert [g["recorder"] for g in nat] == ["native"] * 2 and [g["recorder"] for g in py] == ["python"] * 2
    assert nat_losses == py_losses  # bit for bit: neither recorder changes the training
    assert all(torch.equal(a, b) for a, b in zip(nat_params, py_params, strict=True))
    for gn, gp in zip(nat, py, strict=True):
        assert gn["complete"] and gp["complete"]
        assert _ops(gn, "forward") == _ops(gp, "forward")  # names, modules, lines, shapes, flags
        assert _ops(gn, "backward") == _ops(gp, "backward")
        # the same autograd graph, each node linked to an op of the same name in both
        node = {"ReshapeAliasBackward0": "ViewBackward0"}
        assert [node.get(n["name"], n["name"]) for n in gn["nodes"]] == [n["name"] for n in gp["nodes"]]
        for a, b in zip(gn["nodes"], gp["nodes"], strict=True):
            assert ("op" in a) == ("op" in b), a
            if "op" in a:
                op_a = gn["ops"][a["op"]]["name"]
                assert _MODE_DECOMPOSES.get(op_a, op_a) == gp["ops"][b["op"]]["name"]
                assert a["module"] == b["module"]


@pytest.mark.parametrize("native", [True, False])
def test_backward_ops_are_in_the_module_of_their_node(native: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full-mode backward's ops are the backward of the module whose forward op made the node
    running them (as the node itself is), not a flat list at the root outside the model."""
    (g,) = _train(tmp_path, "transformer", native, monkeypatch, steps=1)[0]
    ops = g["ops"]
    # the modules of the nodes made inside the model, by their forward op
    made_inside = {n["module"] for n in g["nodes"] if "op" in n and "outside_model" not in ops[n["op"]].get("flags", ())}
    backward = [o for o in ops if o["phase"] == "backward" and o["name"] != "aten::detach"]
    inside = [o for o in backward if "outside_model" not in o.get("flags", ())]
    assert {o["module"] for o in inside} == made_inside and len(made_inside) > 10
    # what stays outside: the loss's backward and the root gradient (ones_like)
    outside = [o for o in backward if o not in inside]
    assert len(outside) < 0.1 * len(backward)
    assert all(o["module"] == "" for o in outside)


def _base(name: str) -> str:
    return re.sub(r"[^a-z]", "", name.lower())


@pytest.mark.parametrize("kind", ["zoo", "transformer"])
def test_each_node_comes_from_the_op_pytorch_names_it_after(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graphs, _, _ = _train(tmp_path, kind, True, monkeypatch, steps=1)
    g = graphs[0]
    linked = 0
    for n in g["nodes"]:
        if "op" not in n:
            # AccumulateGrad (a parameter's) and a custom Function's node (its forward ran its
            # ops with grad mode off): no op made them
            assert n["name"] == "AccumulateGrad" or n["name"].startswith("Square"), n
            continue
        op = g["ops"][n["op"]]
        node = _base(re.sub(r"Backward\d*$", "", n["name"]))
        assert _base(op["name"].partition("::")[2]).startswith(node), (n["name"], op["name"])
        assert op["phase"] == "forward"
        # the op's output carries the node as its grad_fn (an in-place op's output is its input,
        # whose earlier grad_fn the table may show)
        assert "inplace" in op.get("flags", ()) or any(g["tensors"][t].get("grad_fn") == n["id"] for t in op["outputs"]), (n, op)
        linked += 1
    assert linked > 10


def test_the_ledger_adds_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graphs, _, _ = _train(tmp_path, "transformer", True, monkeypatch, steps=1)
    g = graphs[0]
    tensors = g["tensors"]
    live = g["ops"][0]["live"] - g["ops"][0]["alloc"] + g["ops"][0]["free"]
    for o in g["ops"]:
        ins = {tensors[i].get("storage") for i in o["inputs"]}
        new = {}
        for i in o["outputs"]:
            st = tensors[i].get("storage")
            if st is not None and st not in ins:
                new[st] = tensors[i]["nbytes"]
        # an allocation is an output's storage that is not an input's (a view, an in-place result)
        assert o["alloc"] == sum(new.values()), o
        live += o["alloc"] - o["free"]
        assert o["live"] == live
    assert 0 < sum(o["free"] for o in g["ops"]) <= sum(o["alloc"] for o in g["ops"])
    assert [tuple(p) for p in g["memory_timeline"]] == [(o["id"], o["live"]) for o in g["ops"]]


def test_native_recorder_keeps_no_activation_alive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    refs: list[weakref.ref[torch.Tensor]] = []
    model[0].register_forward_hook(lambda m, a, out: refs.append(weakref.ref(out)))
    with torchscope.watch(model, opt, server=None, record=tmp_path / "alive.tscope", mode="full"):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(32, 64)).pow(2).mean().backward()
            opt.step()
        assert len(refs) == 3 and all(r() is None for r in refs)


def test_another_threads_ops_are_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1")
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            torch.ones(4).cumsum(0)

    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "threads.tscope"
    th = threading.Thread(target=busy)
    th.start()
    try:
        with torchscope.watch(model, opt, server=None, record=path, mode="full"):
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(8, 4)).sum().backward()
                opt.step()
    finally:
        stop.set()
        th.join()
    graphs = [e for e in iter_events(path) if e["kind"] == "graph"]
    assert len(graphs) == 3 and all(g["recorder"] == "native" for g in graphs)
    names = {o["name"] for g in graphs for o in g["ops"]}
    assert "aten::addmm" in names and "aten::cumsum" not in names and "aten::ones" not in names


@pytest.mark.parametrize("mode", ["default", "full"])
def test_recording_that_moves_thread_leaves_no_observer(
    mode: str, native: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Forwards in one thread, backwards and steps in another: the observer is registered per
    thread, and only its thread can remove it.  It was left on the forward thread for good (every
    later op there went through it), removed from the wrong one (torch warned "Requested callback
    is not found"), and a reset by one thread could be followed by the other's op finishing a
    record that was gone.  The training is unchanged, and no thread keeps a callback."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1")

    def run(watched: bool) -> tuple[list[torch.Tensor], ThreadPoolExecutor, ThreadPoolExecutor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fwd, bwd = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
        w = torchscope.watch(model, opt, server=None, record=tmp_path / f"{mode}.tscope", mode=mode) if watched else None
        for _ in range(4):
            out = fwd.submit(model, torch.randn(8, 16)).result()

            def rest(out: torch.Tensor = out) -> None:
                opt.zero_grad()
                out.pow(2).mean().backward()
                opt.step()

            bwd.submit(rest).result()
        if w is not None:
            w.close()
        return [p.detach().clone() for p in model.parameters()], fwd, bwd

    plain, _, _ = run(False)
    params, fwd, bwd = run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, params, strict=True))
    for pool in (fwd, bwd):
        pool.submit(torch.ones(2).add, 1).result()  # a thread drops a registration left to it at its next op
        assert not pool.submit(native.observed).result()
        pool.shutdown()
    assert not native.observed()
    assert "Requested callback is not found" not in capfd.readouterr().err
    graphs = [e for e in iter_events(tmp_path / f"{mode}.tscope") if e["kind"] == "graph"]
    assert graphs and all({"aten::addmm", "aten::relu"} <= {o["name"] for o in g["ops"]} for g in graphs)


def test_off_switch_falls_back_to_the_python_recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graphs, _, _ = _train(tmp_path, "cnn", False, monkeypatch, steps=1)
    assert graphs[0]["recorder"] == "python" and graphs[0]["ops"]


_FIRST_USE = """
import sys, time
import torch
from torch import nn
import torchscope
from torchscope import _native
from torchscope.sessionfile import iter_events

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
path, wait = sys.argv[1], sys.argv[2] == "wait"

def step():
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()

with torchscope.watch(model, opt, server=None, record=path, mode="full"):
    step()
    if wait:  # the training goes on: a step's state asks for the library, loaded once it is built
        deadline = time.monotonic() + 400
        while _native.loaded() is None and _native._error is None and time.monotonic() < deadline:
            time.sleep(0.2)
        step()
print([g["recorder"] for g in iter_events(path) if g["kind"] == "graph"])
"""


def _build_processes() -> list[int]:
    """The pids of full mode's background builds (``python -m torchscope._native --background``)."""
    found = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and b"torchscope._native\0--background" in (d / "cmdline").read_bytes():
                found.append(int(d.name))
    return found


def test_first_full_watch_builds_in_the_background(tmp_path: Path) -> None:
    """A user's first full-mode run: training goes on with the Python recorder while the
    extension compiles in a process of its own (past the lock file of a build that died a
    moment ago: cpp_extension waited on it with no timeout), which outlives a short script (QA
    49b: a daemon thread's build died with each ~170 s script before ninja logged its objects,
    and no run ever got the library); a script running meanwhile switches to it, and the
    next one records with it from its first step."""
    from conftest import run_script

    build = tmp_path / "build"
    folder = build / _native.build_dir().name  # one folder per torch and Python version and source
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")  # fresh: no age tells it from a live build's, the flock no one holds does
    script = tmp_path / "first.py"
    script.write_text(_FIRST_USE)
    env = {"TORCHSCOPE_NATIVE_BUILD": str(build)}
    before = set(_build_processes())
    short = run_script(script, str(tmp_path / "short.tscope"), "exit", env=env, timeout=120)
    assert "['python']" in short.stdout
    assert "building full mode's C++ op recorder in the background" in short.stderr
    # the script is gone, its build is not
    assert set(_build_processes()) - before, "the build ended with the script that started it"
    assert not any(folder.glob("*.so"))  # (the test's premise: the script ended mid-build)
    meanwhile = run_script(script, str(tmp_path / "meanwhile.tscope"), "wait", env=env, timeout=500)
    assert "['python', 'native']" in meanwhile.stdout, meanwhile.stderr
    assert "C++ op recorder built in" in meanwhile.stderr
    assert any(folder.glob("*.so")) and (folder / "build.log").is_file()
    after = run_script(script, str(tmp_path / "after.tscope"), "exit", env=env, timeout=120)
    assert "['native']" in after.stdout and "building" not in after.stderr, after.stderr


_NO_COMPILER = """
import sys
import torch
from torch import nn
import torchscope
from torchscope import _native
from torchscope.sessionfile import iter_events
from torchscope.validate import validate_event

model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torchscope.watch(model, opt, server=None, record=sys.argv[1], mode="full"):
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    if _native._building is not None:
        _native._building.join(timeout=60)
print([g["recorder"] for g in iter_events(sys.argv[1]) if g["kind"] == "graph"])
"""


def test_full_mode_without_a_compiler_records_in_python(tmp_path: Path) -> None:
    from conftest import run_script

    script = tmp_path / "nocc.py"
    script.write_text(_NO_COMPILER)
    env = {"TORCHSCOPE_NATIVE_BUILD": str(tmp_path / "build"), "CXX": "no-such-c++", "PATH": str(tmp_path)}
    res = run_script(script, str(tmp_path / "nocc.tscope"), env=env, timeout=120)
    assert "['python', 'python', 'python']" in res.stdout
    assert "full mode records ops in Python" in res.stderr and "no C++ compiler" in res.stderr


def test_its_json_is_the_records_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The extension writes a step's op and tensor records as JSON itself: the same keys and
    value types as the Python recorder's dicts, valid against the schema, and module names
    that need escaping come back as they were."""

    def run(native: bool) -> list[dict[str, Any]]:
        monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
        torch.manual_seed(0)
        model = nn.Sequential()
        model.add_module('q"uo\\te\n', nn.Linear(4, 8))  # a quote, a backslash, a control character
        model.add_module("ünï", nn.ReLU())  # and beyond ASCII
        model.add_module("out", nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = tmp_path / f"esc-{native}.tscope"
        with torchscope.watch(model, opt, server=None, record=path, mode="full"):
            for _ in range(2):
                opt.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                opt.step()
        return [validate_event(e) for e in iter_events(path) if e["kind"] == "graph"]

    nat, py = run(True), run(False)
    assert [g["recorder"] for g in nat] == ["native"] * 2
    for gn, gp in zip(nat, py, strict=True):
        assert {o["module"] for o in gn["ops"]} == {o["module"] for o in gp["ops"]} >= {'q"uo\\te\n', "ünï", "out"}
        keys: dict[str, set[str]] = {}  # op name -> the keys the Python recorder writes
        for o in gp["ops"]:
            keys.setdefault(o["name"], set()).update(o)
        # (of the optimizer.step() ops full mode records, the C++ recorder also sees those its ops
        # run -- a lift_fresh's empty, a step count's detach_ -- which a dispatch mode does not)
        model_ops = [o for o in gn["ops"] if o["phase"] != "optimizer"]
        assert sum(_MODE_DECOMPOSES.get(o["name"], o["name"]) in keys for o in model_ops) >= len(model_ops) - 4
        for a in gn["ops"]:
            b = keys.get(_MODE_DECOMPOSES.get(a["name"], a["name"]))
            if b is not None:
                assert a.keys() - OPTIONAL == b - OPTIONAL, (a, b)  # (each written only where it has any)
            assert type(a["dur_us"]) is float and all(type(a[k]) is int for k in ("id", "call", "micro", "alloc", "free", "live"))
        # the tensor tables differ in order and length (see above): the same keys, of the same types
        def types(ts: list[dict[str, Any]]) -> dict[str, set[type]]:
            out: dict[str, set[type]] = {}
            for t in ts:
                for k, v in t.items():
                    out.setdefault(k, set()).add(type(v))
            return out

        assert types(gn["tensors"]) == types(gp["tensors"])
        params = {t["param"] for t in gn["tensors"] if "param" in t}
        assert params == {t["param"] for t in gp["tensors"] if "param" in t} >= {'q"uo\\te\n.weight', "out.bias"}
        # outputs of differentiable ops name their graph node in both
        assert any("grad_fn" in t for t in gn["tensors"]) and any("grad_fn" in t for t in gp["tensors"])
        assert {n for t in gn["tensors"] if (n := t.get("grad_fn")) is not None} <= set(range(len(gn["nodes"])))


def test_a_failed_build_says_what_the_compiler_said(tmp_path: Path) -> None:
    """A build that fails (here: a compiler that is asked to include a header that is not there,
    as torch 2.11 lacks one a source once included) is one line naming the compiler's error,
    and ``python -m torchscope._native`` prints the end of the compiler's log after it."""
    import subprocess
    import sys

    cxx = tmp_path / "c++"
    cxx.write_text('#!/bin/sh\nexec g++ -include torchscope_planted_missing.h "$@"\n')
    cxx.chmod(0o755)
    env = {**os.environ, "TORCHSCOPE_NATIVE_BUILD": str(tmp_path / "build"), "CXX": str(cxx)}
    res = subprocess.run(
        [sys.executable, "-m", "torchscope._native"], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 1, res.stdout + res.stderr
    # torch's own log lines may come first (a CUDA build of torch on a machine without a GPU
    # says "No CUDA runtime is found" as cpp_extension is imported)
    first = next(ln for ln in res.stderr.splitlines() if ln.startswith("torchscope:"))
    assert first.startswith("torchscope: native recorder not available: RuntimeError: C++ build failed: "), first
    assert "fatal error: torchscope_planted_missing.h: No such file or directory" in first
    assert "ninja: build stopped" in res.stderr  # the log's end follows the line


def test_a_build_waits_for_a_dead_builds_compilers(tmp_path: Path) -> None:
    """ninja and its compilers outlive a script that exits mid-build, and went on writing the
    objects the next build compiled in the same folder: a build now waits for whatever still
    runs there (a process whose working directory the folder is, as ninja's is)."""
    import subprocess
    import time

    out = tmp_path / "build"
    out.mkdir()
    orphan = subprocess.Popen(["sleep", "3"], cwd=out)  # stands in for the dead build's ninja
    t0 = time.monotonic()
    try:
        with _native._one_build(out):
            waited = time.monotonic() - t0
            assert orphan.poll() is not None  # it had ended before this build began
    finally:
        orphan.kill()
        orphan.wait()
    assert waited >= 2.0, waited
