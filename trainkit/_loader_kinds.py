"""The kinds of patched loader: ``tk.patch(loader)`` gives one that is sized, a context
manager, and an iterator (``next()``) where its source is (:func:`wrap`), and refuses what no
loop should be given as a loader (:func:`check_loader`; given to ``tk.unpatch``,
:func:`check_unpatchable`). The per-batch recording is
:class:`trainkit.loader.PatchedLoader`'s."""
from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, Optional

from ._text import brief
from .loader import _S, _patched, PatchedLoader, SizedPatchedLoader


def check_loader(obj: Any) -> None:
    """Raise TypeError for what ``tk.patch`` takes for no data loader (before anything changes)."""
    import torch

    if isinstance(obj, torch.utils.data.Dataset) and not hasattr(obj, "__iter__"):
        # Iterable by index, but sample by sample: the loader was meant (samples_per_s would
        # count a sample's first dimension as its items)
        raise TypeError(f"patch({brief(obj)}): a map-style {type(obj).__name__} is what a "
                        f"DataLoader takes samples from; patch the DataLoader that batches it, "
                        f"e.g. loader = tk.patch(DataLoader(dataset, batch_size=64)) (a dataset "
                        f"whose items are whole batches: tk.patch(iter(dataset)))")
    kind = refused_kind(obj)
    if kind is not None:
        raise TypeError(f"patch({brief(obj)}): expected a torch.optim.Optimizer or an iterable data "
                        f"loader, got {kind}; e.g. tk.patch(optimizer) and loader = tk.patch(loader)")


def refuse_optimizers_in_a_sequence(obj: Any, what: str) -> None:
    """Raise TypeError for a list or tuple of optimizers given to ``tk.patch``/``tk.unpatch``
    (``what``): iterable, it was taken for a loader of optimizers, and neither was patched."""
    import torch

    if isinstance(obj, (list, tuple)) and any(
            isinstance(x, torch.optim.Optimizer) for x in obj[:8]):
        names = ", ".join(type(x).__name__ for x in obj[:4]) + (", ..." if len(obj) > 4 else "")
        shown = f"[{names}]" if isinstance(obj, list) else f"({names})"
        raise TypeError(f"{what}({shown}): a {type(obj).__name__} of optimizers is {what}ed "
                        f"one optimizer at a time, e.g. tk.{what}(opt_g); tk.{what}(opt_d) (or "
                        f"for opt in optimizers: tk.{what}(opt))")


def check_unpatchable(obj: Any) -> None:
    """Raise TypeError for what ``tk.patch`` refuses, given to ``tk.unpatch``: it can never have
    been patched (an int, None, a str, a model), so the call is a mistake, not a no-op."""
    import torch

    if isinstance(obj, torch.optim.Optimizer):
        return  # one never patched: nothing to undo
    kind = refused_kind(obj, "unpatch")
    if kind is None and isinstance(obj, torch.utils.data.Dataset) \
            and not hasattr(obj, "__iter__"):
        kind = f"a map-style {type(obj).__name__}"
    if kind is not None:
        raise TypeError(f"unpatch({brief(obj)}): tk.patch never takes this, so there is nothing "
                        f"to undo: expected an optimizer or a data loader, got {kind}; e.g. "
                        f"tk.unpatch(optimizer) and loader = tk.unpatch(loader), with the loader "
                        f"tk.patch returned")


def refused_kind(obj: Any, verb: str = "patch") -> Optional[str]:
    """What ``obj`` is, said for ``verb``'s error, where ``tk.patch`` takes it for no data loader
    (a str, a tensor, a model, what is not iterable); None where it does. A map-style ``Dataset``
    is left to the callers' own message."""
    import torch

    kind = None
    if isinstance(obj, (str, bytes, dict, torch.Tensor)):
        kind = type(obj).__name__
    elif isinstance(obj, torch.nn.Module):
        kind = "a model (nn.Module)"
    elif not hasattr(obj, "__iter__") and not hasattr(type(obj), "__getitem__"):
        # iterable as Python iterates: by __iter__, or by index (__getitem__ from 0 to IndexError)
        kind = type(obj).__name__
        if isinstance(getattr(obj, "__self__", getattr(obj, "optimizer", None)),
                      torch.optim.Optimizer):  # a scheduler, or optimizer.step
            kind += f" of an optimizer: {verb} the optimizer itself"
    return kind


class _Context:
    """``with`` as on a source that is a context manager (a tqdm bar: ``with tqdm(loader) as
    bar``): the source's ``__enter__`` and ``__exit__`` run, and a source that enters as itself
    enters as this loader, so the batches iterated in the block are recorded."""

    def __enter__(self) -> Any:
        got = self.source.__enter__()  # type: ignore[attr-defined]
        return self if got is self.source else got  # type: ignore[attr-defined]

    def __exit__(self, *exc: Any) -> Any:
        return self.source.__exit__(*exc)  # type: ignore[attr-defined]


class _Iterator:
    """``next()`` as on a source that is an iterator (``tk.patch(itertools.cycle(loader))`` in a
    loop that counts steps, a generator): the first ``next()`` begins a pass over the source
    itself (no ``iter()``, as ``next()`` on the source calls none), and the later ones go on
    with it, each batch recorded as in a ``for`` loop; a ``for`` loop goes on with it too (a
    ``break`` ends it, as a loop left early). A new pass begins where its context changed:
    another session, or grad mode switched (a first batch taken under ``no_grad`` to look at
    shapes would make the whole pass an evaluation's), and after the source ran out. A batch
    taken under ``no_grad`` in a training loop (a validation batch) leaves what is logged next
    to the training batch's step, as a validation pass nested in the loop does at its end.
    Threads taking batches from it (``next()``, or a ``for`` loop going on with the pass) take
    turns, as on an iterator that is not a generator (a DataLoader's, a list's): the pass is a
    generator, which raises "generator already executing" to a second thread calling it while
    the first waits for its batch."""

    #: ``[pass, session, grad mode, a for loop reads it]`` of the pass next() goes on with (an
    #: instance's own)
    _next_pass: Any = None

    def __iter__(self) -> Iterator[Any]:
        from torch import is_grad_enabled

        got = self._next_pass
        if got is None or got[1] is not _S._active or got[2] is not is_grad_enabled():
            self._end_next_pass()
            return PatchedLoader.__iter__(self)  # type: ignore[arg-type]
        return self._go_on(got)

    def _go_on(self, got: Any) -> Iterator[Any]:
        # `yield from got[0]`, each batch taken under the lock (another thread's next() or loop
        # reads the same pass)
        lock = self._lock()
        got[3] = True  # next() in its body (a validation batch under no_grad) goes on with it
        try:
            while True:
                with lock:
                    try:
                        batch = next(got[0])
                    except StopIteration:
                        return
                try:
                    yield batch
                except GeneratorExit:  # the loop was left: the pass ends with it, as one left
                    with lock:
                        got[0].close()
                    raise
                except BaseException as exc:  # thrown in: the pass gets it, as yield from does
                    with lock:
                        got[0].throw(exc)
                    raise
        finally:  # run out, or left
            got[3] = False
            if self._next_pass is got:
                self._next_pass = None

    def _lock(self) -> Any:
        """This loader's lock for its pass (made at first use: dict.setdefault is atomic)."""
        d = self.__dict__
        return d.get("_next_lock") or d.setdefault("_next_lock", threading.RLock())

    def __next__(self) -> Any:
        with self._lock():  # reentrant: a next() inside the source's own says what it says unpatched
            return self._next()

    def _next(self) -> Any:
        from torch import is_grad_enabled

        got = self._next_pass
        s = _S._active
        grad = is_grad_enabled()
        if got is None or got[1] is not s or (got[2] is not grad and not got[3]):
            self._end_next_pass()
            began = PatchedLoader.__iter__(self, False)  # type: ignore[arg-type]
            got = self._next_pass = [began, s, grad, False]
        before = None if s is None else s._batch_step
        try:
            return next(got[0])
        except StopIteration:
            if self._next_pass is got:
                self._next_pass = None
            raise
        finally:
            if not grad and s is not None and _patched.data and not s._batches_are_steps:
                s._batch_step = before  # an evaluation's batch in training: no step of its own

    def _end_next_pass(self) -> None:
        with self._lock():
            got = self._next_pass
            if got is not None:
                self._next_pass = None
                got[0].close()

    def __getstate__(self) -> Dict[str, Any]:
        # a copy (pickle, deepcopy) begins passes of its own: a generator cannot be copied
        state = dict(self.__dict__)  # type: ignore[attr-defined]
        state.pop("_next_pass", None)
        state.pop("_next_lock", None)  # nor can a lock
        return state


class _ContextPatchedLoader(_Context, PatchedLoader):
    pass


class _SizedContextPatchedLoader(_Context, SizedPatchedLoader):
    pass


class _IteratorPatchedLoader(_Iterator, PatchedLoader):
    pass


class _SizedIteratorPatchedLoader(_Iterator, SizedPatchedLoader):
    pass


class _ContextIteratorPatchedLoader(_Iterator, _ContextPatchedLoader):
    pass


class _SizedContextIteratorPatchedLoader(_Iterator, _SizedContextPatchedLoader):
    pass


#: (sized, a context manager, an iterator) -> the patched loader's class
_CLASSES = {
    (False, False, False): PatchedLoader, (True, False, False): SizedPatchedLoader,
    (False, True, False): _ContextPatchedLoader, (True, True, False): _SizedContextPatchedLoader,
    (False, False, True): _IteratorPatchedLoader, (True, False, True): _SizedIteratorPatchedLoader,
    (False, True, True): _ContextIteratorPatchedLoader,
    (True, True, True): _SizedContextIteratorPatchedLoader,
}


def wrap(source: Any, original: Any) -> PatchedLoader:
    """The patched loader of ``source``: sized, a context manager, and an iterator (``next()``),
    where the source is."""
    kind = type(source)
    context = hasattr(kind, "__enter__") and hasattr(kind, "__exit__")
    cls = _CLASSES[(hasattr(source, "__len__"), context, hasattr(kind, "__next__"))]
    return cls(source, original)
