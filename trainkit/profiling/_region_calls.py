"""``profile_region`` as a decorator, and what an exit without its entry says.

Split from :mod:`.regions`, whose hot path this is not: a decorated function's call enters its
region by name (``region_of(name)``, :func:`.regions.profile_region`), as a ``with`` would.
"""
from __future__ import annotations

import functools
import inspect
import sys
import threading
from typing import Any, Callable, Dict, List, Optional

F = Callable[..., Any]


def decorate(name: str, fn: Any, region_of: Callable[[str], Any]) -> Any:
    """``@tk.profile_region(name)`` above ``fn``: each call timed (each resumption of a
    generator function's generator); what a region cannot time as a function is refused. A
    callable object comes back as a :class:`TimedObject`, its attributes its own."""
    _check_decorated(name, fn)
    routine = inspect.isroutine(fn)
    # a partial of one is a generator function too; an object is one whose __call__ is
    if inspect.isgeneratorfunction(_runs(fn)):
        timed = _timed_generator(name, fn, region_of)
    else:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with region_of(name):
                return fn(*args, **kwargs)

    return timed if routine else TimedObject(name, fn, timed)


class TimedObject:
    # No docstring: __doc__ is the object's (below). A callable object (an instance with
    # __call__, a functools.partial) decorated: its calls timed, and everything else the object's
    # own. functools.wraps on a function in its place copied no attribute of its class (obj.extra
    # worked, wrapped.extra raised AttributeError) and a snapshot of its instance's, which went
    # stale as the object changed them; and the function could not be pickled (a collate_fn sent
    # to DataLoader workers that spawn). Attributes are read, set and deleted on the object;
    # isinstance() is not the object's (a model, where that matters, is refused).
    __slots__ = ("__wrapped__", "_tk_name", "_tk_call")

    def __init__(self, name: str, obj: Any, call: F) -> None:
        object.__setattr__(self, "__wrapped__", obj)
        object.__setattr__(self, "_tk_name", name)
        object.__setattr__(self, "_tk_call", call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tk_call(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr in TimedObject.__slots__:  # not set yet (a copy being made): no recursion
            raise AttributeError(attr)
        return getattr(self.__wrapped__, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(self.__wrapped__, attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self.__wrapped__, attr)

    def __dir__(self) -> List[str]:
        return dir(self.__wrapped__)

    def __repr__(self) -> str:
        return f"<tk.profile_region({self._tk_name!r}) timing {self.__wrapped__!r}>"

    def __reduce__(self) -> Any:
        # the object pickled, decorated again where it is loaded
        return _decorated_again, (self._tk_name, self.__wrapped__)

    @property  # type: ignore[misc]
    def __doc__(self) -> Optional[str]:  # type: ignore[override]
        return getattr(self.__wrapped__, "__doc__", None)


def _decorated_again(name: str, obj: Any) -> Any:
    """``obj`` decorated with ``tk.profile_region(name)``, as a pickled :class:`TimedObject`
    is loaded."""
    from .regions import profile_region  # regions imports this module

    return profile_region(name)(obj)


def _check_decorated(name: str, fn: Any) -> None:
    """Refuse what a region cannot time as a function: its calls would be timed, not its work."""
    fix = f"put `with tk.profile_region({name!r}):` around the work instead"
    if isinstance(fn, type):
        raise TypeError(f"profile_region({name!r}) decorates a function, got the class "
                        f"{fn.__qualname__}: it would become a function timing only its "
                        f"construction; decorate the method to time (e.g. its forward), or {fix}")
    if isinstance(fn, (property, functools.cached_property)):
        # Written above @property: a property is no callable; its getter is.
        raise TypeError(f"profile_region({name!r}) decorates a function, got the "
                        f"{type(fn).__name__} {_getter_name(fn)!r}: put it below "
                        f"@{type(fn).__name__}, right above the def, to time the getter")
    if not callable(fn):
        raise TypeError(f"profile_region({name!r}) decorates a function, got {fn!r}: put it "
                        f"right above a def, e.g. @tk.profile_region({name!r}) above def "
                        f"train_step(batch): ..., or {fix}")
    torch = sys.modules.get("torch")  # a model exists only once torch is imported
    if torch is not None and isinstance(fn, torch.nn.Module):
        raise TypeError(f"profile_region({name!r}) decorates a function, got the model "
                        f"{type(fn).__name__}(...): it would become a function calling it, "
                        f"without its .parameters(), .to() or state_dict(); decorate the "
                        f"method of its class (@tk.profile_region({name!r}) above "
                        f"def forward), or {fix}")
    runs = _runs(fn)  # an object's async __call__ too (a partial of one): it was timed
    if any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f) for f in (fn, runs)):
        raise TypeError(f"profile_region({name!r}) decorates a plain function, got the async "
                        f"function {getattr(runs, '__qualname__', runs)!r}: a call only creates "
                        f"its coroutine, so nothing of its work would be timed; {fix}")


def _runs(fn: Any) -> Any:
    """The function a call of ``fn`` runs: under its partials, an object's ``__call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn if inspect.isroutine(fn) else getattr(type(fn), "__call__", fn)


def _getter_name(prop: Any) -> str:
    """The name of a property's getter (``cached_property`` keeps it as ``func``)."""
    getter = getattr(prop, "fget", None) or getattr(prop, "func", None)
    return str(getattr(getter, "__qualname__", "?"))


def _timed_generator(name: str, fn: F, region_of: Callable[[str], Any]) -> F:
    """A generator function decorated: each resumption is timed (the work making each item),
    not the creation of the generator, nor what its consumer does between items."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        gen = fn(*args, **kwargs)
        sent: Any = None
        thrown: Optional[BaseException] = None
        try:
            while True:
                with region_of(name):
                    if thrown is None:
                        item = gen.send(sent)
                    else:
                        item, thrown = gen.throw(thrown), None
                try:
                    sent = yield item
                except GeneratorExit:
                    gen.close()
                    raise
                except BaseException as exc:  # thrown in by the consumer: on to the generator
                    thrown, sent = exc, None
        except StopIteration as stop:
            return stop.value

    return wrapper




def unmatched_exit(name: str, others: Dict[int, List[Any]], owner: int,
                   owner_open: bool) -> IndexError:
    """The error of an exit of region ``name`` with no open entry in this thread. ``others``:
    the other threads' open entries by ident, ``owner``/``owner_open``: the thread owning the
    fast stack and whether an entry of its is open. Says where an open entry is, if any: a
    ``with`` around a ``yield``, in a generator resumed in another thread, exits in a thread
    that did not enter it."""
    threads = {t.ident: t.name for t in threading.enumerate()}

    def called(ident: int) -> str:
        return repr(threads[ident]) if ident in threads else f"ident {ident}"

    here = threading.get_ident()
    where = [called(i) for i, starts in others.items() if starts and i != here]
    if owner_open and owner != here:
        where.insert(0, called(owner))
    msg = (f"profile_region({name!r}): exited in thread {called(here)}, which has no open "
           f"entry of it (an __exit__ without its __enter__)")
    if where:
        msg += (f"; it is open in thread {', '.join(where)}. A region is timed per thread: a "
                f"`with tk.profile_region({name!r}):` around a `yield`, in a generator resumed "
                f"in another thread, exits where it did not enter. Decorate the generator "
                f"function with @tk.profile_region({name!r}) instead (each resumption is timed "
                f"in its own thread), or keep the `with` between two yields")
    return IndexError(msg)
