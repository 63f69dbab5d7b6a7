"""P8's silent form from a real capture: a write through ``.data`` into a tensor a graph node
saved for backward is flagged "inplace_saved" on its op by both op recorders (the native one
and the Python dispatch mode), in full mode and on default mode's captured steps, and the doctor
points at it; in-place ops on tensors nobody saved are not flagged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchscope
from torchscope import _native
from torchscope.doctor import diagnose
from torchscope.sessionfile import iter_events


class DataWrite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.a(x))  # SigmoidBackward0 saves its output h
        h.data.mul_(0.5)  # h's version counter does not see this: the gradient silently uses it
        r = torch.relu_(self.b(x))  # in place on an output nobody had saved yet
        return (h * r).sum()


class Safe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone().add_(1.0)  # in place before anything saved it
        return self.body(x).sum()


def _record(model: nn.Module, tmp_path: Path, mode: str, native: bool, monkeypatch: pytest.MonkeyPatch,
            shape: tuple[int, ...] = (3, 4)) -> list[dict[str, Any]]:
    monkeypatch.setenv("TORCHSCOPE_NATIVE", "1" if native else "0")
    if native:
        assert _native.get(block=True) is not None, f"the native extension did not build: {_native._error}"
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / f"{mode}-{native}.tscope"
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(*shape)).backward()
            opt.step()
    return list(iter_events(path))


def _graphs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    graphs = [e for e in events if e["kind"] == "graph"]
    assert graphs, "no step was captured"
    return graphs


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("mode", ["full", "default"])
def test_a_data_write_into_a_saved_tensor_is_flagged_and_diagnosed(
    tmp_path: Path, mode: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _record(DataWrite(), tmp_path, mode, native, monkeypatch)
    for g in _graphs(events):
        assert g["recorder"] == ("native" if native else "python")
        ops, tensors = g["ops"], g["tensors"]
        flagged = [o for o in ops if "inplace_saved" in o.get("flags", ())]
        assert [o["name"] for o in flagged] == ["aten::mul_"]
        assert all("inplace_saved" not in o.get("flags", ()) for o in ops if o["name"] == "aten::relu_")
        # checked against the graph itself: the node that saved what mul_ wrote came from an earlier op
        written = tensors[flagged[0]["inputs"][0]]["storage"]
        savers = [n for n in g["nodes"] if any(t["storage"] == written for t in n.get("saved", ()))]
        assert "SigmoidBackward0" in [n["name"] for n in savers]
        assert min(n["op"] for n in savers if "op" in n) < flagged[0]["id"]
    found = [f for f in diagnose(events) if f["code"] == "P8"]
    assert len(found) == 1 and "aten::mul_" in found[0]["message"]
    assert found[0]["src"] == f"{Path(__file__).name}:{DataWrite.forward.__code__.co_firstlineno + 2}"
    assert found[0]["targets"][0]["op"] == [o for o in _graphs(events)[0]["ops"] if o["name"] == "aten::mul_"][0]["id"]


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_in_place_ops_on_unsaved_tensors_are_not_flagged(tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _record(Safe(), tmp_path, "full", native, monkeypatch)
    graphs = _graphs(events)
    inplace = [o["name"] for g in graphs for o in g["ops"] if o["inplace"]]
    assert "aten::relu_" in inplace and "aten::add_" in inplace  # the in-place ops were recorded
    assert not [o for g in graphs for o in g["ops"] if "inplace_saved" in o.get("flags", ())]
    assert not [f for f in diagnose(events) if f["code"] == "P8"]


class Gru(nn.Module):
    """nn.GRU on the CPU: torch's GRU cell adds into and sigmoid_s the gate chunks of one
    ``unsafe_chunk``ed matrix in place after a node saved another chunk of it -- one storage,
    disjoint bytes, strided across the batch rows."""

    def __init__(self) -> None:
        super().__init__()
        self.gru, self.out = nn.GRU(4, 6, batch_first=True), nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.gru(x)[0][:, -1]).sum()


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_torch_writing_other_parts_of_a_saved_storage_is_not_flagged(
    tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _record(Gru(), tmp_path, "full", native, monkeypatch, shape=(3, 5, 4))
    for g in _graphs(events):
        tensors = g["tensors"]
        first = {t["storage"]: n["op"] for n in g["nodes"] if "op" in n for t in n.get("saved", ())}
        shared = [o for o in g["ops"] if o["inplace"] and o["phase"] == "forward" and o["name"].endswith("_")
                  and first.get(tensors[o["inputs"][0]].get("storage"), o["id"]) < o["id"]]
        assert shared, "the GRU wrote no storage a node had saved: the case under test did not arise"
        assert not [o for o in g["ops"] if "inplace_saved" in o.get("flags", ())]
    assert not [f for f in diagnose(events) if f["code"] == "P8"]


def test_regions_overlap_element_by_element() -> None:
    """``_overlap.overlaps`` against the set of bytes each view covers, counted here: the chunks
    of a matrix split along its columns interleave row by row without sharing a byte."""
    from torchscope._overlap import overlaps, region

    base = torch.zeros(4, 9)

    def reg(t: torch.Tensor) -> tuple[Any, ...]:
        return region(t.storage_offset(), t.shape, t.stride(), t.element_size())

    def covered(t: torch.Tensor) -> set[int]:
        idx = torch.arange(base.numel()).view(4, 9).as_strided(t.shape, t.stride(), t.storage_offset())
        return {int(i) * 4 + b for i in idx.flatten() for b in range(4)}

    a, b, c = base.unsafe_chunk(3, 1)
    views = [a, b, c, base[1:3], base[:, 2:5], base.t(), base[0], base[:0], base[::2, ::3]]
    for x in views:
        for y in views:
            assert overlaps(reg(x), reg(y)) == bool(covered(x) & covered(y)), (x.shape, x.stride(), y.shape, y.stride())


def _skipping_failures(model: nn.Module, path: Path, batches: int, loss_of: Any, mode: str = "default") -> int:
    """A loop that skips a batch whose backward fails (SGD, watched, recorded to ``path``):
    how many failed."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    failed = 0
    with torchscope.watch(model, opt, server=None, record=path, mode=mode):
        for i in range(batches):
            opt.zero_grad()
            loss = loss_of(i)
            try:
                loss.backward()
            except RuntimeError:
                failed += 1
                continue
            opt.step()
    return failed


class MulAfterSigmoid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.l1(x))
        out = self.l2(h)
        h.mul_(0.5)  # sigmoid saved h, l2's addmm saved it: backward raises
        return out + h.sum(1, keepdim=True) * 0


def test_a_caught_in_place_error_names_the_op_and_the_nodes_that_needed_it(tmp_path: Path) -> None:
    """Torch's message names the tensor's grad_fn now, "output 0 of MulBackward0": the in-place
    op's own node, not the one that needed the tensor.  The doctor names mul_ (and its line)
    and the nodes of the earlier ops that saved h; a loop catching the error every iteration
    is said to have failed that many times."""
    model = MulAfterSigmoid()
    path = tmp_path / "caught.tscope"
    failed = _skipping_failures(model, path, 5, lambda i: nn.functional.mse_loss(
        model(torch.randn(16, 8)), torch.randn(16, 1)))
    assert failed == 5
    (p8,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P8"]
    msg = p8["message"]
    assert "failed 5 times" in msg and "(aten::mul_)" in msg, msg
    assert "SigmoidBackward0" in msg and "AddmmBackward0 (in 'l2')" in msg and "MulBackward0" not in msg, msg
    line = MulAfterSigmoid.forward.__code__.co_firstlineno + 3
    assert p8["src"] == f"{Path(__file__).name}:{line}"


def test_a_graph_kept_across_steps_that_optimizer_step_changed_is_said_so(tmp_path: Path) -> None:
    """A GRU's hidden state carried across batches without detach, "fixed" with
    retain_graph=True: the second backward runs through the first step's graph, whose saved
    weights Adam updated in place.  Torch names a view of the weight ("output 0 of AsStrided"):
    the doctor names the parameter and says to detach the state, not to avoid in-place ops."""
    torch.manual_seed(0)
    emb, rnn = nn.Embedding(30, 8), nn.GRU(8, 16, batch_first=True)
    model = nn.ModuleDict({"emb": emb, "rnn": rnn})
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    path = tmp_path / "rnn.tscope"
    data = torch.randint(0, 30, (2, 40))
    h = None
    with torchscope.watch(model, opt, server=None, record=path), pytest.raises(RuntimeError, match="inplace"):
        for step in range(4):
            opt.zero_grad()
            out, h = rnn(emb(data[:, step * 9:(step + 1) * 9]), h)  # h not detached
            out.pow(2).mean().backward(retain_graph=True)
            opt.step()
    (p8,) = [f for f in diagnose(iter_events(path)) if f["code"] == "P8"]
    assert "optimizer.step() had updated" in p8["message"] and "retain_graph=True" in p8["message"], p8["message"]
    assert p8["params"] and all(p.startswith("rnn.weight_") for p in p8["params"]), p8["params"]
    assert "h = h.detach()" in p8["fix"] and "out-of-place" not in p8["fix"]


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.gate, self.out = nn.Linear(16, 32), nn.Linear(16, 32), nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, centre: bool) -> torch.Tensor:
        g = torch.sigmoid(self.gate(x))
        h = self.inp(x) * g  # MulBackward0 saves g (its `other`)
        if centre:
            g.sub_(0.5)  # ... which this changes: that backward fails
        return self.out(h)


@pytest.mark.parametrize("mode", ["default", "full"])
def test_a_failing_backward_the_loop_skips_leaves_the_capture_on(tmp_path: Path, mode: str) -> None:
    """Every third batch's backward fails and the loop skips it.  Reading the facts of a
    MulBackward0 whose saved `other` was changed in place raises torch's own error: the capture
    of backward took that for an internal error and turned itself off for the rest of the run
    (the steps after had no loss and no backward, the doctor counted 2 failures of 8).  In
    default mode the steps after a failure not captured are captured until one with a failure
    is, for the doctor to name the in-place op."""
    torch.manual_seed(0)
    model = Gated()
    path = tmp_path / f"{mode}.tscope"

    def loss(i: int) -> torch.Tensor:
        x = torch.randn(32, 16)
        return nn.functional.mse_loss(model(x, centre=i % 3 == 2), x[:, :1])

    failed = _skipping_failures(model, path, 13, loss, mode)  # the last batch trains: no failure after the last step
    events = list(iter_events(path))
    assert not [e for e in events if e["kind"] == "log" and "turned off" in str(e.get("message"))]
    # a skipped batch's failed backward belongs to the step that the next batch ends
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 13 - failed and sum(len(e["backward_errors"]) for e in steps) == failed
    assert all(e["backward_src"] and e["loss"] is not None for e in steps)
    (p8,) = [f for f in diagnose(events) if f["code"] == "P8"]
    assert failed == 4 and f"failed {failed} times" in p8["message"], p8["message"]
    # a failing step's graph captured (default mode: captured until one is): the in-place op,
    # and what saved g
    assert "(aten::sub_)" in p8["message"] and "SigmoidBackward0 and MulBackward0" in p8["message"], p8["message"]
    captured = [e["step"] for e in events if e["kind"] == "graph"]
    if mode == "default":  # step 0; then steps 3 (no failure) and 4 (one), no more
        assert captured == [0, 3, 4], captured


class TwoTanh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(24, 24), nn.Linear(24, 24), nn.Linear(24, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        h += x  # the residual written in place: tanh saved its output h
        h = torch.tanh(self.fc2(h))
        return self.head(h)


def test_of_two_nodes_torch_could_mean_the_one_whose_output_was_written_over(tmp_path: Path) -> None:
    """Torch names "output 0 of TanhBackward0": of the graph's two TanhBackward0 nodes, the
    first tanh's, whose output `h += x` wrote over -- not the second's, met first in the
    backward -- and the in-place op is that add_, at its line."""
    torch.manual_seed(0)
    model = TwoTanh()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "tanh.tscope"
    with torchscope.watch(model, opt, server=None, record=path), pytest.raises(RuntimeError, match="inplace"):
        x = torch.randn(16, 24)
        nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
    events = list(iter_events(path))
    (p8,) = [f for f in diagnose(events) if f["code"] == "P8"]
    assert "(aten::add_)" in p8["message"] and "TanhBackward0" in p8["message"], p8["message"]
    first = TwoTanh.forward.__code__.co_firstlineno
    assert p8["src"] == f"{Path(__file__).name}:{first + 2}"
    (graph,) = [e for e in events if e["kind"] == "graph"]
    node = next(t["node"] for t in p8["targets"] if "node" in t)
    op_of = {n["id"]: n.get("op") for n in graph["nodes"]}
    src_of = {op["id"]: op.get("src") for op in graph["ops"]}
    assert src_of[op_of[node]] == f"{Path(__file__).name}:{first + 1}"  # the first tanh's node


class Queue(nn.Module):
    """MoCo's negatives without ``.clone()``: the logits read the queue buffer, then the keys
    are enqueued into it in place under no_grad -- a tensor with no grad_fn, so torch's message
    names no node, only its shape."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 4)
        self.register_buffer("queue", torch.randn(4, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.enc(x)
        logits = q @ self.queue  # MmBackward0 saves the queue
        with torch.no_grad():
            self.queue[:, : len(x)] = q.T  # the enqueue, in place
        return logits


def test_an_in_place_write_into_a_buffer_without_grad_fn_is_found_by_its_shape(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Queue()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "queue.tscope"
    with torchscope.watch(model, opt, server=None, record=path), pytest.raises(RuntimeError, match="inplace"):
        nn.functional.cross_entropy(model(torch.randn(3, 8)), torch.zeros(3, dtype=torch.long)).backward()
    events = list(iter_events(path))
    (p8,) = [f for f in diagnose(events) if f["code"] == "P8"]
    assert "(aten::copy_)" in p8["message"] and "MmBackward0" in p8["message"], p8["message"]
    first = Queue.forward.__code__.co_firstlineno
    assert p8["src"] == f"{Path(__file__).name}:{first + 4}"  # the enqueue's line
    (graph,) = [e for e in events if e["kind"] == "graph"]
    node = next(t["node"] for t in p8["targets"] if "node" in t)
    assert next(n["name"] for n in graph["nodes"] if n["id"] == node) == "MmBackward0"
