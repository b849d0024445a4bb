"""What a patched optimizer's step calls: closures (timed, and run ahead of an accumulation
gate), and its own step and zero_grad kept without a strong reference to it.

A patch lives in the optimizer's ``__dict__``; a bound method of the optimizer kept there (its
new ``step``, or the original one saved) is a reference cycle, which only Python's cyclic
collector frees: the optimizer and its state (Adam's moments, on the GPU) outlived ``del
optimizer``, where an unpatched one is freed at once. So methods are kept as their functions and
bound on use, and the methods set on the optimizer are bound to a ``weakref.proxy`` of it.
"""
from __future__ import annotations

import inspect
import types
import weakref
from typing import Any, Callable, Tuple

from . import timing
from .recorder import CLOSURE_MS

#: ``Optimizer.zero_grad``'s own, for trainkit's wrapped one (``*args, **kwargs``): accelerate
#: reads it to decide whether ``zero_grad(set_to_none=...)`` may be passed on, else it raises.
ZERO_GRAD_SIGNATURE = inspect.signature(lambda self, set_to_none=True: None)


def unbind(method: Any, opt: Any) -> Tuple[Any, bool]:
    """``(function, True)`` for a method bound to ``opt``, else ``(method, False)``."""
    if getattr(method, "__self__", None) is opt and hasattr(method, "__func__"):
        return method.__func__, True
    return method, False


def rebind(saved: Tuple[Any, bool], ref: "weakref.ref[Any]") -> Any:
    """The callable :func:`unbind` took apart, bound again to the optimizer ``ref`` points at."""
    fn, bound = saved
    return types.MethodType(fn, ref()) if bound else fn


def referent(obj: Any) -> Any:
    """The object behind a ``weakref.proxy`` (``obj`` itself otherwise): a proxy passes every
    attribute lookup on, so a method looked up through it is bound to the object itself."""
    return obj.__init__.__self__ if isinstance(obj, weakref.ProxyTypes) else obj


def closure_of(args: Any, kwargs: Any) -> Any:
    """The closure a ``step(...)`` call passes, or None (a custom optimizer's first positional
    argument may be something else, e.g. the loss: it is passed on untouched)."""
    closure = kwargs.get("closure", args[0] if args else None)
    return closure if callable(closure) else None


def run_closure(closure: Callable[[], Any], s: Any) -> Any:
    """Call ``closure`` as an optimizer's step does (grad enabled), its time as ``closure_ms``."""
    import torch

    t0 = timing.now()
    try:
        with torch.enable_grad():
            return closure()
    finally:
        if s is not None:
            s._buf.append((CLOSURE_MS, s.step, (timing.now() - t0) * 1e3))


def timed_closure(closure: Callable[[], Any], acc: list) -> Callable[[], Any]:
    def timed() -> Any:
        t0 = timing.now()
        try:
            return closure()
        finally:
            acc[0] += (timing.now() - t0) * 1e3

    return timed
