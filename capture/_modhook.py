"""The hooks torchscope registers on a user's modules, made safe to copy and to pickle.

A module's hooks travel with it: ``copy.deepcopy(model)`` (an EMA model, a best-model
snapshot) deep-copies every hook, and ``torch.save(model)`` / ``pickle`` pickles them.  A bound
method of the watch would drag the watch along -- its writer thread and open file raise
``TypeError`` in the user's loop.  Each hook is therefore wrapped in ``ModuleHook``, whose copy
and pickle are an inert callable instead: ``(0).__init__`` takes any arguments and returns
None, and pickles as ``getattr(0, "__init__")``, so a model saved while watched loads where
torchscope is not installed, and a copy of a watched model is not watched.  A deep copy then
drops those stand-ins from its hook dicts once it is done (``_Dropper``): TorchScript and
``torch.compile(fullgraph=True)`` cannot compile one, and an EMA model made with
``AveragedModel(model)`` while watched was scripted or compiled after training.
"""

from __future__ import annotations

import copy
import functools
import weakref
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

INERT: Callable[..., None] = (0).__init__  # type: ignore[misc]  # an int's object.__init__ ignores arguments


class ModuleHook(functools.partial):  # type: ignore[type-arg]
    """``ModuleHook(fn)`` calls ``fn`` (a ``partial`` without arguments: the call stays in C,
    ~60 ns, where a Python ``__call__`` adds ~250 ns to every hook call)."""

    # where it is registered (hook_module): its module, its id in the module's hook dicts,
    # and whether it is a pre-hook
    _where: tuple[weakref.ref[nn.Module], int, bool]

    def __deepcopy__(self, memo: dict[Any, Any]) -> Callable[..., None]:
        where = getattr(self, "_where", None)
        module = where[0]() if where is not None else None
        if where is not None and module is not None:
            _, key, pre = where
            dicts = (
                (module._forward_pre_hooks, module._forward_pre_hooks_with_kwargs)
                if pre
                else (module._forward_hooks, module._forward_hooks_with_kwargs, module._forward_hooks_always_called)
            )
            # copied as an item of its module's hook dict (copy.deepcopy memoizes a dict's copy
            # before its items): the copies of that dict and of its flags, made now (they are
            # the module copy's, from the memo), lose this key once the whole copy is done
            if id(dicts[0]) in memo:
                dropper = memo.setdefault(_Dropper.KEY, _Dropper())
                dropper.entries += [(copy.deepcopy(d, memo), key) for d in dicts]
        return INERT

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, (0, "__init__"))

    @property
    def __name__(self) -> str:  # read by torch.jit.script as the hook's name
        # TorchScript compiles a module's hooks and cannot compile ours: say what to do
        # (an AttributeError, so getattr(hook, "__name__", default) still works)
        raise AttributeError(
            "this module is watched by torchscope: close the watch (watch.close(), or leave "
            "its with-block) before torch.jit.script(model), which compiles a module's hooks"
        )


class _Dropper:
    """Kept in a deep copy's memo: when the copy is done and its memo freed (on return from
    ``copy.deepcopy``), it takes the inert stand-ins out of the copied hook dicts, so the copy
    of a watched model has no hook of torchscope's at all."""

    KEY = "torchscope.modhook"  # a memo's other keys are ints (object ids)

    def __init__(self) -> None:
        self.entries: list[tuple[dict[int, Any], int]] = []

    def __del__(self) -> None:
        for hooks, key in self.entries:
            hooks.pop(key, None)


def hook_module(
    module: nn.Module,
    pre: Callable[..., Any],
    post: Callable[..., Any],
    *,
    with_kwargs: bool = False,
    prepend: bool = False,
) -> list[RemovableHandle]:
    """``pre`` as a forward pre-hook and ``post`` as a forward hook (always called, an
    exception's too) of ``module``, each wrapped in a ModuleHook that knows where it sits."""
    first = ModuleHook(pre)
    handle = module.register_forward_pre_hook(first, with_kwargs=with_kwargs, prepend=prepend)
    first._where = (weakref.ref(module), handle.id, True)
    return [handle, hook_forward(module, post, always_call=True)]


def hook_forward(module: nn.Module, post: Callable[..., Any], *args: Any, always_call: bool = False) -> RemovableHandle:
    """``post`` (given ``args`` first) as a forward hook of ``module``, wrapped in a ModuleHook
    that knows where it sits."""
    hook = ModuleHook(post, *args)
    handle = module.register_forward_hook(hook, always_call=always_call)
    hook._where = (weakref.ref(module), handle.id, False)
    return handle


def assignment_hooks(module_ids: set[int], flags: list[bool]) -> list[RemovableHandle]:
    """torch's global registration hooks, flagging an assignment into one of the watched
    model's modules (``model.head = nn.Linear(...)``, ``model.layers[2] = block``,
    ``layer.weight = nn.Parameter(...)``, ``load_state_dict(..., assign=True)``): ``flags[0]``
    for any (the parameters are followed by name again), ``flags[1]`` for a submodule (the
    modules listed again).  Read where the next forward begins, so an assignment costs a set
    lookup and no forward pays anything; the hooks hold no reference to the watch."""

    def on_module(parent: nn.Module, _name: str, _value: Any) -> None:
        if id(parent) in module_ids:
            flags[0] = flags[1] = True

    def on_parameter(parent: nn.Module, _name: str, _value: Any) -> None:
        if id(parent) in module_ids:
            flags[0] = True

    return [nn.modules.module.register_module_module_registration_hook(on_module),
            nn.modules.module.register_module_parameter_registration_hook(on_parameter)]
