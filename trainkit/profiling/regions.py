"""``tk.profile_region(name)``: time a part of the step, and name it in profiler traces.

A class rather than ``@contextmanager``: a region runs several times per step, and a generator-based
context manager costs ~1.5 us per use where ``__enter__``/``__exit__`` cost ~0.3 us.
"""
from __future__ import annotations

import functools
import importlib
import re
from typing import Any, Callable, Dict, Optional, TypeVar

from .. import timing
from ..recorder import REGION

F = TypeVar("F", bound=Callable[..., Any])
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")
_profiler_enabled: Optional[Callable[[], bool]] = None


def profiler_check() -> Callable[[], bool]:
    """torch's own C function telling whether a profiler records, to call in a hot loop."""
    global _profiler_enabled
    if _profiler_enabled is None:
        import torch

        _profiler_enabled = torch._C._autograd._profiler_enabled
    return _profiler_enabled


def profiler_enabled() -> bool:
    """True while a torch.profiler / autograd profiler is recording (a ~0.1 us C call)."""
    return (_profiler_enabled or profiler_check())()


# The session module itself (``trainkit.session`` the attribute is the function ``tk.session``).
_S = importlib.import_module(__package__.rsplit(".", 1)[0] + ".session")
_cuda_state: Dict[str, Any] = {}  # torch.cuda's module dict: "_initialized" turns True with CUDA


def _load_cuda_state() -> Dict[str, Any]:
    """``torch.cuda.__dict__``, read once: an entered region checks CUDA with one dict lookup."""
    global _cuda_state
    import torch

    _cuda_state = torch.cuda.__dict__
    return _cuda_state


_tags: Dict[str, str] = {}  # name -> its TensorBoard tag, built once
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
    if name in _checked:
        return name
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{what}({name!r}): name must be a non-empty str of letters, digits, '_', "
                         f"'.', '-' (and '/' between parts), e.g. {what}('forward')")
    if len(_checked) < 10_000:
        _checked.add(name)
    return name


class profile_region:  # noqa: N801 - used like a function: `with tk.profile_region("forward"):`
    """Time a block (or every call of a function) as ``trainkit/region/<name>_ms``.

    Host time on the CPU; on a GPU, the device time between two CUDA events, resolved later by the
    session's writer thread (no synchronize). While a profiler records, the block also appears in
    the trace as a ``record_function`` range of the same name. Time of a region entered several
    times in one step (one per micro-batch) adds up.

    Example::

        for x, y in loader:
            with tk.profile_region("forward"):
                loss = criterion(model(x), y)

        @tk.profile_region("eval")
        def evaluate(model): ...
    """

    __slots__ = ("name", "_t0", "_ev0", "_rf")

    def __init__(self, name: str) -> None:
        if name not in _checked:
            check_name(name)
        self.name = name
        self._rf: Any = None
        self._ev0: Any = None

    def __enter__(self) -> "profile_region":
        if (_profiler_enabled or profiler_check())():
            import torch

            self._rf = torch.profiler.record_function(self.name)
            self._rf.__enter__()
        if (_cuda_state or _load_cuda_state()).get("_initialized") is True and _S._active is not None:
            self._ev0 = timing.cuda_event()
        self._t0 = timing.now()
        return self

    def __exit__(self, *exc: Any) -> None:
        t1 = timing.now()
        s = _S._active
        if s is not None:
            tag = _tags.get(self.name)
            if tag is None:
                tag = _tags[self.name] = REGION + self.name + "_ms"
            if self._ev0 is not None:
                s.record(tag, timing.PendingInterval(self._ev0, timing.cuda_event()))
                self._ev0 = None
            else:
                s._buf.append((tag, s.step, (t1 - self._t0) * 1e3))
        if self._rf is not None:
            rf, self._rf = self._rf, None
            rf.__exit__(*exc)

    def __call__(self, fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"profile_region({self.name!r}) decorates a function, got {fn!r}")
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with profile_region(name):  # a fresh region per call: recursion and threads are safe
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
