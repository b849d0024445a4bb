"""The buffer behind a session, and the writer thread that turns it into TensorBoard events.

The hot path only appends ``(tag, step, value)`` tuples (and two compound records: the record
format is :mod:`trainkit._tags`) to a ``deque`` (atomic under the GIL, no lock). ``value`` is a
float or a pending object (:mod:`trainkit.timing`) resolved later. The writer thread wakes when
the session asks (every ``log_every`` steps) or every ``flush_secs``, groups records by step,
combines the values of one tag within a step (sums for times spent, the mean for user values)
and derives rates (throughput, bandwidth; :mod:`trainkit._steps`), and writes one event per
completed step.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Deque, Dict, Optional

from . import _env, _unstepped, timing
from .sinks import tensorboard as _tb
from .sinks.tensorboard import EventFileWriter
from ._runfile import META_VERSIONS, versions, warn_lost
from ._steps import add_value as _add, combine_step as _combine_step, derive, take_pass_end
# The record format lives in trainkit._tags; everything that records imports it from here.
from ._tags import (AMP_SCALE, AMP_SKIPPED, BATCH_REC, CLOSURE_MS, COMPILE_RECOMPILES,
                    COMPILE_SECONDS, DATA_WAIT, GC_FULL, GC_MS, H2D_BYTES, H2D_GBPS, H2D_MS,
                    H2D_PINNED_BYTES, H2D_PINNED_PCT, ITEMS, OWN_TAGS, PASS_END_WAIT, PREFIX,
                    REGION, SAMPLES_PER_S, STEP_END, STEP_REC, STEP_TIME, UPDATE_MS)

__all__ = ["Recorder", "AMP_SCALE", "AMP_SKIPPED", "BATCH_REC", "CLOSURE_MS", "COMPILE_RECOMPILES",
           "COMPILE_SECONDS", "DATA_WAIT", "GC_FULL", "GC_MS", "H2D_BYTES", "H2D_GBPS", "H2D_MS",
           "H2D_PINNED_BYTES", "H2D_PINNED_PCT", "ITEMS", "OWN_TAGS", "PASS_END_WAIT", "PREFIX",
           "REGION", "SAMPLES_PER_S", "STEP_END", "STEP_REC", "STEP_TIME", "UPDATE_MS"]


class Recorder:
    """Buffer + writer thread + event file of one session (one rank)."""

    def __init__(self, logdir: str, *, flush_secs: float, completed: Callable[[], int],
                 sample: Optional[Callable[[bool], Dict[str, float]]] = None,
                 sample_secs: float = 1.0, resumed_at: Optional[int] = None) -> None:
        self.buf: Deque[Any] = collections.deque()
        #: ``(tag, step, text)`` text summaries to write (a patched DataLoader's settings, once
        #: per session): written by the next flush, in the writer thread
        self.meta: Deque[Any] = collections.deque()
        #: Steps completed so far (the session counts them); later ones may still be recording.
        self.completed = completed
        self.flush_secs = flush_secs
        self._sample = sample
        self._sample_secs = sample_secs
        self._next_sample = 0.0
        self._sampled_step = 0  # the step the last system sample went under
        self._completed_at_last_wake = -1
        self._done0 = completed()  # steps done before this session
        #: of the session's first step, while none is counted: tag -> values written ahead
        #: (trainkit._unstepped), and at the close, every value it got if none was counted
        self.unstepped: Dict[str, int] = {}
        self._open: Dict[int, Dict[str, Any]] = {}  # step -> tag -> value, or a list of them
        #: called once, by the writer thread, at its first wake after a step of this session
        #: completed (a check that needs the run under way); None: none, or done
        self.once: Optional[Callable[[], None]] = None
        #: whether the step in progress is one the session is going to count, so that more
        #: values may still join it (see :meth:`_flush_rest`); set by the session
        self.steps_coming: Callable[[], bool] = _never
        self._lock = threading.RLock()  # re-entrant: a SIGTERM handler may flush mid-flush
        self._wake = threading.Event()
        self._stop = False
        # perf_counter -> wall clock, for each step event's wall_time.
        self._wall0, self._perf0 = time.time(), timing.now()
        self.writer = EventFileWriter(logdir, resumed_at=resumed_at)
        # The file is trainkit's from its first write: a run killed before its first flush (a
        # SIGKILL, the OOM killer while the model loads) is still a run that counted no steps
        # for the analysis (TA110) and the tab, not a folder of somebody else's event files.
        self.writer.write_text(META_VERSIONS, versions(), step=0)
        self.writer.flush()
        self.failed: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="trainkit-writer", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Have the writer write now (the session calls it every ``log_every`` steps)."""
        self._wake.set()

    # -- writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            # Woken by the session (every log_every steps) or by the clock. The last completed
            # step may still get the value logged just after its optimizer.step(), so it is kept
            # back while steps go on, and written at the first wake after they stall (which,
            # with the clock, bounds what a SIGKILL loses).
            woken = self._wake.wait(min(self.flush_secs, self._sample_secs))
            self._wake.clear()
            if self._stop:
                break
            completed = self.completed()
            once = self.once
            if once is not None and completed > self._done0:
                self.once = None
                try:
                    once()
                except Exception:  # a check: never the writer's end
                    pass
            stalled = not woken and completed == self._completed_at_last_wake
            self._completed_at_last_wake = completed
            if self.failed is None:  # else s.flush() failed, in the training thread
                try:
                    self.flush(final=False, slack=0 if stalled else 1,
                               stalled=stalled and completed == self._done0)
                except BaseException as exc:  # keep the training alive; close() re-raises nothing
                    self._failed(exc)
            if self.failed is not None:
                # Records go nowhere now; they must not pile up for the rest of the run.
                while not self._stop:
                    self._wake.wait(min(self.flush_secs, self._sample_secs))
                    self._wake.clear()
                    self.buf.clear()
                return

    def flush_now(self) -> None:
        """``s.flush()`` (a SIGTERM's too): a failed write is said once, never raised into the
        training (out of the SIGTERM handler, it skipped the user's own handler)."""
        if self.failed is None:
            try:
                self.flush(final=False)
            except Exception as exc:  # a full disk
                self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        if self.failed is None:  # said once
            self.failed = exc
            warn_lost(self.writer.path, exc, "what is recorded from now on is dropped")

    def flush(self, *, final: bool, slack: int = 0, stalled: bool = False) -> None:
        """Write every completed step (every step, waiting for the GPU, when ``final``).

        ``slack``: how many of the last completed steps to keep back for a later write.
        ``stalled``: no step completed yet, none since the last wake (see :meth:`_write_ahead`).

        This runs in the writer thread while the training thread waits for the GIL now and then,
        so it is written for speed: one pass over the records, floats taken as they are, and a
        completed step written once a record ``_BEHIND`` steps later shows up. Records come
        nearly in step order, not quite: a region after a GAN's first ``optimizer.step()`` goes
        under the step in progress, the second optimizer's update inside it under the step just
        ended (and ``s.log(..., step=k)`` goes anywhere); a step ``_BEHIND`` steps back gets no
        more records from the loop. Holding every step of
        the pass at once instead (seconds of steps, a dict and a list per tag each) had Python's
        GC promote them by the ten thousand, which brought on full collections costing the
        training thread ~10-20 us a step.
        """
        with self._lock:
            self.writer.reopen_if_deleted()  # before the pass: its records go to a file kept
            # Read before taking records: every record of a step up to here is in the buffer.
            done = self.completed()
            completed = done - slack
            buf, opened = self.buf, self._open
            if _fast is not None:  # the same pass, and the writes, in C (trainkit/_speedups.c)
                ctx = (self.writer, self._wall0, self._perf0, time.time)
                _fast.ingest(buf, opened, completed, final, ctx)
                _fast.write_steps(opened, completed, final, ctx)
                self._flush_rest(done, final, stalled)
                return
            pop = buf.popleft
            add: Any = {}.setdefault
            # The records there now; the final flush takes every one (the session's buffer is
            # closed by then, but a thread may still be putting one it was about to put).
            for _ in (iter(buf.__len__, 0) if final else range(len(buf))):
                try:
                    rec = pop()
                except IndexError:  # a signal handler's flush, run inside this one, took them
                    break
                tag, step = rec[0], rec[1]
                tags = opened.get(step)
                if tags is None:
                    if opened:  # steps far enough behind this one are complete: written now
                        self._write_steps(min(completed, step - _BEHIND), False)
                    tags = opened[step] = {}
                    add = tags.setdefault
                elif add.__self__ is not tags:
                    add = tags.setdefault
                # A tag's first value in a step is stored as it is, a second one (rarer) turns
                # it into a list (_add). The values computed here are new floats, so setdefault
                # (one C call) tells by identity whether it stored them; a recorded value may be
                # a shared object (a small int, a float logged twice), so it is looked up.
                if tag is STEP_REC:
                    v = (rec[3] - rec[2]) * 1e3
                    if add(UPDATE_MS, v) is not v:
                        _add(tags, UPDATE_MS, v)
                    v = rec[3]
                    if add(STEP_END, v) is not v:
                        _add(tags, STEP_END, v)
                    if type(rec[4]) is float:
                        v = (rec[3] - rec[4]) * 1e3
                        if add(STEP_TIME, v) is not v:
                            _add(tags, STEP_TIME, v)
                elif tag is BATCH_REC:
                    v = (rec[3] - rec[2]) * 1e3
                    if add(DATA_WAIT, v) is not v:
                        _add(tags, DATA_WAIT, v)
                    if rec[4] is not None:
                        v = float(rec[4])
                        if add(ITEMS, v) is not v:
                            _add(tags, ITEMS, v)
                elif tag in tags:
                    _add(tags, tag, rec[2])
                else:
                    tags[tag] = rec[2]
            self._write_steps(completed, final)
            self._flush_rest(done, final, stalled)

    def _flush_rest(self, done: int, final: bool, stalled: bool = False) -> None:
        """What a flush writes after the steps (under its lock): values logged far ahead, text
        summaries, system metrics."""
        if not final:
            near = done + 1 + _BEHIND
            # Stalled before any step was counted: the steps ahead are written, and the one in
            # progress too unless the session is going to count it (an accumulation window's
            # first micro-batches, a slow first batch): written now, it would show as one point
            # for what it held so far, and another one at its end. Of that step, the tags that
            # run ahead of it (logged by step=, an RL warm-up's rewards by environment step)
            # are written all the same: no more comes to it of them.
            if stalled and self.steps_coming():
                self._write_running_ahead(done + 1)
                self._write_ahead(done + 1, near)
            else:
                self._write_ahead(done if stalled else near, near)
        while self.meta:
            tag, step, text = self.meta.popleft()
            self.writer.write_text(tag, text, step=step)
        if self._sample is not None and (final or timing.now() >= self._next_sample):
            # Under the last completed step (the first, before it ends), once a step: samples
            # went under step 0, which no chart has, and several under one slow step. A sample
            # not taken leaves the load to the next one, which measures since the last taken.
            step = max(1, self.completed())
            if step != self._sampled_step:
                self._next_sample = timing.now() + self._sample_secs
                self._sampled_step = step
                self.writer.write_scalars(step=step, values=self._sample(final))
        self.writer.flush()

    def _write_steps(self, completed: int, final: bool) -> None:
        """Write the open steps in order, up to ``completed`` (all when ``final``); stop at the
        first whose GPU values are not ready (steps stay in order)."""
        opened = self._open
        write = self.writer.write_scalars
        for step in sorted(opened):
            if not final and step > completed:
                break
            # Taken out before it is written: a flush run inside this one (a signal handler's)
            # neither writes it again nor finds it gone.
            tags = opened.pop(step, None)
            if tags is None:
                continue
            if PASS_END_WAIT in tags and not take_pass_end(tags, step <= completed):
                continue  # the wait ending the last pass, in a step never counted: no point
            combined = _combine_step(tags, final)
            if combined is None:
                opened[step] = tags
                break  # the GPU has not got there yet; keep steps in order
            end = combined.get(STEP_END)
            wall = time.time() if end is None else self._wall0 + (end - self._perf0)
            write(step=step, values=derive(combined), wall_time=wall)

    def _write_running_ahead(self, step: int) -> None:
        """Write the values of the open ``step`` (the first, in progress) whose tags a later open
        step holds too: logged by ``step=`` ahead of the count, they get no more values here; the
        rest waits for the step's end (see :meth:`_flush_rest`)."""
        opened = self._open
        tags = opened.get(step)
        if not tags:
            return
        later = set()
        for n, more in opened.items():
            if n > step:
                later.update(more)
        ahead = {t: tags[t] for t in tags if t in later and not t.startswith(OWN_TAGS)}
        if not ahead:
            return
        combined = _combine_step(dict(ahead), False)
        if combined is None:  # a CUDA value not ready yet: a later flush writes it
            return
        for t in ahead:
            del tags[t]
        if not tags:
            del opened[step]
        if step == self._done0 + 1:  # no step counted yet: said at close
            _unstepped.add(self.unstepped, ahead)
        self.writer.write_scalars(step=step, values=derive(combined), wall_time=time.time())

    def _write_ahead(self, after: int, near: int) -> None:
        """Write the open steps past ``after``, ``_BEHIND`` steps past the one in progress: only
        ``s.log(..., step=k)`` files there (an RL loop's episode reward by environment step, which
        runs ahead of the optimizer's count), and waiting for the steps to catch up held them back
        until the session closed (nothing shown meanwhile, all lost to a SIGKILL). A value logged
        there later is written by a later flush, as one logged under an earlier step is; a step
        just ahead (a value known for the next step) still waits to join that step's event.

        While no step has been counted yet (``after`` < ``near``), the values the user logged in
        the steps up to ``near`` are written too, trainkit's own (a collection's ``gc_ms``) kept
        back: with nothing patched (values logged by ``step=`` alone) they, and by the rule below
        every later step of their tags, were held until the close (none shown, all lost to a
        SIGKILL), also when one collection put ``gc_ms`` in their step.

        Each tag's steps stay in order in the file: TensorBoard's data server takes a step that
        goes back as a restart and drops the tag's points from there on. So a step is not written
        ahead while an earlier open step, held back, holds one of its tags."""
        opened = self._open
        ahead = sorted(n for n in opened if n > after)
        if not ahead:
            return
        held: set = set()
        for n in opened:
            if n <= after:
                held.update(opened[n])
        for step in ahead:
            tags = opened[step]
            own = [t for t in tags if t.startswith(OWN_TAGS)] if step <= near else []
            if not held.isdisjoint(tags) or (own and (after == near or len(own) == len(tags))):
                held.update(tags)
                continue
            kept = {t: tags.pop(t) for t in own}  # no step counted: trainkit's own wait
            combined = _combine_step(tags, False)
            if combined is None:  # a CUDA value not ready yet: a later flush writes it
                tags.update(kept)
                held.update(tags)
                continue
            if kept:
                opened[step] = kept
                held.update(kept)
            else:
                del opened[step]
            if step == self._done0 + 1 and after < near:  # no step counted yet: said at close
                _unstepped.add(self.unstepped, tags)
            end = combined.get(STEP_END)
            wall = time.time() if end is None else self._wall0 + (end - self._perf0)
            self.writer.write_scalars(step=step, values=derive(combined), wall_time=wall)

    def close(self) -> None:
        """Stop the thread, write everything recorded, close the file. Idempotent."""
        if self._stop and self.writer._file is None:
            return
        self._stop = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            # flush_secs=1e10 made it raise OverflowError (over the user's error), unwritten
            self._thread.join(timeout=min(max(5.0, self.flush_secs * 2), threading.TIMEOUT_MAX))
        with self._lock:
            try:  # no step counted: what its one step holds (said by the session, at best)
                self.unstepped = (_unstepped.tally(self.unstepped, self._done0 + 1, self._open,
                                                   list(self.buf))  # a copy: another thread
                                  if self.completed() == self._done0 else {})  # may append
            except Exception:  # never in the way of the final write
                self.unstepped = {}
            try:
                if self.failed is None:
                    self.flush(final=True)
                self.writer.close()
            except Exception as exc:  # a full disk: said, not raised over the user's own error
                self.buf.clear()
                self._open.clear()
                if self.failed is None:
                    self.failed = exc
                    warn_lost(self.writer.path, exc, "the run's last records are lost")
                try:
                    self.writer.close()
                except Exception:  # closed as far as it can be
                    f, self.writer._file = self.writer._file, None
                    try:
                        if f is not None:
                            f.close()
                    except Exception:
                        pass


def _never() -> bool:
    return False


#: A flush writes a completed step early, mid-pass, once a record this many steps later shows up.
_BEHIND = 8


def _load_speedups() -> Any:
    """``trainkit._speedups`` (C: the writer's pass and writes, and more), set up; None where it
    was not built (no C compiler at install) or ``TRAINKIT_PURE_PYTHON=1``."""
    if _env.get(_env.PURE_PYTHON) not in (None, "0"):
        return None
    try:
        from . import _speedups
    except ImportError:
        return None
    _speedups.setup((STEP_REC, BATCH_REC, UPDATE_MS, STEP_END, STEP_TIME, DATA_WAIT, ITEMS,
                     SAMPLES_PER_S, H2D_BYTES, H2D_PINNED_BYTES, PASS_END_WAIT),
                    (_combine_step, derive, _tb._prefix, _tb._value_prefix, _BEHIND,
                     take_pass_end))
    return _speedups


#: The C module doing :meth:`Recorder.flush`'s pass and :meth:`Recorder._write_steps` (the same
#: bytes; ~3 us instead of ~9 us a step of 6 records, timed alone), and the regions' entry and
#: exit and the patched step's fast path; or None: the Python code does it all.
_fast: Any = _load_speedups()
