"""What ``tk.accumulate(n, optimizer, model=model)`` puts on the model for the block, and takes
off after it: a forward pre-hook (gradient sync only at a window's last micro-batch) and a held
``zero_grad`` (a ``model.zero_grad()`` would wipe the window's running sum).

Both live in the model's ``__dict__``, which ``copy.deepcopy`` and ``pickle`` hand over: a
snapshot made in the block (``best = copy.deepcopy(model)``, an EMA, ``torch.save(model, path)``)
failed to pickle the held ``zero_grad`` (a local function), and a deep copy kept it, bound to the
original model (``best.zero_grad()`` cleared the trained model's gradients, after the block too),
and a copy of the hook, which deep-copied the optimizer and its state with it. So the model also
gets an instance ``__getstate__`` for the block (:func:`trainkit._optstate.guard`, as a patched
optimizer has) that hands over its state as it is without them.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

from .. import _optstate

_NONE = object()
_HOOKS = "_forward_pre_hooks"


def _held_zero_grad(acc: Any, zero_grad: Callable[..., Any]) -> Callable[..., Any]:
    """The model's ``zero_grad`` for the block: a no-op inside a window, like the optimizer's."""
    def held(*args: Any, **kwargs: Any) -> Any:
        if acc.hold_zero_grad():
            return None
        return zero_grad(*args, **kwargs)

    return held


def hold(acc: Any, model: Any) -> Callable[[], None]:
    """Put the block's hook and held ``zero_grad`` on ``model``; returns what takes them off."""
    hook = model.register_forward_pre_hook(acc.forward_pre_hook)
    d = model.__dict__
    own_zero_grad = d.get("zero_grad", _NONE)
    model.zero_grad = _held_zero_grad(acc, model.zero_grad)

    def unheld(state: dict) -> dict:
        """A copy of the model's ``__dict__`` as it is without the block's additions."""
        if own_zero_grad is _NONE:
            state.pop("zero_grad", None)
        else:
            state["zero_grad"] = own_zero_grad
        hooks = state.get(_HOOKS)
        if isinstance(hooks, dict) and hook.id in hooks:
            state[_HOOKS] = OrderedDict((k, v) for k, v in hooks.items() if k != hook.id)
        return state

    guarded = "__getstate__" not in d  # (a model's own instance __getstate__ is left alone)
    if guarded:
        _optstate.guard(model, unheld)

    def undo() -> None:
        hook.remove()
        if guarded:
            _optstate.unguard(model)
        if own_zero_grad is _NONE:
            d.pop("zero_grad", None)
        else:
            d["zero_grad"] = own_zero_grad

    return undo
