"""P18: an actor-critic's policy loss weighs the actions' log-probabilities by an advantage that
still carries the critic's gradient.

``-(dist.log_prob(a) * (returns - value)).mean()`` with ``value`` attached trains the value head
through the policy loss too: its gradient there is ``log π(a|s)``, negative, so each step pushes
the value up whatever the returns say, on top of the critic's own regression.  The
policy-gradient estimator treats the advantage as a constant weight: ``(returns -
value).detach()``.  Found in the captured graph's dataflow: a ``mul`` whose one operand is the
log-probability of the taken actions (a ``log_softmax``, logits less their ``logsumexp`` as
``Categorical(logits=...)`` normalises them, or the log of ``Categorical(probs=...)``'s
probabilities, picked by ``gather``/``index``) and whose other operand is a difference of a
constant (the returns, or one time step's return) and a value head's output -- a layer of width
one -- that requires grad.

The same kind of mistake in Q-learning, a DQN's bootstrapped target left attached: a regression
loss (``mse_loss``, ``smooth_l1_loss``, ``huber_loss``, ``l1_loss``) of a Q-value picked from a
layer's output and of ``reward + gamma * max Q(s', .)`` still requiring grad, that maximum taken
over a layer's output in the same module (the network that gave Q(s, a)), through multiplies by
constants (``gamma``, ``1 - done``).  The loss then also pulls the next state's value toward
this one's; Q-learning's update treats the target as a constant (QA 49a: no finding).
"""

from __future__ import annotations

from typing import Any

from torchscope.schema import Finding

from ..finding import in_captured_graphs, make
from ..graph import made_by, op_inputs, ops, producers, target_of_op
from ..run import Run, as_dict, as_int, as_list, notes
from ..settings import Settings

_LOG_SOFTMAX = frozenset(("aten::_log_softmax", "aten::log_softmax"))
_SOFTMAX = frozenset(("aten::_softmax", "aten::softmax"))
_CLAMPS = frozenset(("aten::clamp", "aten::clamp_min", "aten::clamp_max"))
_LAYERS = frozenset(("aten::addmm", "aten::linear", "aten::mm", "aten::matmul"))
_SUBS = frozenset(("aten::sub", "aten::rsub"))
_REGRESSION = frozenset(f"aten::{n}" for n in ("mse_loss", "smooth_l1_loss", "huber_loss", "l1_loss"))
_MAXES = frozenset(("aten::max", "aten::amax"))

TD_FIX = ("Compute the target without gradient: with torch.no_grad(): target = reward + gamma * (1 - done) * "
          "target_net(next_state).max(1).values -- from a target network (a copy of the network, loaded from it "
          "every N steps) as DQN does, or from the network itself under no_grad().")

FIX = ("Detach the advantage in the policy loss: advantage = (returns - value).detach(); "
       "loss = -(dist.log_prob(action) * advantage).mean() + value_coef * (returns - value).pow(2).mean(). "
       "The critic learns from its own regression term only.")


class _Table:
    """The captured graph's tensors: requires_grad, and shapes."""

    def __init__(self, graph: dict[str, Any]) -> None:
        self.grad: dict[int, bool] = {}
        self.shape: dict[int, list[int]] = {}
        for t in as_list(graph.get("tensors")):
            if isinstance(t, dict):
                tid = as_int(t.get("id"), -1)
                if isinstance(t.get("requires_grad"), bool):
                    self.grad[tid] = t["requires_grad"]
                if isinstance(t.get("shape"), list):
                    self.shape[tid] = [as_int(n) for n in t["shape"]]


def _log_probs(tid: int, made: dict[int, dict[str, Any]]) -> bool:
    """Whether ``tid`` is (less) a log-softmax's entries: ``log_softmax``, ``x - logsumexp(x)``
    (``Categorical(logits=...)``), or the log of probabilities (``Categorical(probs=...)``, as
    PyTorch's own actor_critic.py example builds it: QA 49a, the finding was missed)."""
    op = made_by(tid, made)
    if op is not None and str(op.get("name")) == "aten::neg":  # ``-log_prob * advantage``
        op = made_by(op_inputs(op)[0], made) if op_inputs(op) else None
    if op is not None and str(op.get("name")) == "aten::exp":  # PPO's ratio, exp(log_prob - old_log_prob)
        op = made_by(op_inputs(op)[0], made) if op_inputs(op) else None
        if op is None or str(op.get("name")) != "aten::sub" or not op_inputs(op):
            return False
        return _log_probs(op_inputs(op)[0], made)
    if op is None:
        return False
    if str(op.get("name")) in _LOG_SOFTMAX:
        return True
    ins = op_inputs(op)
    if str(op.get("name")) == "aten::log" and ins:
        return _probabilities(ins[0], made)
    if str(op.get("name")) == "aten::sub" and len(ins) == 2:
        norm = made.get(ins[1])
        return norm is not None and str(norm.get("name")) == "aten::logsumexp"
    return False


def _probabilities(tid: int, made: dict[int, dict[str, Any]]) -> bool:
    """Whether ``tid`` is a probability vector: a softmax's, or one divided by its own sum (as
    ``Categorical(probs=...)`` normalises it), through the clamp away from 0 and 1 that
    ``torch.distributions`` puts before the log."""
    for _ in range(4):
        op = made_by(tid, made)
        name = str(op.get("name")) if op is not None else ""
        ins = op_inputs(op)
        if name in _SOFTMAX:
            return True
        if name in _CLAMPS and ins:
            tid = ins[0]
            continue
        if name == "aten::div" and len(ins) == 2:
            total = made.get(ins[1])
            return total is not None and str(total.get("name")) == "aten::sum" and op_inputs(total)[:1] == ins[:1]
        return False
    return False


def _unnormalised(tid: int, made: dict[int, dict[str, Any]]) -> int:
    """The advantage before its normalisation, ``(adv - adv.mean()) / (adv.std() + 1e-8)`` as
    A2C and PPO code does (QA 46a: the finding was missed behind it): through a division and a
    subtraction of the tensor's own mean."""
    for _ in range(3):
        op = made.get(tid)
        ins = op_inputs(op)
        name = str(op.get("name")) if op is not None else ""
        scaled = name == "aten::div" and bool(ins)
        centred = name in _SUBS and len(ins) == 2 and (mean := made.get(ins[1])) is not None \
            and str(mean.get("name")) == "aten::mean" and as_list(mean.get("inputs"))[:1] == [ins[0]]
        if not (scaled or centred):
            break
        tid = ins[0]
    return tid


def _attached_advantage(tid: int, made: dict[int, dict[str, Any]], table: _Table) -> dict[str, Any] | None:
    """The layer op of a value head (output width one) whose output, still requiring grad, is
    subtracted from a per-sample constant (the returns) to make ``tid`` (or ``tid`` before its
    normalisation); None otherwise."""
    tid = _unnormalised(tid, made)
    op = made.get(tid)
    if op is None or str(op.get("name")) not in _SUBS or not table.grad.get(tid, False):
        return None
    ins = op_inputs(op)
    carrying = [t for t in ins if table.grad.get(t, False)]
    constant = [t for t in ins if table.grad.get(t) is False]
    if len(carrying) != 1 or len(constant) != 1:
        return None  # both attached: no returns less a value
    # (a 0-d constant is one time step's return, ``R - value`` in a per-step loop as PyTorch's
    # actor_critic.py example writes it; ``1 - gate`` has no tensor operand, and its gate is no layer)
    head = made_by(carrying[0], made)
    if head is None or str(head.get("name")) not in _LAYERS:
        return None
    out = as_list(head.get("outputs"))
    shape = table.shape.get(as_int(out[0], -1), []) if out else []
    return head if shape and shape[-1] == 1 else None


def _layer(op: dict[str, Any] | None, table: _Table, wide: bool) -> dict[str, Any] | None:
    """``op`` when it is a layer op whose output is wider than one (``wide``: a Q-value per
    action) or exactly one wide (a value head); else None."""
    if op is None or str(op.get("name")) not in _LAYERS:
        return None
    out = as_list(op.get("outputs"))
    shape = table.shape.get(as_int(out[0], -1), []) if out else []
    return op if shape and (shape[-1] > 1 if wide else shape[-1] == 1) else None


def _attached_td_target(tid: int, made: dict[int, dict[str, Any]], table: _Table) -> dict[str, Any] | None:
    """The layer op of ``max Q(s', .)`` when ``tid`` is ``reward + gamma * max Q(s', .)`` (times
    constants such as ``1 - done``) still requiring grad; None otherwise."""
    op = made_by(tid, made)
    if op is None or str(op.get("name")) != "aten::add" or not table.grad.get(tid, True):
        return None
    ins = op_inputs(op)
    carrying = [t for t in ins if table.grad.get(t, False)]
    if len(carrying) != 1 or len(ins) - len(carrying) > 1:
        return None  # (the reward: one constant, or a number)
    tid = carrying[0]
    for _ in range(4):  # gamma, (1 - done), their order
        op = made_by(tid, made)
        ins = op_inputs(op)
        if op is None or str(op.get("name")) != "aten::mul":
            break
        carrying = [t for t in ins if table.grad.get(t, False)]
        if len(carrying) != 1:
            return None
        tid = carrying[0]
    if op is not None and str(op.get("name")) in _MAXES and ins:
        return _q_values(ins[0], made, table)
    # Q(s', a') picked by ``gather`` (a moved value): Double DQN's online argmax, SARSA's a'
    return _layer(op, table, wide=True)


def _q_values(tid: int, made: dict[int, dict[str, Any]], table: _Table) -> dict[str, Any] | None:
    """The wide layer op whose output ``tid`` is, or that a dueling head combines into it
    (``V + A - A.mean()``: an add or sub of layer outputs and their means); None otherwise."""
    op = made_by(tid, made)
    for _ in range(4):
        if op is None or str(op.get("name")) not in ("aten::add", "aten::sub", "aten::mean"):
            break
        ins = op_inputs(op)
        wide = [layer for t in ins if (layer := _layer(made_by(t, made), table, wide=True)) is not None]
        if wide:
            return wide[0]
        op = made_by(ins[0], made) if ins else None
    return _layer(op, table, wide=True)


def _cleared_first(run: Run, module: str, steps: list[int]) -> bool:
    """Whether what the policy loss sent the value head on ``steps`` never reached an update: the
    head's parameters are another optimizer's than the one whose step ends the step (the capture's
    ``co_trained``), and they held no gradient when the next step's first backward began -- that
    optimizer's zero_grad() came before its backward (a critic's own optimizer cleared it).  A
    critic whose backward comes first, its zero_grad() after its step, held the policy loss's
    gradient then and stepped it."""
    head = {i for i in range(len(run.params)) if run.param_module(i) == module}
    events = dict(run.step_events())
    told = [(step, {as_int(i, -1) for i in as_list(e.get("params"))}) for step, ev in sorted(events.items())
            for e in notes(ev, "co_trained")]
    checked = [step for step in steps if step + 1 in events]  # (the run's last step has no next to tell)
    for step in checked:
        # the set as told last at or before the step (the first one told for steps before it)
        co = next((c for at, c in reversed(told) if at <= step), told[0][1] if told else set())
        pre = as_dict(events[step + 1].get("grads")).get("pre_nonzero")
        if not head or not head <= co or not isinstance(pre, list) or head & {as_int(i, -1) for i in pre}:
            return False
    return bool(checked)


def _td_loss(op: dict[str, Any], made: dict[int, dict[str, Any]], table: _Table) -> dict[str, Any] | None:
    """The layer op of ``max Q(s', .)`` when ``op`` is a regression loss of a Q-value and an
    attached bootstrapped target computed by a layer of the same module; None otherwise."""
    ins = op_inputs(op)
    if len(ins) < 2:
        return None
    for q, target in ((ins[0], ins[1]), (ins[1], ins[0])):
        head = _attached_td_target(target, made, table)
        picked = _q_values(q, made, table) if head is not None else None
        if head is not None and picked is not None and picked.get("module") == head.get("module"):
            return head
    return None


def check(run: Run, settings: Settings) -> list[Finding]:
    found: dict[str, tuple[list[int], dict[str, Any], dict[str, Any], int]] = {}
    td: dict[str, tuple[list[int], dict[str, Any], dict[str, Any], int]] = {}
    for step, g in run.all_graphs():
        graph_ops = ops(g)
        made = producers(graph_ops)
        table = _Table(g)
        for op in graph_ops:
            name = str(op.get("name"))
            if name not in _REGRESSION and name != "aten::mul" or op.get("phase", "forward") != "forward":
                continue
            if op.get("grad_mode") is False:
                continue
            key = str(op.get("src") or "")
            if name in _REGRESSION:
                if (head := _td_loss(op, made, table)) is not None:
                    td.setdefault(key, ([], op, head, step))[0].append(step)
                continue
            ins = op_inputs(op)
            if len(ins) != 2:
                continue
            for logp, adv in ((ins[0], ins[1]), (ins[1], ins[0])):
                head = _attached_advantage(adv, made, table) if _log_probs(logp, made) else None
                if head is not None:
                    found.setdefault(key, ([], op, head, step))[0].append(step)
                    break
    findings: list[Finding] = [_td_finding(run, src, *entry) for src, entry in td.items()]
    for src, (steps, mul, head, first) in found.items():
        module = str(head.get("module") or "")
        kind = run.module_type(module)
        named = f"{module!r}" + (f" ({kind})" if kind else "") if module else "the value head"
        at = f" at {src}" if src else ""
        if module and _cleared_first(run, module, steps):
            message = (f"The policy loss{at} multiplies the taken actions' log-probabilities by an advantage that still "
                       f"requires grad (the value from {named} not detached), but the critic has an optimizer of its "
                       "own whose zero_grad() clears what the policy loss sends it before its backward: nothing of it "
                       f"reaches the critic's update ({in_captured_graphs(run, steps)}). The backward still computes it, and a loop reordered "
                       "later would apply it.")
            findings.append(make("P18", "info", message, FIX, steps, rank=run.rank,
                                 targets=[target_of_op(first, run.rank, mul), target_of_op(first, run.rank, head)],
                                 modules=[module], src=src or None, title="Advantage not detached, its gradient cleared"))
            continue
        message = (f"The policy loss{at} multiplies the taken actions' log-probabilities by an advantage that still "
                   f"requires grad: (returns - value) with the value from {named} not detached, so the policy "
                   "loss trains the critic too -- its gradient there is log π(a|s), pushing the value up whatever "
                   f"the returns are ({in_captured_graphs(run, steps)}).")
        findings.append(make("P18", "warning", message, FIX, steps, rank=run.rank,
                             targets=[target_of_op(first, run.rank, mul), target_of_op(first, run.rank, head)],
                             modules=[module] if module else [], src=src or None))
    return findings


def _td_finding(run: Run, src: str, steps: list[int], loss: dict[str, Any], head: dict[str, Any], first: int) -> Finding:
    module = str(head.get("module") or "")
    kind = run.module_type(module)
    named = f"{module!r}" + (f" ({kind})" if kind else "") if module else "the network"
    at = f" at {src}" if src else ""
    message = (f"The loss{at} regresses Q(s, a) onto a target, reward + gamma * max Q(s', .) from {named}, that still "
               "requires grad: computed with the network itself and neither under torch.no_grad() nor detached, so "
               "each update also pulls the next state's value toward this one's -- Q-learning treats the target as a "
               f"constant, and learning this way is slower and less stable ({in_captured_graphs(run, steps)}).")
    return make("P18", "warning", message, TD_FIX, steps, rank=run.rank,
                targets=[target_of_op(first, run.rank, loss), target_of_op(first, run.rank, head)],
                modules=[module] if module else [], src=src or None, title="TD target not detached")
