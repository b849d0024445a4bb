"""A patched optimizer pickles and copies as an unpatched one, whatever its ``__getstate__``.

``Optimizer.__getstate__`` returns ``defaults``, ``state`` and ``param_groups`` only, so the
attributes a patch adds (its state, ``step``, ``zero_grad``) never reach a copy. An optimizer
class whose own ``__getstate__`` returns its ``__dict__`` handed them over: ``pickle.dumps``
failed on the patched step, and ``copy.deepcopy`` gave a copy whose ``step()`` changed nothing
(its patch still pointed at the original). For such a class the patch sets an instance
``__getstate__`` (``pickle`` and ``copy`` look ``__getstate__`` up on the instance) that calls the
class's and hands over what it would have handed over unpatched.
"""
from __future__ import annotations

import types
import weakref
from typing import Any, Callable, Dict

from ._optcalls import referent

_GETSTATE = "__getstate__"


def class_state(opt: Any) -> Any:
    """What ``opt``'s class's ``__getstate__`` returns for it (None where it has none)."""
    getstate = getattr(type(opt), _GETSTATE, None)
    return getstate(opt) if getstate is not None else None


def _state_dict_part(state: Any) -> Any:
    """The ``__dict__`` part of a ``__getstate__`` result: the dict, or the first of a
    ``(dict, slots)`` pair; None for anything else (a class's own format is left alone)."""
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        return state[0]
    return state if isinstance(state, dict) else None


def leaks(opt: Any, attr: str) -> bool:
    """Whether ``opt``'s class hands its instance attribute ``attr`` over to copies."""
    try:
        part = _state_dict_part(class_state(opt))
    except Exception:  # noqa: BLE001 - its own __getstate__ fails: a copy fails as unpatched
        return False
    return part is not None and attr in part


def guard(opt: Any, unpatched: Callable[[dict], dict], key: str = "patch") -> None:
    """Give ``opt`` an instance ``__getstate__``: its class's, passed through ``unpatched`` (which
    takes a copy of the ``__dict__`` part and returns it as it would be without the patch).

    Each ``key`` (the patch; a compiled step's state keeper, techniques._state_keeper) adds its
    own ``unpatched`` to the one ``__getstate__``, in the order given, and :func:`unguard` takes
    it out: one guard replacing another handed the first one's attributes (hooks that cannot
    be pickled) over to copies.

    Bound to a weak proxy of ``opt``: a bound method of it in its own ``__dict__`` would be a
    reference cycle that keeps it (and its state) alive after ``del optimizer``.
    """
    current = _ours(opt)
    if current is not None:
        current.trainkit_guard[key] = unpatched
        return
    steps: Dict[str, Callable[[dict], dict]] = {key: unpatched}

    def __getstate__(self: Any) -> Any:
        state = class_state(referent(self))
        part = _state_dict_part(state)
        if part is None:
            return state
        part = {k: v for k, v in part.items() if k != _GETSTATE}
        for step in list(steps.values()):
            part = step(part)
        return part if isinstance(state, dict) else (part,) + state[1:]

    __getstate__.trainkit_guard = steps  # type: ignore[attr-defined]
    opt.__dict__[_GETSTATE] = types.MethodType(__getstate__, weakref.proxy(opt))


def unguard(opt: Any, key: str = "patch") -> None:
    """Undo :func:`guard` for ``key`` (nothing when ``opt`` has no instance ``__getstate__`` of
    ours, or none for ``key``); the last key gone, the instance ``__getstate__`` goes too."""
    current = _ours(opt)
    if current is None:
        return
    current.trainkit_guard.pop(key, None)
    if not current.trainkit_guard:
        del opt.__dict__[_GETSTATE]


def _ours(opt: Any) -> Any:
    """The function of ``opt``'s instance ``__getstate__`` where :func:`guard` set it, else None."""
    func = getattr(opt.__dict__.get(_GETSTATE), "__func__", None)
    return func if isinstance(getattr(func, "trainkit_guard", None), dict) else None
