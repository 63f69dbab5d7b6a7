"""The one torch-function mode the capture keeps on the stack while it watches.

It sees the few torch-level calls whose facts only exist at that level, and passes every
other call straight through (one dict lookup):

- ``Tensor.backward`` / ``torch.autograd.backward``: the step's backward roots, losses and
  call sites; the call runs unchanged inside ``try``: an exception is recorded (P8, P10)
  and then re-raised to the user exactly as it was.
- ``torch.autograd.grad(..., create_graph=True)``: the nodes that pass builds are marked
  higher-order (gradient penalties, meta-learning).
- ``Tensor.to`` / ``.cuda`` / ``.cpu`` / ``.float()``...: a call that returns its input was a
  no-op (P12); one that changes device is a copy, with its bytes; a conversion of a storage
  already converted in an earlier step is a repeat, one that undoes a conversion of the same
  step a round trip.
- ``.item()`` / ``.tolist()`` / ``.numpy()`` / ``detach()`` / ``.data`` / ``torch.tensor(t)`` /
  ``x.new_tensor(t)`` on a tensor that requires grad: where a graph is cut (P1), noted on
  captured steps.
- ``torch.isfinite`` / ``isnan`` / ``isinf`` of a one-value tensor in the graph: the loss a
  loop checks before it decides to skip the batch, read back if no backward follows.
- While a loss of an earlier step is found kept alive (P7), every call of the user's that
  takes a one-value tensor with a graph into a new one (``total += loss``): its line.
- ``add_`` / ``mul_`` / ``lerp_`` / ``copy_`` / ``+=`` and their ``_foreach`` forms, outside the
  forward while autograd records, on a tensor that had no graph: a copy of the weights (an
  EMA, a target network) updated from a parameter without ``no_grad`` now holds a graph to the
  model's parameters that every update extends (P7).  Their out-of-place forms (``+``, ``*``,
  ``lerp``...) between optimizer.step() and the next forward: the same, rebuilt each step.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from ._ops import OpRecorder, autocast_on
from ._srcloc import _is_internal, in_package, unlink_own_frames

if TYPE_CHECKING:
    from ._watch import Watch

_T = torch.Tensor
_BACKWARD = {_T.backward: "tensor", torch.autograd.backward: "autograd"}
_MOVES = {
    _T.to: "to",
    _T.cuda: "cuda",
    _T.cpu: "cpu",
    _T.float: "float",
    _T.double: "double",
    _T.half: "half",
    _T.bfloat16: "bfloat16",
    _T.type: "type",
    # same device and dtype: only the same tensor copied again step after step is P12's
    _T.clone: "clone",
    torch.tensor: "copy",
    torch.as_tensor: "copy",  # (of a tensor, or of a numpy array: _on_array_copy)
}
SAME_PLACE_COPIES = frozenset({_T.clone, torch.tensor})
_BREAKS = {
    _T.item: "torch::Tensor.item",
    _T.tolist: "torch::Tensor.tolist",
    _T.numpy: "torch::Tensor.numpy",
    _T.detach: "torch::Tensor.detach",
    _T.__array__: "torch::Tensor.__array__",
}
# copy constructors: of a tensor that requires grad, a copy without its graph (a cut, P1)
_COPY_CUTS = {torch.tensor: "torch::tensor", _T.new_tensor: "torch::Tensor.new_tensor"}
_DATA_GET = _T.data.__get__  # type: ignore[attr-defined]
# in-place updates a copy of the weights is made with (P7 when autograd records them)
_UPDATES = (_T.add_, _T.sub_, _T.mul_, _T.lerp_, _T.copy_, _T.addcmul_, _T.__iadd__, _T.__isub__,
            torch._foreach_add_, torch._foreach_mul_, torch._foreach_lerp_, torch._foreach_copy_)
# ... and the out-of-place arithmetic of one (``shadow = 0.99 * shadow + 0.01 * p``): looked at
# only between optimizer.step() and the next forward on the steps the mode watches
_ARITH = (_T.__add__, _T.__radd__, _T.__sub__, _T.__rsub__, _T.__mul__, _T.__rmul__, _T.add, _T.sub, _T.mul,
          _T.lerp, torch.add, torch.sub, torch.mul, torch.lerp, torch._foreach_add, torch._foreach_mul,
          torch._foreach_lerp)
# Gradient clipping calls one of these from torch/nn/utils/clip_grad.py (P14): clip_grad_norm_
# takes the norm, clip_grad_value_ clamps (foreach, or each gradient)
# (torch.clamp: _clip_grads_with_norm_'s coefficient, where a total taken apart -- accelerate's
# get_total_norm, then clip_grads_with_norm_ -- meets the max_norm)
_CLIP_NORMS = {torch._foreach_norm, torch.linalg.vector_norm, torch._foreach_clamp_min_, _T.clamp_, torch.clamp}
_CLIP_FILE = "clip_grad.py"
_VECTOR_NORM = torch.linalg.vector_norm
_SCALER_FILE = "grad_scaler.py"
_compiling = torch.compiler.is_compiling
# A loop that skips a batch checks its loss first (``if not torch.isfinite(loss): continue``):
# the tensor checked is the loss, recorded if no backward follows (P4, P6)
_CHECKS = (torch.isfinite, torch.isnan, torch.isinf, _T.isfinite, _T.isnan, _T.isinf)
# ``Tensor.grad = ...``'s setter: a method-wrapper, equal (and hashed alike) each time it is taken
_GRAD_SET: Any = vars(torch._C.TensorBase)["grad"].__set__
_HANDLED: dict[Any, str] = {
    **_BACKWARD,
    **_MOVES,
    **dict.fromkeys(_BREAKS, "break"),
    **dict.fromkeys(_CHECKS, "check"),
    torch._amp_update_scale_: "scale",  # GradScaler.update(): after a step it skipped, the gradients are read here
    torch.autograd.grad: "grad",  # only its create_graph=True form matters (higher-order nodes)
    # looked up with the rest: every other call (the loss, optimizer.step()'s record_function)
    # passes through after one lookup, not three
    **dict.fromkeys(_CLIP_NORMS, "clip"),
    **dict.fromkeys(_UPDATES, "update"),
    **dict.fromkeys(_ARITH, "arith"),
    _T.new_tensor: "new_tensor",
    _GRAD_SET: "grad_set",
    _T.zero_: "grad_zero",
    torch._foreach_zero_: "grad_zero",
    _DATA_GET: "data",
}


IDLE_EVERY = 4096  # torch calls through the mode between looks at whether its loop stopped (Watch._idle)


class Interposer(TorchFunctionMode):
    def __init__(self, watch: Watch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        kind = _HANDLED.get(func)
        watch = self.watch
        # (a mode left on by a loop that stopped: see Watch._idle); not while Dynamo traces
        # this handler: a counter it saw change would be a guard failing at every call
        if not _compiling():
            watch._calls += 1
            if not watch._calls % IDLE_EVERY:
                watch._safe("mode", watch._idle)
            if watch._clip_open and not _in_clipping():
                # the clipping returned: full mode recorded its ops (_record_clip), not the loop's
                # next ones -- a hand-written update, scaler.step()'s .item() (QA 46e)
                watch._safe("ops", watch._end_clip)
        if self.watch._capturing_ops:  # inline: every torch-level call of a recorded pass
            rec = self.watch._s.recorder
            if isinstance(rec, OpRecorder):  # the native recorder reads autocast itself, per op
                rec.autocast = autocast_on()
        # ``_compiling()``: Dynamo is tracing through the mode; nothing of ours goes into its graph
        if kind is None or kind == "arith":
            after = kind == "arith" and self.watch._after_update
            if not self.watch._probing and not after and not self.watch._grad_consts:
                return func(*args, **kwargs)  # torchscope runs your call unchanged
            out = func(*args, **kwargs)  # torchscope runs your call unchanged
            if self.watch._grad_consts and not _compiling():  # (Tensor.norm, __pow__: torch's frames call them)
                self.watch._safe("grad_consts", self.watch._on_grad_const, func, args, kwargs, out)
            if _compiling() or not torch.is_grad_enabled() or not _from_user():
                return out
            if self.watch._probing and isinstance(out, torch.Tensor) and out.grad_fn is not None:
                self.watch._safe("holder", self.watch._on_holder, args)
            if after and not self.watch._depth:
                self.watch._safe("copies", self.watch._on_copy_arith, out, args, func)
            return out
        if kind == "clip":
            if not _compiling() and _caller_file().endswith(_CLIP_FILE):
                if self.watch.mode == "full" and not self.watch._capturing_ops:
                    self.watch._safe("ops", self.watch._record_clip)  # its ops are the step's too
                if self.watch._scaler is not None:
                    self.watch._safe("amp", self.watch._on_clip)
                if func is _VECTOR_NORM:  # clip_grad_norm_'s total: the norm before clipping
                    out = func(*args, **kwargs)  # torchscope runs your call unchanged
                    self.watch._safe("grads", self.watch._on_clip_norm, out, sys._getframe(1))
                    return out
                if func is torch.clamp:
                    self.watch._safe("grads", self.watch._on_clip_with_norm, sys._getframe(1))
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        if kind == "data":
            if not _compiling():
                if self.watch._optimizer is None and args and id(args[0]) in self.watch._param_names:
                    self.watch._param_data_taken = True  # a hand-written update (_updated_by_hand)
                    if self.watch._s.restat:
                        self.watch._safe("grads", self.watch._restat)
                if self.watch._capturing_ops and _from_user():
                    self.watch._safe("breaks", self.watch._on_break, "torch::Tensor.data", args[0])
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        if _compiling():
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        if kind == "tensor" or kind == "autograd" or kind == "grad":
            try:
                # a user's traceback shows these lines, so their comments speak to the user
                if kind == "grad":
                    return self.watch._run_grad(func, args, kwargs)  # torchscope runs your call unchanged
                return self.watch._run_backward(func, kind, args, kwargs)  # torchscope runs your call unchanged
            except BaseException:
                # not bound to a name: this frame would hold its own traceback (a cycle)
                unlink_own_frames(sys.exc_info()[2])
                raise
        if kind == "update":
            target = args[0] if args else None
            first = target[0] if isinstance(target, (list, tuple)) and target else target
            # a tensor without a graph that gains one here, or one that did in an earlier step:
            # the loss's own ``+=`` (a penalty added to it) and the optimizer's updates
            # (no_grad) never qualify
            fresh = False
            if self.watch._s.restat and isinstance(first, torch.Tensor) and id(first) in self.watch._param_names:
                self.watch._safe("grads", self.watch._restat)  # ``p -= lr * p.grad``, after a clipping
            copy = (isinstance(first, torch.Tensor) and torch.is_grad_enabled() and not self.watch._depth
                    and ((fresh := not first.requires_grad) or id(first) in self.watch._weight_copies))
            out = func(*args, **kwargs)  # torchscope runs your call unchanged
            if copy and isinstance(first, torch.Tensor) and first.grad_fn is not None:
                self.watch._safe("copies", self.watch._on_graph_copy, first, func, fresh)
            if self.watch._grad_consts and not _compiling():  # ``loss += gp``
                self.watch._safe("grad_consts", self.watch._on_grad_const, func, args, kwargs, out)
            if self.watch._probing and isinstance(out, torch.Tensor) and out.grad_fn is not None and _from_user():
                self.watch._safe("holder", self.watch._on_holder, args)  # ``running += loss``, as below
            return out
        if kind == "grad_set" or kind == "grad_zero":
            # ``p.grad = None`` (zero_grad()'s default; ``zero_()`` with set_to_none=False) after a
            # backward of the step, before its optimizer.step(): where a zero_grad() between
            # them is (P5's line)
            s = self.watch._s
            if s.micro > 0 and args and not _compiling():
                if kind == "grad_zero":
                    self.watch._safe("grads", self.watch._on_grads_zeroed, args[0])
                elif len(args) > 1 and args[1] is None:
                    self.watch._safe("grads", self.watch._on_grad_cleared, args[0])
                elif len(args) > 1 and isinstance(args[1], torch.Tensor):
                    self.watch._safe("grads", self.watch._on_grad_assigned, args[0])
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        if kind == "scale":
            self.watch._safe("grads", self.watch._on_scale_update)
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        if kind == "check":
            t = args[0] if args else None
            if isinstance(t, torch.Tensor) and t.grad_fn is not None and t.numel() == 1:
                self.watch._safe("forward", self.watch._on_loss_check, t)
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        if kind == "new_tensor":
            if _from_user():
                self._copy_cut(func, args[1] if len(args) > 1 else kwargs.get("data"))
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        if kind == "break":
            if args and isinstance(args[0], torch.Tensor) and args[0].requires_grad and _from_user():
                self.watch._safe("breaks", self.watch._on_break, _BREAKS[func], args[0])
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        caller = _caller_file()
        if func is torch.tensor and caller.endswith(_CLIP_FILE):
            # the 0 clip_grad_norm_ returns when no parameter has a gradient (it takes no norm):
            # the clipping of nothing P3 names before backward() (a "copy" kind otherwise)
            if not _compiling():
                self.watch._safe("grads", self.watch._on_clip_nothing, sys._getframe(1))
            return func(*args, **kwargs)  # torchscope runs your call unchanged
        if caller.endswith(_SCALER_FILE):
            # GradScaler.scale() moves its scale to the loss's device: a scaler the user did not
            # pass to watch() (P14, skipped steps, the scale over time), and the loss it scales
            self.watch._safe("amp", self.watch._on_scaling, sys._getframe(1).f_locals, sys._getframe(1).f_code.co_name)
        # the user's own ``.to()`` / ``.half()`` / ``clone()``: while a captured step records
        # ops, the ``_to_copy`` it makes is marked theirs, not autocast's.  Called here, in
        # this frame, as every other call the mode passes on: a warning torch raises in it
        # names this frame, which _warnings renames after the user's
        rec = self.watch._s.recorder if self.watch._capturing_ops else None
        if rec is None:
            out = func(*args, **kwargs)  # torchscope runs your call unchanged
        else:
            rec.explicit_casts += 1
            try:
                out = func(*args, **kwargs)  # torchscope runs your call unchanged
            finally:
                rec.explicit_casts -= 1
        if args and isinstance(args[0], torch.Tensor) and _from_user() and not (out is args[0] and in_package(_caller_file())):
            self.watch._safe("copies", self.watch._on_move, args[0], out, func in SAME_PLACE_COPIES,
                             _names_device(func, args, kwargs))
            if func is torch.tensor:
                self._copy_cut(func, args[0])
        elif args and hasattr(args[0], "__array_interface__") and isinstance(out, torch.Tensor) and _from_user():
            # ``torch.tensor(X_np)``: a numpy array converted, its data the same every step (P12)
            self.watch._safe("copies", self.watch._on_array_copy, args[0], out)
        return out

    def _copy_cut(self, func: Any, data: Any) -> None:
        """``torch.tensor(t)`` / ``x.new_tensor(t)``, called by the user, of a ``t`` that requires
        grad: where a graph is cut."""
        if isinstance(data, torch.Tensor) and data.requires_grad:
            self.watch._safe("breaks", self.watch._on_break, _COPY_CUTS[func], data)


def _names_device(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a move call names a device: ``.cuda()``, ``.cpu()``, ``.to(device)``,
    ``.to(other_tensor)`` -- not ``.float()``, ``.to(torch.float32)``."""
    if func is _T.cuda or func is _T.cpu:
        return True
    return func is _T.to and ("device" in kwargs or "other" in kwargs
                              or any(isinstance(a, (torch.device, str, torch.Tensor))
                                     or (isinstance(a, int) and not isinstance(a, bool)) for a in args[1:]))


def insert_mode(mode: TorchFunctionMode) -> None:
    """Put ``mode`` at the bottom of this thread's function-mode stack (above the default
    device's mode, which ``torch.set_default_device`` keeps at the bottom itself).  A mode a
    loop enters and leaves around its forward or backward (``with torch.device(...)``, a user's
    TorchFunctionMode) pops the top of the stack on exit: pushed on top while one of them is
    open, ours would be popped in its place and theirs left on for the rest of the process."""
    n = torch._C._len_torch_function_stack()
    if n == 0:  # the usual case, once a step: nothing to keep below or above
        torch._C._push_on_torch_function_stack(mode)
        return
    default = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    keep = 1 if n and default is not None and torch._C._get_function_stack_at(0) is default else 0
    above = [torch._C._pop_torch_function_stack() for _ in range(n - keep)]
    torch._C._push_on_torch_function_stack(mode)
    for m in reversed(above):
        torch._C._push_on_torch_function_stack(m)


def remove_mode(mode: TorchFunctionMode) -> bool:
    """Take ``mode`` off this thread's stack wherever it sits, the modes above it left in
    their order; False when it is not there (torch pops a mode while its own handler runs,
    and pushes it back after)."""
    n = torch._C._len_torch_function_stack()
    if n == 1 and torch._C._get_function_stack_at(0) is mode:  # the usual case, once a step
        torch._C._pop_torch_function_stack()
        return True
    at = [i for i in range(n) if torch._C._get_function_stack_at(i) is mode]
    if not at:
        return False
    above = [torch._C._pop_torch_function_stack() for _ in range(n - 1 - at[-1])]
    torch._C._pop_torch_function_stack()
    for m in reversed(above):
        torch._C._push_on_torch_function_stack(m)
    return True


def _from_user() -> bool:
    """True when the call came straight from user code, not from inside torch (optimizers,
    functional helpers and ``Module.to`` call ``.to()``/``.item()`` themselves)."""
    return not _is_internal(sys._getframe(2).f_code.co_filename)


def _caller_file() -> str:
    return sys._getframe(2).f_code.co_filename


def _in_clipping() -> bool:
    """Whether the torch call being handled comes from inside torch/nn/utils/clip_grad.py's
    functions (through torch's own frames: ``Tensor.__rtruediv__`` of its coefficient), not
    from the loop's code after it returned."""
    f: Any = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name.endswith(_CLIP_FILE):
            return True
        if not _is_internal(name):
            return False
        f = f.f_back
    return False
