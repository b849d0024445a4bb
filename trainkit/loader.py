"""``tk.patch(loader)``: an iterable that records each batch's data wait and items.

The wrapper is the source's in everything else (``len()``, ``with``, attributes, re-iteration
per epoch). When no optimizer in the session is going to step (an evaluation, inference), its
batches are the session's steps: see :class:`PatchedLoader`.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Iterator

from . import _compiled, timing
from ._items import ItemsCounter
from ._loaderinfo import begin_pass
from .patch import _patched, stepped_elsewhere
from .profiling import regions
from .profiling.regions import record_function
from .recorder import BATCH_REC, GC_FULL, GC_MS, PASS_END_WAIT

# The session module itself (``trainkit.session`` the attribute is the function ``tk.session``).
_S = importlib.import_module(__package__ + ".session")


class PatchedLoader:
    """An iterable that records data wait and items per batch; everything else is the source's.

    Its ``__class__`` is the source's, as a ``wrapt.ObjectProxy``'s is: ``isinstance(loader,
    DataLoader)`` (``list``, ...) answers as on the source, so user code that asks it before
    ``loader.sampler.set_epoch(epoch)`` runs. ``type(loader)`` is the wrapper, and
    ``isinstance(loader, PatchedLoader)`` holds (``tk.patch`` and ``tk.unpatch`` ask it).
    Pickling and copies give a patched loader (of a copy of the source).

    Example::

        loader = tk.patch(DataLoader(ds, batch_size=64))
        len(loader); loader.dataset   # as on the DataLoader
        isinstance(loader, DataLoader)   # True; type(loader) is SizedPatchedLoader
    """

    def __init__(self, source: Any, original: Any = None) -> None:
        self.source = source
        #: what the user patched; ``source`` is an equivalent rebuilt loader when a technique
        #: override (``num_workers``, ``pin_memory``) asked for other settings.
        self.original = source if original is None else original

    def __iter__(self, _fresh: bool = True) -> Iterator[Any]:
        # Once per batch, between the user's torch calls: kept to one record and few lookups.
        # ``_fresh``: the pass begins with iter(source), as a for loop does (next() on an
        # iterator source does not: _Iterator).
        from torch import is_grad_enabled

        now = timing.now
        regions.load_flags()
        _compiled.skip_log_frames()  # a model compiled since the session started: before its first call
        tap = regions._TAP
        # One per pass: it learns where this loader's items are. A pass begun under no_grad
        # (an evaluation between epochs) trains on nothing: its items are no training step's.
        count = ItemsCounter() if is_grad_enabled() else _EvalItems()
        patched = _patched.data  # the WeakSet's own set: empty when no optimizer is patched
        tensor = count.tensor
        mine = 0  # the step of this pass's last batch (steps count from 1)
        mine_s = None  # the session that step is of (a pass may outlive its session: next())
        n = None  # the items of this pass's last batch
        # Batches are steps: when this pass's last batch was handed out, and the quickest body
        # (hand-out to the next wait) of its earlier ones; they tell a loop left before any work
        # on a batch from one left after it (see _left_unused).
        handed = 0.0
        quickest = _INF
        # A pass run in the body of another's (a validation inside the training loop): at its
        # end the enclosing batch gets its step back, for what the body logs after it.
        s = _S._active
        outer = None
        if s is not None:
            outer = (s, s._batch_step, s.step)
            begin_pass(s, self)  # a DataLoader's settings (once a session), and this pass
        # The first wait holds iter(): a DataLoader with workers starts them there, each epoch
        # without persistent_workers; the loop waits for that before its first batch.
        t0 = now()
        it = iter(self.source) if _fresh else self.source

        if _in_a_wait():
            # This pass began inside another patched loader's wait: this one is wrapped in it
            # (directly, or through enumerate, itertools, a generator of the user's), and that
            # one records the wait and the items, once; here too, both counted twice. Asked once
            # a pass, not per batch (the per-batch path is benchmarked).
            yield from it
            return
        while True:
            ev0 = None
            if regions._TC._initialized:  # on a GPU a step that ends here ends as the wait begins
                s = _S._active
                if s is not None and (s._last_step_end is None or (
                        s._batch_pending and mine_s is s and mine == s.step)):
                    ev0 = timing.cuda_event(timing.steps_device(s._cuda_device))
            try:
                if tap._is_profiler_enabled:  # the wait shows as a named range in traces
                    with record_function("trainkit/data_wait"):
                        batch = next(it)
                else:
                    batch = next(it)
            except BaseException as exc:  # the pass's end, or the source raised (goes on as is)
                s = _S._active
                if s is not None and (mine_s is s or mine_s is None):
                    if s._batch_pending and mine_s is s and mine == s.step:
                        s.end_batch_step(t0, ev0)
                    s._batch_step = _enclosing(outer, s)  # what comes after the loop
                    if isinstance(exc, StopIteration):
                        # The last next() waited too (a DataLoader without persistent_workers
                        # joins its workers there): data wait of the step in progress, whose
                        # wall time holds it, once that step is counted (the next epoch's first,
                        # a partial window stepped after the loop); the writer drops it if the
                        # step never is (after the last pass: no point at N + 1).
                        s._buf.append((PASS_END_WAIT, s.step, (now() - t0) * 1e3))
                if isinstance(exc, StopIteration):
                    return
                raise
            t1 = now()
            s = _S._active
            if s is not None:
                if s._last_step_end is None:  # the first step's time starts with its data
                    s._last_step_end = t0
                    if regions._TC._initialized:
                        s._last_step_end = (ev0 if ev0 is not None else timing.cuda_event(
                            timing.steps_device(s._cuda_device)))
                        s._last_step_host = t0  # for a step timed on the host (CPU parameters)
                    # Batches are steps when no optimizer here is going to step; not in a
                    # session resumed from a checkpoint (steps_done=N, its first batch's step is
                    # past 1): it goes on training, its first optimizer step is step N + 1 (a
                    # validation first, or the batches done before the checkpoint skipped).
                    if patched and s.step == 1:
                        s._batches_are_steps = not is_grad_enabled() or stepped_elsewhere(s)
                # Batches are steps: the step in progress ends as this wait began, if this pass
                # already fed it; else this batch joins it (a loader zipped with another one).
                if mine and t0 - handed < quickest:  # the quickest body of the pass so far
                    quickest = t0 - handed
                if s._batch_pending and mine_s is s and mine == s.step:
                    s._batch_pending = False
                    if regions._TC._initialized:
                        s.step_done(ev0 if ev0 is not None else timing.cuda_event(
                            timing.steps_device(s._cuda_device)))
                    else:
                        s.step_done(t0)
                step = s._batch_step = mine = s.step
                mine_s = s
                # The common batch, (tensor, ...), counted inline; anything else by its path.
                if count.first and (batch.__class__ is tuple or batch.__class__ is list):
                    first = batch[0] if batch else None
                    n = first.shape[0] if first.__class__ is tensor and first.ndim else count(batch)
                else:
                    n = count(batch)
                s._buf.append((BATCH_REC, step, t0, t1, n))
                handed = t1
                if not patched or s._batches_are_steps:
                    s._batch_pending = True  # its step ends at the next wait, or the loop's end
            try:
                yield batch
            except GeneratorExit:  # the loop was left early (break, an exception)
                s = _S._active
                if s is not None and s is mine_s:  # (not a later session's business)
                    left = now()
                    if mine != s.step:
                        pass  # a step ended since this batch: it was worked on, and is counted
                    elif not _left_unused(s, t0, left - t1 < quickest * 0.5):
                        # Its body ran. Batches are steps: its step ends where the loop was left.
                        # Training: it is in the step in progress, which a step after the loop
                        # ends (an accumulation window's last, partial one, tk.accumulate's).
                        if s._batch_pending:
                            s.end_batch_step(left)
                    else:
                        # No body ran for it: it was not worked on (a break at the top of the
                        # loop, the unpaired batch of zip(long, short)), and makes no step. Its
                        # items leave the step in progress, which the next pass's batch feeds;
                        # its wait stays, as that step's wall time holds it.
                        s._batch_pending = False
                        if n:
                            s._buf.append((BATCH_REC, mine, 0.0, 0.0, -n))
                    s._batch_step = _enclosing(outer, s)
                raise
            t0 = now()

    def __bool__(self) -> bool:
        return bool(self.source)

    def __getitem__(self, key: Any) -> Any:
        # As on the source (a list of batches: batches[0] to look at one); one that takes no
        # index says so itself ("'generator' object is not subscriptable"). Not recorded: only
        # a pass is the loop's.
        return self.source[key]

    def __getattr__(self, name: str) -> Any:
        if name in ("source", "original"):  # not set yet (unpickling): no recursing in here
            raise AttributeError(name)
        return getattr(self.source, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Set on the source, as unpatched: a loader reading ``self.epoch`` in ``__iter__``
        # (``loader.epoch = e`` each epoch) kept its first epoch's order.
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.source, name, value)

    def __delattr__(self, name: str) -> None:
        if name in _OWN:
            object.__delattr__(self, name)
        else:
            delattr(self.source, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance() asks it when type(self) is not the class
        d = self.__dict__
        return d["source"].__class__ if "source" in d else type(self)  # (unpickling: no source yet)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # By type(self): object's own checks __class__ (pickle refused the source's: "args[0]
        # from __newobj__ args has the wrong class"; protocols 0 and 1 made an object of it).
        getstate = getattr(type(self), "__getstate__", None)  # (Python 3.11 on: object's)
        return _new, (type(self),), (dict(self.__dict__) if getstate is None else getstate(self))

    def __copy__(self) -> "PatchedLoader":
        # As unpatched: the patch of the source's own copy (copy.copy(itertools.cycle(...)) goes
        # on independently of the original, a list's copy is a new list). Copied by default, the
        # wrapper shared its source: next() on the copy took the original's batches. A source
        # that cannot be copied (a generator) says so, as unpatched. Nothing else is the copy's:
        # a pass next() began is the original's, the DataLoader found in it is looked up again.
        import copy

        source = copy.copy(self.source)
        original = source if self.original is self.source else copy.copy(self.original)
        return type(self)(source, original)

    def __repr__(self) -> str:
        return f"trainkit.patch({self.source!r})"


def _new(cls: type) -> Any:
    """A patched loader of class ``cls`` whose state is set next (unpickling, deepcopy)."""
    return object.__new__(cls)


def _enclosing(outer: Any, s: Any) -> Any:
    """The step of what comes after a pass (``_batch_step``): that of the batch in whose loop
    body the pass ran, when no step ended since it began (a validation inside the training
    loop: its values go with the training batch's, as with an unpatched validation loader);
    else None, the step in progress (after an epoch's loop, or an inner loop that trained)."""
    if outer is not None and outer[0] is s and outer[2] == s.step:
        return outer[1]
    return None


def _in_a_wait() -> bool:
    """Whether the pass of the calling ``PatchedLoader.__iter__`` begins inside another patched
    loader's wait (its ``next(it)``), found on the stack: a pass begins at its first batch, so its
    generator was resumed from the code that fetches it. A pass run in the body of another's loop
    (a validation nested in the training loop) is not: the outer generator is suspended there."""
    frame = sys._getframe(2)  # what resumed the generator (C iterators between leave no frame)
    while frame is not None:
        if frame.f_code is _ITER_CODE:
            return True
        frame = frame.f_back
    return False


_INF = float("inf")
_OWN = frozenset(("source", "original", "_dataloader", "_next_pass", "_next_lock"))  # the wrapper's own
_NO_WORK = (BATCH_REC, GC_MS, GC_FULL)  # records that no loop body made: waits, collections


_ITER_CODE = PatchedLoader.__iter__.__code__


class _EvalItems(ItemsCounter):
    """The items of a pass begun under ``torch.no_grad()``: counted only where batches are the
    session's steps (an evaluation, inference); beside training, None (no training items: the
    wait still goes to the step in progress, whose wall time holds the pass)."""

    __slots__ = ()

    def __call__(self, batch: Any) -> Any:
        s = _S._active
        if s is not None and (s._batches_are_steps or not _patched.data):
            n = super().__call__(batch)
            self.first = False  # the loader's inline count would skip this check
            return n
        return None


def _left_unused(s: Any, t0: float, quick: bool) -> bool:
    """The loop is left while the step of the batch whose wait began at ``t0`` is in progress
    (no step ended since its hand-out): whether no loop body ran for that batch. Unused, it makes
    no step (batches are steps), and its items leave the step in progress; used, its items stay
    there (training: the step after the loop, an accumulation window's partial last one, has it).

    From in here a break at the top of the body and one at its bottom look alike (the generator
    is closed at the same ``yield``). What tells them apart:

    - a patched loader's pass ended since the batch was handed out (``_batch_step`` is None): a
      loader zipped with this one ran out, and zip's unpaired batch fed no body (a pass nested
      in the body gives the batch its step back at its end, see ``_enclosing``);
    - else nothing was recorded since (no region, ``s.log``, ``to_device`` copy), and the loop
      was left ``quick`` (sooner than half the quickest earlier body of the pass; always, for a
      pass's first batch): a break at the top, zip with a shorter plain iterable. The limit: a
      body that records nothing and breaks after its work in that little time is taken for
      unused (a region around its work makes it count); one that took an earlier body's time is
      counted, which a break at the top of near-empty bodies (a loader timed alone) is too.
    """
    if s._batch_step is None:  # set by a pass's end (or a loop left) since this batch's hand-out
        return True
    if not quick:
        return False
    buf = s._buf
    i = -1
    try:
        while True:  # from the newest record back to this batch's; the writer takes the oldest
            rec = buf[i]
            if rec[0] is BATCH_REC and rec[2] is t0:
                return True
            if rec[0] not in _NO_WORK or rec[1] != s.step:
                return False
            i -= 1
    except IndexError:  # the writer has taken it: it ran meanwhile, so the body took a while
        return False


class SizedPatchedLoader(PatchedLoader):
    """A :class:`PatchedLoader` of a source with ``len()`` (a source without has no ``__len__``
    here either: ``len()``, ``bool()`` and ``collections.abc.Sized`` answer as on the source)."""

    def __len__(self) -> int:
        return len(self.source)
