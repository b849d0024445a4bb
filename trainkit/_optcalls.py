"""What a patched optimizer's step calls: closures (timed, and run ahead of an accumulation
gate), and its own step and zero_grad kept without a strong reference to it.

A patch lives in the optimizer's ``__dict__``; a bound method of the optimizer kept there (its
new ``step``, or the original one saved) is a reference cycle, which only Python's cyclic
collector frees: the optimizer and its state (Adam's moments, on the GPU) outlived ``del
optimizer``, where an unpatched one is freed at once. So methods are kept as their functions and
bound on use, and the methods set on the optimizer are bound to a ``weakref.proxy`` of it.
"""
from __future__ import annotations

import functools
import inspect
import sys
import types
import weakref
from typing import Any, Callable, Optional, Tuple

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
    if not bound:
        return fn
    obj = ref()
    return types.MethodType(fn, obj) if obj is not None else gone(fn)


def gone(fn: Any) -> Any:
    """Raise for a patched optimizer's method called after the optimizer was freed."""
    raise ReferenceError(
        f"{getattr(fn, '__qualname__', fn)!s}: its optimizer was deleted; trainkit's patched "
        f"optimizer holds itself weakly (so that `del optimizer` frees its state at once, as "
        f"unpatched), so a `step = optimizer.step` kept alone does not keep it alive: keep a "
        f"reference to the optimizer while you call its step")


def referent(obj: Any) -> Any:
    """The object behind a ``weakref.proxy`` (``obj`` itself otherwise): a proxy passes every
    attribute lookup on, so a method looked up through it is bound to the object itself."""
    return obj.__init__.__self__ if isinstance(obj, weakref.ProxyTypes) else obj


def scheduler_marked(step: Any, orig_step: Any) -> Any:
    """``step`` (a patched optimizer's function) with the marks an LR scheduler looks for.

    torch >= 2.4's schedulers mark the step they wrap ``_wrapped_by_lr_sched``; older ones
    (``with_counter``) mark it ``_with_counter``, count ``optimizer._step_count`` in it, and take
    a weak reference to its ``__self__``, which a ``weakref.proxy`` cannot give ("cannot create
    weak reference to 'weakref.ProxyType' object" at a scheduler made after the patch). There the
    patched step carries ``_with_counter`` always, so such a scheduler leaves it as it is, and
    counts ``_step_count`` itself unless the step it wraps (a scheduler's made before) does.
    """
    if getattr(orig_step, "_wrapped_by_lr_sched", False):
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    if not _schedulers_count_steps():
        return step
    if getattr(orig_step, "_with_counter", False):
        step._with_counter = True  # type: ignore[attr-defined]
        return step

    @functools.wraps(step)
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            d = self.__dict__  # the optimizer's own (``self`` is a proxy of it)
        except ReferenceError:  # freed: the step says so, with what to do (:func:`gone`)
            return step(self, *args, **kwargs)
        if "_step_count" in d:  # set by a scheduler made after the patch
            d["_step_count"] += 1
        return step(self, *args, **kwargs)

    counted._with_counter = True  # type: ignore[attr-defined]
    return counted


def uncounted(opt: Any, step: Any) -> Tuple[Any, Optional[Callable[[], None]]]:
    """``(step, None)``, or for a torch < 2.4 scheduler's ``with_counter`` wrapper (made before
    the patch) the step it wraps, bound to ``opt``, and its count apart, to call before it.

    For ``torch.compile``: compiled with the step, the count (``optimizer._step_count += 1``
    through a weak reference) broke every compiled step's graph in two.
    """
    func = getattr(step, "__wrapped__", None)
    if func is None or not getattr(step, "_with_counter", False) or hasattr(step, "__self__"):
        return step, None
    ref = weakref.ref(opt)

    def count() -> None:
        d = ref().__dict__
        if "_step_count" in d:
            d["_step_count"] += 1

    return types.MethodType(func, opt), count


@functools.lru_cache(maxsize=None)
def _schedulers_count_steps() -> bool:
    """Whether this torch's ``LRScheduler`` wraps ``optimizer.step`` with ``with_counter``
    (torch < 2.4): its ``__init__``'s code, nested functions included, names ``_with_counter``."""
    from torch.optim import lr_scheduler

    init = getattr(getattr(lr_scheduler, "LRScheduler", None), "__init__", None)
    codes = [getattr(init, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        if "_with_counter" in code.co_consts or "_with_counter" in code.co_names:
            return True
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return False


def step_signature(saved: Tuple[Any, bool]) -> Optional[inspect.Signature]:
    """The signature for a patched step (a function taking the optimizer first): that of its
    own step, kept as :func:`unbind` gives it.

    Code reads ``inspect.signature(optimizer.step)``: GradScaler passes ``grad_scaler=self`` to
    an optimizer that handles scaling (``_step_supports_amp_scaling``) only when its step names
    that parameter; the patch's ``(*args, **kwargs)`` hid it, and such a step got no scaler.
    """
    fn, bound = saved
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    if bound:
        return sig
    params = list(sig.parameters.values())  # a callable as it is called: the optimizer first
    name = "self" if all(q.name != "self" for q in params) else "_trainkit_self"
    return sig.replace(parameters=[inspect.Parameter(name, inspect.Parameter.POSITIONAL_ONLY)]
                       + params)


#: What code writes as a closure: a ``def``, a lambda, a bound method, a partial of one.
_FUNCTIONS = (types.FunctionType, types.MethodType, types.BuiltinFunctionType,
              types.BuiltinMethodType, functools.partial)


def first_parameter(saved: Tuple[Any, bool]) -> Optional[str]:
    """The name of the parameter of a patched step (kept as :func:`unbind` gives it) that takes
    a call's first positional argument; None where it cannot be told (no signature, or
    ``*args``), for :func:`closure_of`."""
    sig = step_signature(saved)
    params = list(sig.parameters.values())[1:] if sig is not None else []  # past the optimizer
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        return None
    return params[0].name


def closure_of(args: Any, kwargs: Any, first: Optional[str] = "closure") -> Any:
    """The closure a ``step(...)`` call passes, or None (a custom optimizer's first positional
    argument may be something else, e.g. the loss, or the model it reads: it is passed on
    untouched). ``first`` names the step's parameter that takes that argument
    (:func:`first_parameter`; None where unknown).

    A model is callable, but no closure: wrapped in a timed one, the step that read it
    (``model.parameters()``) got a function. So is an object with ``__call__`` passed to a step
    whose parameter is not named ``closure`` (``step(self, teacher)`` reading
    ``teacher.temperature``): only a function, a method or a partial is taken for a closure there.
    A step's ``closure`` parameter takes what it is given: torch calls it with no arguments.
    """
    closure = kwargs.get("closure", args[0] if args else None)
    if not callable(closure):
        return None
    torch = sys.modules.get("torch")  # a model exists only once torch is imported
    if torch is not None and isinstance(closure, torch.nn.Module):
        return None
    if "closure" in kwargs or first in ("closure", None) or isinstance(closure, _FUNCTIONS):
        return closure
    return None


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


def ran_closure(closure: Callable[..., Any], loss: Any) -> Callable[..., Any]:
    """What an accumulating step passes on for a closure :func:`run_closure` already ran: its
    ``loss`` for the call without arguments, the closure itself for a call with some (a forward
    only evaluation, ``closure(backward=False)``, asks for a new value)."""
    def ran(*args: Any, **kwargs: Any) -> Any:
        return closure(*args, **kwargs) if args or kwargs else loss

    return ran


def timed_closure(closure: Callable[..., Any], acc: list) -> Callable[..., Any]:
    """``closure``, its time added to ``acc[0]`` (ms) at each call; the optimizer's arguments
    (a line search's ``closure(backward=False)``) are passed on."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = timing.now()
        try:
            return closure(*args, **kwargs)
        finally:
            acc[0] += (timing.now() - t0) * 1e3

    return timed
