"""``tk.profile_region(name)``: time a part of the step, and name it in profiler traces.

A region runs several times per step, so ``profile_region(name)`` hands out one context manager per
name, made once, whose fast path is an append on entry and one on exit (a generator-based
``@contextmanager`` costs ~5x that, a new object per use ~2x).
"""
from __future__ import annotations

import contextlib
import importlib
import re
import sys
import types
from threading import get_ident
from typing import Any, Callable, Dict, List, Optional, TypeVar

from .. import _compiled, recorder as _recorder, timing
from ._region_calls import decorate, unmatched_exit
from ..recorder import REGION

F = TypeVar("F", bound=Callable[..., Any])
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")
_profiler_enabled: Optional[Callable[[], bool]] = None


def profiler_check() -> Callable[[], bool]:
    """torch's own C function telling whether a profiler records."""
    global _profiler_enabled
    if _profiler_enabled is None:
        import torch

        _profiler_enabled = torch._C._autograd._profiler_enabled
    return _profiler_enabled


def profiler_enabled() -> bool:
    """True while a torch.profiler / autograd profiler is recording."""
    if type(_TC) is not types.ModuleType:
        load_flags()
    return bool(_TAP._is_profiler_enabled)


# The session module itself (``trainkit.session`` the attribute is the function ``tk.session``).
_S = importlib.import_module(__package__.rsplit(".", 1)[0] + ".session")


class _ProfilerShim:
    """Stands in for ``torch.autograd.profiler`` on a torch without its Python-side flag."""

    @property
    def _is_profiler_enabled(self) -> bool:
        return profiler_check()()


# What the hot paths read, one module attribute each (a property or a call would cost ~10x):
# ``_TAP._is_profiler_enabled`` is torch's own Python-side "a profiler records" flag, kept by
# every torch profiler, and ``_TC._initialized`` turns True when this process initialises CUDA.
# Stand-ins until :func:`load_flags` (torch is imported lazily).
_TAP: Any = types.SimpleNamespace(_is_profiler_enabled=False)
_TC: Any = types.SimpleNamespace(_initialized=False)


def _compiling_first() -> bool:
    import torch

    if _compiled.is_compiling_function(torch)():
        # Called in code dynamo traces: nothing is bound here, as a global rebound while dynamo
        # traces is a guard that fails at the next call (the compiled code would recompile).
        return True
    load_flags()  # binds _compiling
    return False


#: ``torch.compiler.is_dynamo_compiling``: True while torch.compile traces (a constant to it),
#: so a region inside compiled code is left out of the graph rather than breaking it. Bound at
#: import when torch is imported already, else at the first call outside compiled code (or by a
#: session's start): a first region met inside compiled code then binds nothing.
_compiling: Callable[[], bool] = (
    _compiled.is_compiling_function(sys.modules["torch"]) if "torch" in sys.modules
    else _compiling_first)


def load_flags() -> None:
    """Point ``_TAP`` and ``_TC`` at torch's modules (imports torch; cheap after the first call)."""
    global _TAP, _TC, _compiling
    if type(_TC) is types.ModuleType:
        return
    import torch
    import torch.autograd.profiler as tap

    _TAP = tap if hasattr(tap, "_is_profiler_enabled") else _ProfilerShim()
    _compiling = _compiled.is_compiling_function(torch)
    _TC = torch.cuda


_checked: set = set()  # names already validated: a region is entered every step


def record_function(name: str) -> Any:
    """A ``torch.profiler.record_function`` range; call it only while :func:`profiler_enabled`.

    Example::

        if profiler_enabled():
            with record_function("trainkit/optimizer_step"):
                optimizer.step()
    """
    import torch

    return torch.profiler.record_function(name)


def check_name(name: Any, what: str = "profile_region") -> str:
    if name.__class__ is str and name in _checked:
        return name
    if what == "profile_region" and callable(name) and not isinstance(name, str):
        fn = getattr(name, "__name__", "forward")
        fn = fn if isinstance(fn, str) and _NAME.match(fn) else "forward"
        raise ValueError(f"profile_region({name!r}): used bare as a decorator, it took the "
                         f"function for the region's name; give it one, e.g. "
                         f"@tk.profile_region({fn!r})")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{what}({name!r}): name must be a non-empty str of letters, digits, '_', "
                         f"'.', '-' (and '/' between parts), e.g. {what}('forward')")
    if len(_checked) < 10_000:
        _checked.add(name)
    return name


class _Region:
    """The context manager of one region name (see :func:`profile_region`).

    Entries of the same name nest (a stack of start times), and only the outermost records: an
    entry inside an open one of its name (recursion) is in that one's time already, and adding
    it wrote more time than the wall clock had (60 ms for three nested 10 ms calls).

    Each thread has its own stack, so a name entered by several threads at once (a pool
    preparing batches in a decorated function, a prefetch thread) is timed per thread, each
    thread's outermost entry filed under the step by its own start. The thread that made the
    region (``_owner``: the first ``profile_region(name)``, the loop as a rule; or a thread given
    its ident again once it ended) uses ``_starts``, shared with the fast region, whose entry and
    exit just compare thread idents; any other thread's entries go through this class, on a list
    of its own in ``_others`` (by thread ident, dropped when emptied). An exit with no open entry
    in its thread is an ``IndexError`` naming the region, and the threads where it is open.

    This class opens a ``record_function`` range (per thread, so ranges stay balanced in each)
    and records CUDA events as needed; the fast one of a name (:func:`_fast_region`) is used
    while neither is needed, in the owner thread.
    """

    __slots__ = ("name", "tag", "_starts", "_owner", "_others", "full")

    def __init__(self, name: str, full: "Optional[_Region]" = None) -> None:
        self.name = name
        self.tag = REGION + name + "_ms"
        if full is None:
            self._starts: List[Any] = []  # the owner thread's entries
            self._owner = get_ident()
            self._others: Dict[int, List[Any]] = {}  # any other thread's, by its ident
            full = self
        else:  # the fast region of a name: the same stacks as its full region's
            self._starts, self._owner, self._others = full._starts, full._owner, full._others
        self.full = full

    def __enter__(self) -> None:
        rf = None
        if _TAP._is_profiler_enabled:
            import torch

            rf = torch.profiler.record_function(self.name)
            rf.__enter__()
        s = _S._active
        ev0 = (timing.cuda_event(timing.work_device(s._cuda_device))
               if _TC._initialized and s is not None else None)
        ident = get_ident()
        starts = self._starts if ident == self._owner else self._others.setdefault(ident, [])
        starts.append((timing.now(), ev0, rf))

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        t1 = timing.now()
        ident = get_ident()
        starts = self._starts if ident == self._owner else self._others.get(ident)
        if not starts:  # no open entry in this thread: an unmatched exit
            raise unmatched_exit(self.name, self._others, self._owner, bool(self._starts))
        start = starts.pop()
        if not starts and ident != self._owner:  # another thread's own stack, emptied
            del self._others[ident]
        s = _S._active
        if start.__class__ is float:  # entered by the fast region
            if s is not None and not starts:  # (inside an entry of its name: in its time)
                n = s.step  # _step_of(s, start), inlined: a call per region is a cost per step
                if n > 1:
                    end = s._last_step_end
                    if end.__class__ is not float:
                        end = s._last_step_host
                    if end is not None and start < end:
                        n -= 1
                s._buf.append((self.tag, n, (t1 - start) * 1e3))
            return
        t0, ev0, rf = start
        try:
            if starts:  # inside an entry of its name, which times this one too
                if ev0 is not None:
                    timing._give_back(ev0)
            elif s is not None:
                value: Any = (t1 - t0) * 1e3
                if ev0 is not None:  # ended on the device it began on, whatever came in between
                    try:
                        value = timing.PendingInterval(
                            ev0, timing.cuda_event(timing.event_device(ev0)))
                    except RuntimeError:
                        if et is None:
                            raise
                        # A CUDA error that sticks, raised in the block (the user's failing
                        # step): the region is timed on the host, and the user's error is the
                        # one raised, not the same error again out of this exit.
                s._buf.append((self.tag, _step_of(s, t0), value))
        finally:
            if rf is not None:  # the trace's range is closed whatever happened
                rf.__exit__(et, ev, tb)

    def __call__(self, fn: F) -> F:
        if isinstance(fn, (staticmethod, classmethod)):  # written above @staticmethod
            return type(fn)(self(fn.__func__))  # type: ignore[return-value]
        return decorate(self.name, fn, profile_region)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"tk.profile_region({self.name!r})"


def _step_of(s: Any, start: float) -> int:
    """The step a region that began at host time ``start`` goes under: the step in progress, or
    the step that ended inside the region (one wrapping ``optimizer.step()``, or a whole epoch).

    By time, not by the batch a patched loader handed out last (as ``s.log`` files): a region
    that begins after a step ended cannot be told from one of the next step (the chunks of a
    batch stepped several times, a region in ``Dataset.__getitem__``), and after the epoch's loop
    (an evaluation) it goes under the step in progress, which the writer has not written yet.
    """
    n = s.step
    if n > 1:  # before the first step, the last step's "end" is where the first step's data began
        end = s._last_step_end
        if end.__class__ is not float:  # a CUDA event on a GPU: the host time of that step's end
            end = s._last_step_host
        if end is not None and start < end:
            return n - 1
    return n


def _fast_region(name: str) -> _Region:
    """The region of ``name``, fast in the common case (no profiler records, no CUDA in use).

    Its entry and exit are C (``trainkit._speedups``): where ``__enter__`` and ``__exit__`` in
    Python cost ~1 us each between torch calls, they read the clock and push the start, then pop
    it and put one record, with no Python frame. Each name gets its own small class holding them
    (they bind to no instance, so ``with`` calls them as they are, and ``type(cm).__enter__(cm)``
    as ``contextlib.ExitStack`` does works too). Without the C module, ``__enter__`` is a small
    Python method calling ``map(starts.append, iter(now, None)).__next__`` (a bare builtin there
    would take no instance, which ``ExitStack`` passes) and ``__exit__`` is :class:`_Region`'s.
    Both are fast in the thread that made the region only (``full._owner``: one compare of
    thread idents); in any other thread they hand over to the full region, which keeps that
    thread's entries on a stack of its own.
    Call it after :func:`load_flags` (it keeps the ``_TAP`` and ``_TC`` bound then).
    """
    full = _Region(name)
    starts, owner = full._starts, full._owner  # either one's exit ends either one's entry
    fast = _recorder._fast
    # Entered while a profiler records or CUDA is initialised, the full region enters: one kept
    # from before either (``fwd = tk.profile_region("x")`` before the loop, ``with fwd:`` in it)
    # timed on the host and left no range in any trace.
    if fast is not None:
        ns = {"__slots__": (),
              "__enter__": fast.RegionEnter(starts, timing.now, _TAP, _TC, full, owner),
              "__exit__": fast.RegionExit(full.tag, starts, full, vars(timing), vars(_S), owner)}
    else:
        push = map(starts.append, iter(timing.now, None)).__next__
        tap, tc = _TAP, _TC

        def __enter__(self: _Region) -> None:
            if tap._is_profiler_enabled or tc._initialized or get_ident() != owner:
                return full.__enter__()
            push()

        ns = {"__slots__": (), "__enter__": __enter__}
    return type(f"profile_region[{name}]", (_Region,), ns)(name, full)


_regions: Dict[str, _Region] = {}  # name -> its fast region, made once
_NOTHING = contextlib.nullcontext()  # what a region is inside a graph torch.compile traces


def profile_region(name: str) -> _Region:
    """Time a block (or every call of a function) as ``trainkit/region/<name>_ms``.

    Host time on the CPU; on a GPU, the device time between two CUDA events, resolved later by the
    session's writer thread (no synchronize). While a profiler records, the block also appears in
    the trace as a ``record_function`` range of the same name. Time of a region entered several
    times in one step (one per micro-batch) adds up; an entry inside an open one of its name (a
    recursive function's) is in that one's time, and adds nothing. It goes under the step in
    progress, or under the step that ended inside it (a region wrapping ``optimizer.step()``, or
    an epoch).

    Threads entering the same name at once (a pool preparing batches in a decorated function, a
    prefetch thread beside the loop) are timed each on its own: each thread's outermost entry
    records its own time, under the step by its own start. The thread that first asks for a name
    (the loop, as a rule) gets its fast entry and exit; another thread's cost a Python call each
    (about 1 us more a use).

    Example::

        for x, y in loader:
            with tk.profile_region("forward"):
                loss = criterion(model(x), y)

        @tk.profile_region("eval")
        def evaluate(model): ...

    On a generator function, each resumption is timed (the work that makes each item, not the
    consumer's between items); a class or an async function is refused (a call would time only
    its construction, or the creation of its coroutine). On a callable object (an instance with
    ``__call__``, a ``functools.partial``), ``tk.profile_region("collate")(obj)`` times its calls
    and is the object for the rest: its attributes are read and set on it.

    Inside code that ``torch.compile`` traces (a compiled model's ``forward``), a region records
    nothing and costs the graph nothing (timing it would break the graph in two, on every call):
    time the compiled call from outside instead.
    """
    if _compiling():
        return _NOTHING  # type: ignore[return-value]
    try:
        r = _regions.get(name)
    except TypeError:  # unhashable: check_name says what a name must be
        r = None
    if r is None:
        check_name(name)
        load_flags()
        if len(_regions) >= 10_000:  # names made up per call (f"layer{i}"): not all kept
            return _Region(name)
        r = _regions[name] = _fast_region(name)
    return r  # its entry hands over to the full region while a profiler records or CUDA is in use
