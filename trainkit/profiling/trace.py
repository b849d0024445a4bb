"""torch.profiler driven by the patched optimizer's steps.

The session calls :meth:`Tracer.step` at each real optimizer step, so the user's loop needs no
``prof.step()``. Traces land in the session's logdir in the layout of torch.profiler's
``tensorboard_trace_handler`` (``<worker>.<time>.pt.trace.json[.gz]``), one file per cycle and
rank, which is what torch-tb-profiler and trainkit's own tab read.

A trace's size is bounded by the schedule: only the ``active`` steps of each of the ``repeat``
cycles are written, without shapes, stacks or memory events (each of those multiplies the size).

A session that closes during a cycle (the loop ended inside it) ends the ``ProfilerStep`` range
torch opened at the last step, which holds what ran after that step: an evaluation after the
loop, a checkpoint. It is no training step, so the trace written then names it
``trainkit/after_last_step``, and a trace left with no training step is said to be one.

torch numbers the steps ``ProfilerStep#0``, ``#1``... from the session's start (the count goes on
across the cycles of ``repeat``, as the profiler is stepped at each step in between), trainkit
from the session's ``steps_done`` + 1: ``ProfilerStep#N`` is trainkit's step N + steps_done + 1
(``trainkit/step_time_ms``, ``s.log``), N + 1 in a session not resumed, as each trace's
top-level ``"trainkit"`` metadata says (``step_offset``). That metadata also names the session
writing the trace: its event file's name (``session_file``), by which the analysis tells which
session of a folder holding several wrote it, where clock times cannot (two sessions writing into
one folder at once, a relaunch on a machine whose clock differs). torch before 2.1 has no
``preset_metadata_json``: its traces record neither, and are read by clock times.

torch runs one profiler at a time: a second one started while one records cancels it, and the
first one's stop then ends the second. So a session refuses ``profile=`` while a profiler of the
user's records, and the tracer stands down, with a warning, when it finds one of the user's
recording at a step where its own would start (it cannot tell one started during its own
active window: there the user's profiler and trainkit's cycle both lose their events). Older torch
(2.11) does not cancel a profiler that warms up: it refuses the second one's start instead
("Can't disable Kineto profiler when it's not running"), so there the user's profiler started
during trainkit's warmup fails at its start.
"""
from __future__ import annotations

import gzip
import json
import os
import socket
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._text import say, user_stacklevel
from .regions import profiler_check, profiler_enabled
from .tracestats import AFTER_LAST_STEP, SESSION_FILE, STEP_OFFSET, STEP_PREFIX, TRACE_META

#: The suffixes of a trace file, plain or gzip-compressed.
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
#: torch's warning when a cycle after the first starts; trainkit writes one trace per cycle, so
#: nothing is lost and the advice (acc_events=True) does not apply. Older torch has no space
#: after "cycle.".
_CLEARS_EVENTS = "Profiler clears events at the end of each cycle"
#: torch's warning for a schedule with warmup=0, which trainkit says itself at the user's line.
_NO_WARMUP = "Profiler won't be using warmup"


def is_trace(name: str) -> bool:
    """True for a file name torch.profiler's TensorBoard handler writes."""
    return name.endswith(TRACE_SUFFIXES)


def worker_name(rank: Optional[int]) -> str:
    """``<host>_<pid>[_rank<N>]``: unique per process, so ranks and reruns never overwrite."""
    return f"{socket.gethostname()}_{os.getpid()}" + ("" if rank is None else f"_rank{rank}")


def profiler_recording() -> bool:
    """True while some torch profiler records (torch's Python-side flag or its C one)."""
    return profiler_enabled() or bool(profiler_check()())


def check_no_profiler(schedule: Any) -> None:
    """Refuse to profile while a profiler of the user's records: starting trainkit's would cancel it.

    Raises:
        RuntimeError: naming the schedule and the two ways out.
    """
    if profiler_recording():
        raise RuntimeError(
            f"session(profile={schedule!r}): a torch profiler is already recording (a "
            f"torch.profiler.profile() entered before the session), and torch runs one at a time: "
            f"trainkit's would cancel yours and its events would be lost. Drop profile= (your "
            f"profiler still shows trainkit's steps and regions), or stop your profiler before "
            f"the session starts")


def _warn(message: str) -> None:
    """A UserWarning pointing at the first line outside trainkit and torch (the user's step or
    ``with``; the profiler calls its trace handler from its own step)."""
    warnings.warn(message, UserWarning, stacklevel=user_stacklevel(past_torch=True))


def _say(message: str) -> None:
    """:func:`_warn` for what trainkit's tracing goes on without (a trace not written, traces
    given up for the user's profiler): shown, never raised, where warnings are errors (``python
    -W error``). Raised inside ``optimizer.step()``, it stopped the training."""
    say(message, UserWarning, stacklevel=user_stacklevel(past_torch=True))


_profile_class: Any = None


def _quiet_profile() -> Any:
    """torch.profiler.profile without its warning that a new cycle clears the last one's events."""
    global _profile_class
    if _profile_class is None:
        import torch.profiler.profiler as tpp

        class _Profile(tpp.profile):
            def prepare_trace(self) -> None:
                # torch warns once per process (its _warn_once set): what this hides is put back
                # out of that set, so a profiler of the user's still warns.
                shown = getattr(tpp, "_WARNINGS_SHOWN", None)
                before = set(shown) if isinstance(shown, set) else None
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*" + _CLEARS_EVENTS)
                    super().prepare_trace()
                if before is not None:
                    shown.difference_update([m for m in shown - before
                                             if isinstance(m, str) and _CLEARS_EVENTS in m])

        _profile_class = _Profile
    return _profile_class


class Tracer:
    """One torch.profiler run for one session, stepped by the session at each real step.

    Records CPU activity, and CUDA activity when a GPU is available. ``traces`` lists the files
    written so far (one per completed cycle); ``steps`` counts the steps seen. ``steps_done``:
    the run's steps before this session's (a resumed session's), which trainkit's step numbers
    count and torch's do not. ``session_file``: the event file of the session (its name is
    recorded in each trace).

    Example::

        t = Tracer("runs/p", tk.ProfileSchedule(wait=1, warmup=1, active=2))
        for _ in range(4):
            train_one_step(); t.step()
        t.close(); print(t.traces)
    """

    def __init__(self, logdir: str, schedule: Any, *, rank: Optional[int] = None,
                 steps_done: int = 0, session_file: Optional[str] = None) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity
        from torch.profiler import schedule as make_schedule

        check_no_profiler(schedule)
        activities: List[Any] = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.logdir = logdir
        self.schedule = schedule
        self.gzip = bool(getattr(schedule, "gzip", False))
        self.traces: List[str] = []
        self.steps = 0
        self.steps_done = steps_done
        self._unwritten = 0  # cycles that ended, their trace not written (said at each)
        # At close, during a cycle: the ProfilerStep torch opened at the last step, which holds
        # what ran after it (no step of the training), renamed in the trace written then
        self._tail: Optional[str] = None
        # Before these steps the profiler idles or warms up (a profiler found recording then is
        # the user's); from the last one on, the schedule has nothing left to record.
        self._idle = (ProfilerAction.NONE, ProfilerAction.WARMUP)
        self._none = ProfilerAction.NONE
        self._end = (schedule.wait + schedule.warmup + schedule.active) * schedule.repeat
        with warnings.catch_warnings():
            # torch's warning would point at this line: said below at the user's, with the fix
            warnings.filterwarnings("ignore", message=_NO_WARMUP)
            steps = make_schedule(wait=schedule.wait, warmup=schedule.warmup,
                                  active=schedule.active, repeat=schedule.repeat)
        if schedule.warmup == 0:
            _warn(f"trainkit: tk.session(profile={schedule!r}) has no warm-up step: the profiler "
                  f"starts recording at the first active step, whose times then include its "
                  f"start-up (torch warns that this can skew the results); one warm-up step "
                  f"avoids it, e.g. ProfileSchedule(wait={schedule.wait}, warmup=1, "
                  f"active={schedule.active})")
        self._prof: Any = _quiet_profile()(
            activities=activities,
            schedule=steps,
            on_trace_ready=self._writer(worker_name(rank)),
            # Shapes, stacks and memory events each multiply a trace's size; the findings and
            # the tab need none of them.
            record_shapes=False,
            with_stack=False,
            profile_memory=False,
        )
        # torch numbers its ProfilerStep#N from 0 as the profiler starts, trainkit its steps from
        # steps_done + 1 (step_time_ms, s.log): each trace says how one maps to the other, at
        # its top level, and which session's event file holds those steps
        offset = steps_done + STEP_OFFSET
        preset = getattr(self._prof, "preset_metadata_json", None)  # torch 2.1 and later
        if preset is not None:
            meta: Dict[str, Any] = {"step_offset": offset, "about": (
                f"ProfilerStep#N is trainkit step N + {offset} (as trainkit/step_time_ms "
                f"and s.log number them); {AFTER_LAST_STEP} is what ran after the session's last "
                f"step, no step")}
            if session_file:
                meta[SESSION_FILE] = os.path.basename(session_file)
            # Kineto writes the value as it is, less its backslashes: a host's name that is not
            # ASCII stays UTF-8, not a \u escape
            preset(TRACE_META, json.dumps(meta, ensure_ascii=False))
        self._prof.__enter__()
        self._closed = False
        #: while close(said) runs: where its warnings go, for the session to give at its end
        self._said: Optional[List[Tuple[Optional[str], type]]] = None

    def _writer(self, worker: str) -> Callable[[Any], None]:
        from torch.profiler import tensorboard_trace_handler

        handler = tensorboard_trace_handler(self.logdir, worker_name=worker, use_gzip=self.gzip)

        def on_ready(prof: Any) -> None:
            # Called inside the step that ends a cycle: a failure here is said, never raised
            # into the training. A folder removed mid-run is made again (the handler does).
            try:
                before = set(os.listdir(self.logdir)) if os.path.isdir(self.logdir) else set()
                handler(prof)
                after = set(os.listdir(self.logdir))
            except Exception as exc:
                self._unwritten += 1
                _say(f"trainkit: a profiler trace of step {self._step} could not be written to "
                     f"{self.logdir!r} ({type(exc).__name__}: {exc}); the training goes on, "
                     f"and the next cycle is tried again. Fix the folder (or free some space)")
                return
            written = sorted(os.path.join(self.logdir, f) for f in after - before if is_trace(f))
            if self._tail is not None:
                for path in written:
                    self._rename_tail(path, self._tail)
            self.traces.extend(written)

        return on_ready

    @property
    def _step(self) -> int:
        """The last step seen, numbered as trainkit/step_time_ms numbers it (what a user looks
        up), where ``steps`` counts this session's alone."""
        return self.steps_done + self.steps

    def step(self) -> None:
        """One real optimizer step ended."""
        self.steps += 1
        prof = self._prof
        if prof is None:
            return
        action = prof.current_action
        if action is self._none and prof.step_num >= self._end:
            return  # every cycle is written: nothing left to start or stop
        if action in self._idle and profiler_recording():
            self._stand_down("at step %d" % self._step)
            return
        prof.step()

    def _stand_down(self, when: str) -> None:
        # Our profiler is idle or only prepared: leave it without __exit__, whose stop (and, from
        # warmup, start) would end the user's recording.
        self._prof = None
        _say(
            f"trainkit: a torch profiler you started is recording {when}, where "
            f"tk.session(profile={self.schedule!r}) would start its own; torch runs one at a "
            f"time, so trainkit writes no more traces in this session to keep yours "
            f"({len(self.traces)} written). Drop profile= when you profile yourself")

    def close(self, said: Optional[List[Tuple[Optional[str], type]]] = None) -> None:
        """Stop the profiler; a cycle still recording is written. Idempotent.

        Args:
            said: where given, the close's warnings (``(message, category)``) go there, for the
                session to give once its own close is done (raised here where warnings are
                errors, one ended the session's close half-way); a failed write is shown.
        """
        if self._closed:
            return
        self._closed = True
        self._said = said
        try:
            self._close()
        finally:
            self._said = None

    def _tell(self, message: str) -> None:
        """Warn of ``message``, or hold it in the ``said`` of :meth:`close`."""
        if self._said is not None:
            self._said.append((message, UserWarning))
        else:
            _warn(message)

    def _close(self) -> None:
        prof = self._prof
        if prof is None:
            return
        if prof.current_action in self._idle and profiler_recording():
            self._stand_down("when the session closes")
            return
        from torch.profiler import ProfilerAction

        if prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            # torch closes the step range it opened at the last step now, at close: what ran
            # since (an evaluation after the loop) would be written as one more training step
            self._tail = f"{STEP_PREFIX}{prof.step_num}"
        prof.__exit__(None, None, None)
        if not self.traces and sys.exc_info()[0] is None:  # an exception says enough on its own
            self._tell(self._why_no_trace())

    def _rename_tail(self, path: str, tail: str) -> None:
        """Rename the range ``tail`` in the trace at ``path`` to :data:`AFTER_LAST_STEP`, and say
        so when no training step is left in it (the session closed before the cycle's first)."""
        opener: Any = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as fh:
                data = json.load(fh)
            events = data.get("traceEvents") if isinstance(data, dict) else None
            if not isinstance(events, list):
                return
            left = set()
            for e in events:
                name = e.get("name") if isinstance(e, dict) else None
                if name == tail:  # the host range and, on a GPU, its gpu_user_annotation
                    e["name"] = AFTER_LAST_STEP
                elif isinstance(name, str) and name.startswith(STEP_PREFIX):
                    left.add(name)
            tmp = path + ".tmp"  # no trace's name: a reader never sees it half-written
            with opener(tmp, "wt", encoding="utf-8") as fh:
                json.dump(data, fh)
            os.replace(tmp, path)
        except (OSError, ValueError, EOFError) as exc:  # a write that failed: shown
            _say(f"trainkit: the work after the last step could not be told apart in the trace "
                 f"{path!r} ({type(exc).__name__}: {exc}): its last ProfilerStep ({tail}) is "
                 f"no training step but what ran after the session's last one")
            return
        if not left:
            self._tell(f"trainkit: the last trace, {os.path.basename(path)!r}, holds no "
                       f"training step: the session closed after step {self._step}, before the "
                       f"first profiled step of the cycle it had started, so the trace holds only "
                       f"what ran after that step (named {AFTER_LAST_STEP!r}). To profile the end "
                       f"of training, end the loop inside a cycle, e.g. one step more or fewer")

    def _why_no_trace(self) -> str:
        s = self.schedule
        head = f"trainkit: tk.session(profile={s!r}) wrote no trace: "
        if self._unwritten:
            return (head + f"{self._unwritten} cycle(s) ended, but their traces could not be "
                    f"written to {self.logdir!r} (said as each ended); fix the folder (or free "
                    f"some space)")
        if self.steps == 0:
            return (head + "the session counted no step, and the schedule counts steps. Let "
                    "trainkit see the steps: tk.patch(optimizer) (each optimizer.step() is one), "
                    "or for batch in tk.patch(loader) (each batch is one when no optimizer steps)")
        return (head + f"the session ended after {self.steps} step(s), before the schedule's "
                f"first profiled one (after wait={s.wait} + warmup={s.warmup} steps); lower "
                f"wait, e.g. ProfileSchedule(wait=0, warmup=1, active={s.active}), or train longer")


def start_profiler(session: Any) -> Tracer:
    """The session's tracer, writing into ``session.logdir``, its traces naming the session's
    event file (opened by its recorder before the profiler starts)."""
    writer = getattr(getattr(session, "_recorder", None), "writer", None)
    path = getattr(writer, "path", None)
    return Tracer(session.logdir, session.profile, rank=session.rank,
                  steps_done=session.steps_done,
                  session_file=path if isinstance(path, str) else None)
