"""P15: gradient accumulation over k micro-batches without dividing the loss by k.

Two shapes of the same mistake: k backward() calls sum k gradients into ``.grad``, or one
backward() through a loss that adds up the losses of k slices of one batch (``x.chunk(k)``).
A mean over each micro-batch written by hand, ``loss_sum / micro_batch_size``, is the same
mistake: the capture records a loss node's ``reduction`` and a Div/Mul node's ``scalar``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from torchscope.schema import Finding, FindingTarget

from .. import graph as g
from ..finding import describe_steps, make
from ..run import Run, as_dict, as_float, as_int, as_list, notes
from ..settings import Settings
from ._grads import total_norm

# The loss handed to backward() ends in one of these when it was scaled (loss / k, loss * (1 / k)).
_SCALED_ROOTS = ("DivBackward", "MulBackward")
# a + b, a - b: a loss made of terms, each judged on its own (``ce / k + 0.01 * reg / k``)
_ADDED = ("AddBackward", "SubBackward")
_DEPTH = 16  # terms nest this deep at most before we stop reading (a loss is a short expression)

FIX = "Divide each micro-batch loss by the accumulation count before backward(): (loss / accum_steps).backward()."
MICRO_MEAN_FIX = ("Divide each micro-batch's summed loss by accum_steps * micro_batch_size ({k} * {b} = {n}), "
                  "the size of the whole batch, not by the micro-batch size: "
                  "(loss_sum / (accum_steps * micro_batch_size)).backward().")
MICRO_ELEMENTS_FIX = ("Divide each micro-batch's summed loss by accum_steps times its element count ({k} * {b} = {n}), "
                      "the whole batch's count, not the micro-batch's: "
                      "(loss_sum / (accum_steps * n_elements)).backward().")
CHUNK_FIX = ("Average the micro-batch losses instead of adding them: divide their sum by {k} "
             "(sum(losses) / {k}, or torch.stack(losses).mean()), or compute one loss over the whole batch.")

# How a term of the loss scales with the number of micro-batches it is accumulated over:
# "scaled" was divided or weighted (by k, we trust: its number is unknown, or not the micro-batch's size);
# "sum" adds up its samples: summed over micro-batches it is the whole batch's sum, the loss the
# learning rate was chosen for; "mean" averages its micro-batch (MeanBackward0, reduction='mean'),
# and so does "micro_mean", a sum divided by the micro-batch size by hand: k of either are k times
# the batch's mean; "unknown" tells no reduction (a hand-written loss): taken for a mean.
Scale = Literal["scaled", "sum", "mean", "micro_mean", "unknown"]
TOO_BIG: frozenset[Scale] = frozenset({"mean", "micro_mean", "unknown"})


class LossGraph:
    """One captured backward's autograd graph, read from its root as the loss it was called on."""

    def __init__(self, graph: dict[str, Any], scaled: bool = False) -> None:
        """``scaled``: the backward roots of its step were ``scaler.scale(loss)`` (a GradScaler's
        note): the loss is read past the scaler's multiply, whose factor is no division."""
        self.graph = graph
        self.root = as_int(graph.get("root"), -1)
        self.nodes = {as_int(n.get("id"), -1): n for n in as_list(graph.get("nodes")) if isinstance(n, dict)}
        self.names = {i: str(n.get("name", "")) for i, n in self.nodes.items()}
        self.children = g.node_children(graph)
        if scaled and self.names.get(self.root, "").startswith("MulBackward") and len(self._inputs(self.root)) == 1:
            self.root = self._inputs(self.root)[0]
        self.ops = {as_int(op.get("id"), -1): op for op in g.ops(graph)}
        self.node_ops = {i: as_int(n.get("op"), -1) for i, n in self.nodes.items() if "op" in n}
        self.tensors = {as_int(t.get("id"), -1): t for t in as_list(graph.get("tensors")) if isinstance(t, dict)}
        self.writers = g.producers(list(self.ops.values()))
        self.forwards: dict[int, list[dict[str, Any]]] = {}  # micro -> its ops inside the model, in order
        for op in self.ops.values():
            if op.get("phase") == "forward" and "outside_model" not in g.flags(op):
                self.forwards.setdefault(as_int(op.get("micro"), -1), []).append(op)

    def per_task(self) -> bool:
        """Whether each micro-batch's forward ran through modules of its own beside the ones all
        of them share, every module used by one micro-batch or by all: a multi-task loop's one
        backward() per task head (``mse_loss(model(x, k), y_k).backward()`` for each k), a sum of
        objectives -- nothing to divide (QA 48a: "each optimizer step is 3x larger")."""
        used = [frozenset(str(op.get("module", "")) for op in ops) for m, ops in self.forwards.items() if m >= 0]
        if len(used) < 2:
            return False
        shared = frozenset.intersection(*used)
        own = [u - shared for u in used]
        return all(own) and all(a.isdisjoint(b) for i, a in enumerate(own) for b in own[i + 1:])

    def _inputs(self, node: int) -> list[int]:
        return [c for c in self.children.get(node, []) if self.names.get(c, "") not in ("", "AccumulateGrad")]

    def _stacked(self, node: int) -> list[int]:
        """The losses of ``torch.stack(losses)`` when ``node`` reduces such a stack (.sum(), .mean()), else []."""
        inputs = self._inputs(node)
        if len(inputs) == 1 and self.names.get(inputs[0], "").startswith("StackBackward"):
            return self._inputs(inputs[0])
        return []

    def terms(self, node: int, depth: int = 0) -> list[int]:
        """The losses ``node`` adds up: the terms of ``a + b`` or of ``torch.stack(losses).sum()``,
        else ``node`` itself."""
        name = self.names.get(node, "")
        parts = self._inputs(node) if name.startswith(_ADDED) else \
            self._stacked(node) if name.startswith("SumBackward") else []
        if not parts or depth > _DEPTH:
            return [node]
        return [t for p in parts for t in self.terms(p, depth + 1)]

    def scale(self, node: int, k: int = 0, depth: int = 0) -> Scale:
        """How the loss term ``node`` scales with the number ``k`` of micro-batches it is
        accumulated over (0: not known)."""
        name = self.names.get(node, "")
        if name.startswith(_SCALED_ROOTS):
            if self.micro_mean_dims(node):
                return "micro_mean"
            weighted = self._weighted(node, k)
            if weighted is not None and depth < _DEPTH:
                return self.scale(weighted, k, depth + 1)
            return "scaled"
        if name.startswith("MeanBackward") and self._stacked(node):
            return "scaled"  # averaged over the losses it stacks
        return self._reduction(node)

    def _weighted(self, node: int, k: int) -> int | None:
        """The term a Div/Mul ``node`` weights when its recorded number is a weight and not a
        division by ``k`` (the factor times k above 2: label smoothing's 1 - e, ``2.0 * loss``),
        else None: an unknown factor, or one about 1 / k, is the division (trusted)."""
        number = as_float(self.nodes.get(node, {}).get("scalar"))
        inputs = self._inputs(node)
        if k < 2 or not number or len(inputs) != 1:
            return None
        factor = 1 / number if self.names.get(node, "").startswith("DivBackward") else number
        return inputs[0] if abs(factor) * k > 2 else None

    def _reduction(self, node: int) -> Scale:
        """How the loss ``node`` reduces over its samples."""
        name = self.names.get(node, "")
        if name.startswith("SumBackward"):
            return "sum"  # crit(out, y).sum() of reduction='none'
        if name.startswith("MeanBackward"):
            return "mean"
        reduction = self.nodes.get(node, {}).get("reduction")  # a loss function's node (MseLossBackward0...)
        return "sum" if reduction == "sum" else "mean" if reduction == "mean" else "unknown"

    def _sum_divided_by(self, node: int) -> float | None:
        """d when ``node`` is a sum over samples times numbers whose product is 1 / d
        (``loss_sum / d``, ``loss_sum * (1 / d)``, ``loss_sum / d1 / d2``), else None."""
        factor = 1.0
        for _ in range(_DEPTH):
            name = self.names.get(node, "")
            if not name.startswith(_SCALED_ROOTS):
                break
            number = as_float(self.nodes.get(node, {}).get("scalar"))
            inputs = self._inputs(node)
            if not number or len(inputs) != 1:
                return None  # scaled by a tensor, or a number the capture did not record
            factor = factor / number if name.startswith("DivBackward") else factor * number
            node = inputs[0]
        return 1 / factor if factor and self._reduction(node) == "sum" else None

    def micro_mean_dims(self, node: int) -> tuple[int, ...]:
        """The leading dimensions of the micro-batch's data when ``node`` is a sum over one
        micro-batch divided by their product -- its size (``loss_sum / b``) or its elements
        (``loss_sum / (b * t)``, a language model's tokens): a mean over the micro-batch by
        hand; else ()."""
        divisor = self._sum_divided_by(node)
        micro = self.forward_of(node) if divisor else None
        shape = self.data_shape(micro) if micro is not None else []
        for n in range(1, len(shape) + 1):
            if divisor and math.isclose(divisor, math.prod(shape[:n])):
                return tuple(shape[:n])
        return ()

    def data_shape(self, micro: int) -> list[int]:
        """The shape of the first data the forward ``micro`` read ([] when none)."""
        for op in self.forwards.get(micro, []):
            for tid in (as_int(t, -1) for t in as_list(op.get("inputs"))):
                if _handed_over(self.tensors, self.writers, tid):
                    return [as_int(d) for d in as_list(as_dict(self.tensors.get(tid)).get("shape"))]
        return []

    def mean_terms(self, k: int = 0) -> list[int]:
        """The terms of the loss that are means left unscaled: ``k`` of them sum to k times one."""
        terms = self.terms(self.root)
        return [t for t in self._averaged(terms, k) or terms if self.scale(t, k) in TOO_BIG]

    def _averaged(self, terms: list[int], k: int) -> list[int]:
        """The losses that ``terms`` weight by numbers summing to 1 (``a * kd + (1 - a) * ce``, a
        distillation loss): a weighted average, whose weights are no division by ``k`` -- unless
        there are as many terms as micro-batches (``kd / 2 + ce / 2`` at k=2 reads the same);
        else []."""
        if k < 2 or len(terms) < 2 or len(terms) == k:
            return []
        weights: list[float] = []
        inner: list[int] = []
        for t in terms:
            number = as_float(self.nodes.get(t, {}).get("scalar"))
            inputs = self._inputs(t)
            if not self.names.get(t, "").startswith(_SCALED_ROOTS) or not number or len(inputs) != 1:
                return []
            weights.append(1 / number if self.names.get(t, "").startswith("DivBackward") else number)
            inner.append(inputs[0])
        return inner if math.isclose(sum(weights), 1.0, rel_tol=0.02) else []

    def forwards_read(self, term: int) -> set[int]:
        """The forwards (micro indices) whose outputs the loss ``term``'s ops read, through the ops
        outside the model that lead to them -- ``.detach()`` too, which leaves no graph edge."""
        op = self.ops.get(self.node_ops.get(term, -1))
        pending = [as_int(t, -1) for t in as_list(op.get("inputs"))] if op is not None else []
        seen: set[int] = set()
        micros: set[int] = set()
        while pending and len(seen) < 256:
            tid = pending.pop()
            writer = self.writers.get(tid)
            if tid in seen or writer is None:
                continue
            seen.add(tid)
            if "outside_model" in g.flags(writer):
                pending += [as_int(t, -1) for t in as_list(writer.get("inputs"))]
            elif writer.get("phase") == "forward":
                micros.add(as_int(writer.get("micro"), -1))
        return micros

    def forward_of(self, term: int) -> int | None:
        """The forward (its micro index) whose graph the loss ``term`` backpropagates through, when it is one."""
        ops = (self.ops.get(self.node_ops.get(n, -1)) for n in g.descendants(self.children, term))
        micros = {as_int(op.get("micro"), -1) for op in ops if op is not None and "outside_model" not in g.flags(op)}
        return micros.pop() if len(micros) == 1 else None


def _contiguous(shape: list[int], stride: list[int]) -> bool:
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride), strict=False):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


def _is_data(meta: dict[str, Any]) -> bool:
    """A tensor the loop handed over: no parameter, no grad (an input batch, a target, a buffer)."""
    return bool(meta) and not meta.get("requires_grad") and "param" not in meta


def _handed_over(meta: dict[int, dict[str, Any]], writers: dict[int, dict[str, Any]], tid: int) -> bool:
    """Data the loop handed to the forward: no activation nor parameter, read directly or through
    ops outside the model (``x[i * b:(i + 1) * b]``, ``xc.float() / 255``)."""
    writer = writers.get(tid)
    return _is_data(as_dict(meta.get(tid))) and not (writer and "outside_model" not in g.flags(writer))


def _block(meta: dict[str, Any]) -> tuple[int, int, int] | None:
    """(storage, offset, numel) of a tensor that is one contiguous block of its storage, else None."""
    shape = [as_int(s) for s in as_list(meta.get("shape"))]
    if not shape or not _contiguous(shape, [as_int(s) for s in as_list(meta.get("stride"))]):
        return None
    numel = 1
    for size in shape:
        numel *= size
    return as_int(meta.get("storage"), -1), as_int(meta.get("offset")), numel


def _batch_blocks(meta: dict[int, dict[str, Any]], writers: dict[int, dict[str, Any]],
                  forward_ops: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """storage -> (offset, numel) of the smallest block of it that a forward (its ops in the model)
    read as data, directly or through ops outside the model (``x[i * b:(i + 1) * b]``, ``xc.float() / 255``)."""
    pending = [as_int(t, -1) for op in forward_ops for t in as_list(op.get("inputs"))]
    seen: set[int] = set()
    blocks: dict[int, tuple[int, int]] = {}
    while pending:
        tid = pending.pop()
        if tid in seen or not _handed_over(meta, writers, tid):
            continue
        seen.add(tid)
        block = _block(as_dict(meta.get(tid)))
        if block and (block[0] not in blocks or block[2] < blocks[block[0]][1]):
            blocks[block[0]] = block[1:]  # the slice, not the batch it was sliced from
        if tid in writers:
            pending += [as_int(t, -1) for t in as_list(writers[tid].get("inputs"))]
    return blocks


def _slices_of_one_batch(blocks: dict[int, dict[int, tuple[int, int]]]) -> int:
    """How many forwards each read their own, disjoint block of one tensor (x.chunk(k), x[i * b:(i + 1) * b])."""
    by_storage: dict[int, list[tuple[int, int]]] = {}
    for found in blocks.values():
        for storage, block in found.items():
            by_storage.setdefault(storage, []).append(block)
    best = 0
    for ranges in by_storage.values():
        ranges.sort()
        # a buffer every forward reads whole overlaps itself: not a slicing of the batch
        if all(a[0] + a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False)):
            best = max(best, len(ranges))
    return best


def chunked_terms(lg: LossGraph) -> int:
    """k when the loss of this backward adds up k unscaled mean losses, each of its own forward,
    over slices of one batch; else 0."""
    means = lg.mean_terms()
    of = {t: lg.forward_of(t) for t in means} if len(means) >= 2 else {}
    forwards = {f for f in of.values() if f is not None}
    if len(forwards) < 2:
        return 0
    # micro-batches are one loss of one model output each: not two different losses (a
    # multi-task sum, CE + MSE), not two heads, not terms that read another forward's output
    # (SimSiam's D(p1, z2.detach()) + D(p2, z1.detach()): two views, one loss)
    if len({lg.names.get(t, "") for t, f in of.items() if f is not None}) > 1:
        return 0
    if len({str(ops[-1].get("module", "")) for m in forwards if (ops := lg.forwards.get(m))}) > 1:
        return 0
    if any(f is not None and lg.forwards_read(t) - {f} for t, f in of.items()):
        return 0
    slices = _slices_of_one_batch({m: _batch_blocks(lg.tensors, lg.writers, lg.forwards.get(m, []))
                                   for m in forwards})
    # the ops before the step's first forward are not recorded: the first slice's preprocessing
    # (xc.to(device)) can hide that it was one; every other forward must show its slice
    return len(forwards) if slices >= max(2, len(forwards) - 1) else 0


@dataclass(frozen=True)
class Judgement:
    """What a step's loss says about its scale: the scales of its terms that k micro-batches
    sum to k times one (none: scaled right) and, for a hand-made micro-batch mean, the dimensions it divided by."""

    too_big: frozenset[Scale] = frozenset()
    micro_dims: tuple[int, ...] = ()  # the micro-batch's dimensions a summed loss was divided by ("micro_mean")
    target: FindingTarget = field(default_factory=FindingTarget)  # the captured loss that showed it


def judge(lg: LossGraph, step: int, rank: int, k: int = 0) -> Judgement:
    """The scale of the loss backward() was called on, from its captured graph, in a step of
    ``k`` micro-batches."""
    if lg.per_task():
        return Judgement(target=FindingTarget(step=step, rank=rank, node=lg.root))
    terms = lg.mean_terms(k)
    scales = frozenset(lg.scale(t, k) for t in terms)
    dims = next((d for d in (lg.micro_mean_dims(t) for t in terms) if d), ())
    return Judgement(scales, dims, FindingTarget(step=step, rank=rank, node=lg.root))


def _judge_roots(roots: list[str]) -> Judgement:
    """Without a captured graph: the backward() roots' names alone (a Div/Mul, or a sum reduction)."""
    if any(r.startswith((*_SCALED_ROOTS, "SumBackward")) for r in roots):
        return Judgement()
    # a loss function's node name does not tell its reduction
    return Judgement(frozenset({"mean" if all(r.startswith("MeanBackward") for r in roots) else "unknown"}))


def _judged_signatures(run: Run) -> tuple[dict[object, Judgement], dict[object, tuple[int, int, int]]]:
    """From the captured graphs, per graph signature (the steps between captures share their
    step's structure): the scale of the loss (scaled right when any capture shows it so), and,
    for a loss adding up the slices of one batch, (k, step, root node) of the capture that showed it."""
    judged: dict[object, Judgement] = {}
    chunked: dict[object, tuple[int, int, int]] = {}
    for step, ev in run.step_events():
        sig = ev.get("graph_signature")
        for graph in run.graphs_of(step) if sig else []:
            if "root" not in graph or as_int(graph.get("micro"), -1) in _grad_passes(ev):
                continue
            lg = LossGraph(graph, scaled=bool(notes(ev, "scaled_roots")))
            verdict = judge(lg, step, run.rank, _micro_batches(ev))
            if sig not in judged or not verdict.too_big:
                judged[sig] = verdict
            if not verdict.too_big and isinstance(sig, str):
                # each micro-batch's structure ("a+b+c"): scaled right here, it is in any order
                # (variable-length batches combine their structures anew from step to step)
                for part in sig.split("+"):
                    judged.setdefault(("part", part), verdict)
            k = chunked_terms(lg)
            if k >= 2 and sig not in chunked:
                chunked[sig] = (k, step, lg.root)
    return judged, chunked


def _micro_batches(ev: dict[str, Any]) -> int:
    """The backward passes of this step summed into .grad, each over its own forward."""
    # A backward that raised (P8/P10) accumulated nothing, nor does torch.autograd.grad
    # (it returns the gradients): don't count either as a micro-batch.
    grad_calls = notes(ev, "autograd_grad")
    k = as_int(ev.get("micro_batches")) - len(as_list(ev.get("backward_errors"))) - len(grad_calls)
    if isinstance(ev.get("accumulated"), int):
        # the passes summed into .grad since it was last reset: an optimizer that zeroes
        # the gradients before each of its own backward passes (LBFGS) accumulates nothing
        k = as_int(ev.get("accumulated"))
    consumed = sum(1 for f in as_list(ev.get("forwards")) if as_dict(f).get("backward"))
    if consumed:
        # micro-batches are forwards: several losses backpropagated through one forward
        # (multi-task, loss1.backward(retain_graph=True); loss2.backward()) are one batch
        k = min(k, consumed)
    return k


class Accumulated(NamedTuple):
    """A step whose k > 1 backward() calls summed losses too big into .grad."""

    step: int
    ev: dict[str, Any]
    k: int
    judgement: Judgement


def _accumulated(run: Run, judged: dict[object, Judgement]) -> list[Accumulated]:
    out: list[Accumulated] = []
    for step, ev in run.step_events():
        k = _micro_batches(ev)
        roots = _unscaled_roots(ev)
        if k <= 1 or not roots:
            continue
        if notes(ev, "foreign_step"):
            continue  # optimizer.step() calls of other parameters between them: no accumulation (P5)
        if _distinct_objectives(ev, roots):
            continue
        if (max((as_int(e.get("passes")) for e in notes(ev, "closure")), default=0) >= k
                and as_int(ev.get("zero_grad")) < 2):
            # every summed pass ran inside optimizer.step(closure) with no reset between them:
            # the closure evaluated again and again on one batch (LBFGS's line search), not k
            # micro-batches -- dividing the loss is no fix; without zero_grad() in the closure
            # they pile up (P5 says so).  A closure that resets the gradients itself and sums k
            # passes between resets accumulates k micro-batches per evaluation: judged (QA 37a).
            # Lightning's accumulation runs only the last micro-batch in the closure: judged too.
            continue
        judgement = judged.get(ev.get("graph_signature")) or _by_parts(judged, ev.get("graph_signature")) or _judge_roots(roots)
        if judgement.too_big:
            out.append(Accumulated(step, ev, k, judgement))
    return out


def _distinct_objectives(ev: dict[str, Any], roots: list[str]) -> bool:
    """Each backward() of the step a line of its own: a sum of objectives backpropagated one by
    one (a domain-adaptation step's ``ce.backward()`` and ``(0.1 * entropy).backward()``, to free
    each graph early; DCGAN's ``errD_real.backward()`` and ``errD_fake.backward()``, one loss
    function on real and on generated images, whose sum is the discriminator's loss: QA 49a),
    which is ``(a + b).backward()`` -- nothing to divide.  Micro-batches come from one line in
    a loop."""
    src = _backward_srcs(ev)
    return len(src) == len(roots) >= 2 and len(set(src)) == len(src)


def _grad_passes(ev: dict[str, Any]) -> set[int]:
    """The step's passes that were ``torch.autograd.grad`` calls: they return their gradients and
    add nothing to ``.grad`` (a first-order MAML inner step's), so no root, line or graph of theirs
    is a micro-batch's (QA 50a: "not divided by 3" at the inner step's line, the loss divided)."""
    return {as_int(e.get("micro"), -1) for e in notes(ev, "autograd_grad")}


def _backward_srcs(ev: dict[str, Any]) -> list[str]:
    """The line of each backward() pass of the step (not the ``autograd.grad`` ones)."""
    skip = _grad_passes(ev)
    return [str(x) for i, x in enumerate(as_list(ev.get("backward_src"))) if i not in skip]


def _unscaled_roots(ev: dict[str, Any]) -> list[str]:
    """The grad_fn class of each backward() root of the step, a GradScaler's ``scaler.scale(loss)``
    read as its ``loss``; [] when a scaler scaled a root the capture did not say of what: its own
    multiply hides whether the loss was divided, so that is not guessed."""
    roots = [str(r) for r in as_list(ev.get("backward_roots"))]
    made_from = {as_int(i, -1): str(name) for note in notes(ev, "scaled_roots")
                 for i, name in zip(as_list(note.get("roots")), as_list(note.get("made_from")), strict=False)}
    if as_dict(ev.get("scaler")) and any(r.startswith("MulBackward") and i not in made_from for i, r in enumerate(roots)):
        return []
    skip = _grad_passes(ev)
    return [made_from.get(i, r) for i, r in enumerate(roots) if i not in skip]


def _by_parts(judged: dict[object, Judgement], sig: object) -> Judgement | None:
    """A step never captured whole whose every micro-batch structure a capture showed scaled right."""
    if not isinstance(sig, str) or "+" not in sig:
        return None
    parts = [judged.get(("part", p)) for p in sig.split("+")]
    return parts[0] if all(v is not None for v in parts) else None


# optimizers that divide each step by a running scale of the gradients: k times the gradients
# make about the same step (up to eps)
_ADAPTIVE = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "SparseAdam", "RMSprop", "Adagrad", "Adadelta",
             "Adafactor", "Lamb", "LAMB", "Lion")


def _consequence(run: Run, hits: list[Accumulated], k: int) -> tuple[str, Literal["warning", "info"]]:
    """What k times the gradients does to training, by the watched optimizer: an SGD step is k
    times larger; an adaptive optimizer's is about the same, but a clipping threshold is
    not: clipping k times the gradients at max_norm is clipping them at max_norm / k."""
    opt = run.optimizer_at(hits[0].step)
    clip = next((as_dict(as_dict(h.ev.get("grads")).get("clip")) for h in hits
                 if as_dict(as_dict(h.ev.get("grads")).get("clip"))), {})
    if opt not in _ADAPTIVE:
        return _sgd_consequence(clip, k), "warning"
    grads = f"the gradients are {k}x those of the mean loss. {opt} divides each step by the gradients' running scale, " \
            "so its steps barely change"
    if clip:
        max_norm = as_float(clip.get("max_norm"))
        lower = f"max_norm={max_norm / k:g}, not {max_norm:g}" if max_norm is not None else f"max_norm {k}x lower"
        return (f"{grads}, but clip_grad_norm_ sees norms {k}x too large: it clips as if {lower}."), "warning"
    return (f"{grads}; gradient norms read {k}x too large, and clipping them would act as if max_norm were {k}x lower."), \
        "info"


def _sgd_consequence(clip: dict[str, Any], k: int) -> str:
    """An SGD step k times too large -- unless clip_grad_norm_ caps it (QA 37a: "4x larger" of a
    loop clipping a norm of 2.36 at 1, whose steps were 1.7x): the size clipping leaves it,
    from the first clipped step's norm before clipping."""
    before, max_norm = as_float(clip.get("norm")), as_float(clip.get("max_norm"))
    if before is None or max_norm is None or not before > max_norm > 0:
        return f"each optimizer step is {k}x larger than intended."
    meant = before / k  # the norm of the mean loss's gradients
    if meant >= max_norm:
        return (f"the gradients are {k}x those of the mean loss, but clip_grad_norm_(max_norm={max_norm:g}) scales "
                f"both to the same norm, so the steps are as intended while the gradients stay this large; "
                f"clipping acts as if max_norm were {k}x lower.")
    return (f"clip_grad_norm_(max_norm={max_norm:g}) caps the summed gradients (norm {before:.3g}), so each "
            f"optimizer step is {max_norm / meant:.1f}x larger than intended, not {k}x.")


def _warning(run: Run, hits: list[Accumulated], message: str, fix: str, target: FindingTarget,
             data: dict[str, Any]) -> Finding:
    """The P15 finding on ``hits``: where (the first backward() call), the accumulation count and
    the gradient norm of every step; what it does, by optimizer, ends the message."""
    src = next((s for h in hits for s in _backward_srcs(h.ev)[:1]), None)
    consequence, severity = _consequence(run, hits, max(h.k for h in hits))
    return make("P15", severity, message.replace("{consequence}", consequence), fix, [h.step for h in hits], rank=run.rank, targets=[target], src=src,
                view="gradients", data={"micro_batches": [h.k for h in hits], **data,
                                        "norm": [total_norm(ev) for _, ev in run.step_events()]})


def _not_divided(run: Run, hits: list[Accumulated]) -> list[Finding]:
    """k micro-batch means summed into .grad: the loss was not divided by k."""
    if not hits:
        return []
    k = max(h.k for h in hits)
    message = (f"Gradients of {k} micro-batches were summed without dividing the loss by {k} "
               f"({describe_steps([h.step for h in hits], run.last_step)}): "
               "{consequence}")
    if any("unknown" in h.judgement.too_big for h in hits):
        # no loss node recorded its reduction (a hand-written loss): a mean is assumed
        message += " (Intended only if the loss function uses reduction='sum' and the learning rate was chosen for that sum.)"
    roots = sorted({str(r) for h in hits for r in as_list(h.ev.get("backward_roots"))})
    return [_warning(run, hits, message, FIX, FindingTarget(step=hits[0].step, rank=run.rank),
                     {"backward_roots": roots})]


def _divided_by_micro_batch(run: Run, hits: list[Accumulated]) -> list[Finding]:
    """k micro-batch losses, each a sum divided by the micro-batch size: k micro-batch means."""
    if not hits:
        return []
    k = max(h.k for h in hits)
    shown = next(h.judgement for h in hits if h.judgement.micro_dims)
    dims = shown.micro_dims
    b = math.prod(dims)
    by = (f"the micro-batch size ({b})" if len(dims) == 1
          else f"the {b} elements of its {'x'.join(map(str, dims))} micro-batch")
    message = (f"Each of the {k} micro-batch losses summed into .grad "
               f"({describe_steps([h.step for h in hits], run.last_step)}) is a sum divided by {by}, a mean "
               f"over its micro-batch: their gradients add up to {k}x the gradient of the batch's mean loss: "
               f"{{consequence}}")
    fix = MICRO_MEAN_FIX if len(dims) == 1 else MICRO_ELEMENTS_FIX
    return [_warning(run, hits, message, fix.format(k=k, b=b, n=k * b), shown.target,
                     {"micro_batch_size": dims[0], "divided_by": b})]


def _check_backwards(run: Run, judged: dict[object, Judgement]) -> list[Finding]:
    """k backward() calls of micro-batch means summed into .grad before one step()."""
    hits = _accumulated(run, judged)
    # a sum divided by the micro-batch size alone (a mean beside it, a distillation's
    # batchmean KL beside its cross-entropy: the plain "not divided")
    by_hand = [h.judgement.too_big == {"micro_mean"} for h in hits]
    return [*_not_divided(run, [h for h, m in zip(hits, by_hand, strict=True) if not m]),
            *_divided_by_micro_batch(run, [h for h, m in zip(hits, by_hand, strict=True) if m])]


def _check_chunks(run: Run, chunked: dict[object, tuple[int, int, int]]) -> list[Finding]:
    """One backward() through the unscaled sum of the losses of k slices of one batch."""
    hits = [(step, ev) for step, ev in run.step_events()
            if ev.get("graph_signature") in chunked and (not as_dict(ev.get("scaler")) or notes(ev, "scaled_roots"))]
    if not hits:
        return []
    steps = [step for step, _ in hits]
    k, captured, root = chunked[hits[0][1].get("graph_signature")]
    message = (f"The losses of {k} micro-batches, slices of one input batch (as torch.chunk or split makes), "
               f"were added into one loss before backward() ({describe_steps(steps, run.last_step)}): "
               f"its gradient is the sum of {k} micro-batch means, {k}x the gradient of the batch's mean loss, "
               "so {consequence}")
    accumulated = [Accumulated(step, ev, chunked[ev.get("graph_signature")][0], Judgement()) for step, ev in hits]
    return [_warning(run, accumulated, message, CHUNK_FIX.format(k=k),
                     FindingTarget(step=captured, rank=run.rank, node=root), {})]


def check(run: Run, settings: Settings) -> list[Finding]:
    judged, chunked = _judged_signatures(run)
    # Opacus's optimizer makes the update from the per-sample gradients it sums over the
    # backward passes itself, divided by the samples it expects (times the passes): what the
    # losses were divided by does not scale it
    passes = [] if run.session.get("per_sample_grads") else _check_backwards(run, judged)
    return [*passes, *_check_chunks(run, chunked)]
