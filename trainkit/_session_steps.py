"""How a session counts its steps: a real optimizer step ends one, or, where a patched loader's
batches are the steps (an evaluation), the next batch or the end of the pass does.

The part of :class:`trainkit.session.Session` the techniques call on the hot path (the patched
optimizer's step, the patched loader's batches); the session holds the state it reads.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from . import timing
from .recorder import STEP_END, STEP_TIME


class StepCounter:
    """The step count of a :class:`trainkit.session.Session` (its base class)."""

    step: int
    _batch_pending: bool
    _batch_step: Optional[int]
    _batches_are_steps: bool
    _buf: Any
    _cuda_device: Optional[int]
    _last_step_end: Any
    _last_step_host: Optional[float]
    _log_every: int
    _profiler: Any
    _wake: Callable[[], None]

    def end_batch_step(self, end: float, event: Any = None) -> None:
        """A pass over a patched loader whose batches are steps ended (or was left): its last
        step ends at the host time ``end`` (at ``event``, or a CUDA event recorded now, once CUDA
        is in use), and what is logged next goes under the step in progress, not that batch's."""
        if self._batch_pending:
            self._batch_pending = False
            self._batch_step = None
            if event is None and timing.cuda_in_use():
                try:
                    event = timing.cuda_event(timing.steps_device(self._cuda_device))
                except RuntimeError:  # a CUDA error that sticks (the user's failing step): the
                    pass  # step ends on the host clock, and the user's error is the one raised
            self.step_done(end if event is None else event)

    def optimizer_steps_from_here(self) -> None:
        """A patched optimizer's step() is called in a session whose batches were its steps
        (training after an evaluation): the batch in progress, if any, is the first training
        step, and the optimizer counts the steps from now on."""
        self._batches_are_steps = False
        if self._batch_pending:
            self._batch_pending = False  # its step goes on as a training step
        else:  # no patched loader feeds the training: its values go under the step in progress
            self._batch_step = None

    def step_done(self, end: Any) -> None:
        """A real optimizer step ended at ``end`` (perf_counter, or a CUDA event)."""
        last = self._last_step_end
        step = self.step
        if isinstance(end, float):
            if last is not None and not isinstance(last, float):
                last = self._last_step_host  # a CUDA event began it: its host time (CPU params)
            if last is not None:
                self._buf.append((STEP_TIME, step, (end - last) * 1e3))
            host = end
        else:
            host = timing.now()  # the host time of a step that ends at a CUDA event
            if last is not None and not isinstance(last, float) \
                    and timing.event_device(last) != timing.event_device(end):
                # Begun on another device (the first step's data wait, before the steps' device
                # was known): timed on the host, as events of two devices cannot be compared.
                last = self._last_step_host
            if isinstance(last, float):
                self._buf.append((STEP_TIME, step, (host - last) * 1e3))
            elif last is not None:  # the next step's interval starts at `end`, and gives it back
                self._buf.append((STEP_TIME, step, timing.PendingInterval(last, end,
                                                                         release_end=False)))
        self._buf.append((STEP_END, step, host))
        self._last_step_end = end
        self._last_step_host = host
        self.step = step + 1
        if step % self._log_every == 0:
            self._wake()
        if self._profiler is not None:
            self.profiler_step()

    def profiler_step(self) -> None:
        """Step the session's profiler: a real step ended. What that takes (at a cycle's end:
        stopping it, writing and compressing its trace, tens of ms) is trainkit's work, not the
        user's: on the host clock the next step's ``step_time_ms`` begins after it. (It made the
        step after each cycle 34-48 ms in a loop of 2.7 ms steps, in no trace, and its mean
        2.5x.) On a GPU, where the device idles meanwhile, the next step is timed from a CUDA event
        recorded after it, when it took over a millisecond (a cycle's end: the event a step takes
        otherwise is not worth it)."""
        t0 = timing.now()
        self._profiler.step()
        spent = timing.now() - t0
        end = self._last_step_end
        if end.__class__ is float:
            # moved by what the profiler took, not to now: a step ended by the next batch's wait
            # (batches are steps) is ended once that batch came, and the wait is the next step's
            self._last_step_end = end + spent
        elif end is not None and spent > 1e-3 and not self._batches_are_steps:
            # (where batches are steps the event is the wait's start, which a new one would drop)
            try:  # the step's own end stays its interval's (which never gives it back)
                self._last_step_end = timing.cuda_event(timing.event_device(end))
            except RuntimeError:  # a CUDA error that sticks: the next step ends as it can
                return
            self._last_step_host = timing.now()

    def _steps_coming(self) -> bool:
        """Whether the step in progress is one this session is going to count: a patched loader
        handed out its batch, or an optimizer patched for this session has yet to step (asked
        by the writer thread: :func:`trainkit.patch.stepped_elsewhere` reads a copy of the set)."""
        if self._batch_step is not None:
            return True
        from .patch import _patched, stepped_elsewhere

        return bool(_patched) and not stepped_elsewhere(self)
