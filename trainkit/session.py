"""The session: the one explicit recorder, and the only global state trainkit keeps.

Every technique records into the active session (``active()``); with none they still work and
record nothing. A session flushes everything recorded on ``close()``, at the end of its ``with``
block (also when an exception leaves it, which then propagates unchanged), at interpreter exit
(which covers an uncaught KeyboardInterrupt, and a multiprocessing child's exit), and on SIGTERM
and SIGHUP, after which the signal is re-raised with the previous handler so that the exit status
is the one the process would have had (:mod:`trainkit._signals`). A forked child records nothing.
"""
from __future__ import annotations

import functools
import json
import numbers
import os
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import _compiled, _signals, _unstepped, timing
from ._logdir import (check_logdir as _check_logdir, default_logdir as _default_logdir, process_rank,
                      ranks_mixed, warn_ranks_mixed)
from ._logvalues import ClosedBuffer, check_log_name, to_scalar
from ._session_args import MAX_STEP, bad_log_step, check_session_args
from ._session_steps import StepCounter
from ._text import close_over, say, say_all, user_stacklevel
from .profiling.schedule import check_session_profile
from .recorder import Recorder

_active: Optional["Session"] = None


def active() -> Optional["Session"]:
    """The active session, or None (for a helper that logs without being handed the session).

    Example::

        tk.active().log("val/accuracy", accuracy)  # inside a tk.session block
    """
    return _active


class Session(StepCounter):
    """Records a run into TensorBoard. Create it with :func:`session`.

    Example::

        with tk.session(logdir="runs/exp1") as s:
            tk.patch(optimizer)
            for x, y in tk.patch(loader):
                loss = criterion(model(x), y)
                loss.backward(); optimizer.step(); optimizer.zero_grad()
                s.log("loss", loss)          # resolved later: no sync here
    """

    def __init__(self, logdir: Optional[Union[str, "os.PathLike[str]"]], *, profile: Any,
                 log_every: int, flush_secs: float, system_metrics: bool,
                 steps_done: int = 0) -> None:
        with _start_lock:  # one session at a time, also when two threads start one at once
            self._start(logdir, profile=profile, log_every=log_every, flush_secs=flush_secs,
                        system_metrics=system_metrics, steps_done=steps_done)

    def _start(self, logdir: Any, *, profile: Any, log_every: int, flush_secs: float,
               system_metrics: bool, steps_done: int) -> None:
        check_session_args(log_every=log_every, flush_secs=flush_secs,
                           system_metrics=system_metrics, steps_done=steps_done)
        self.profile = check_session_profile(profile)
        _check_none_active()
        from .switches import check_overrides

        check_overrides()  # a malformed TRAINKIT_TECHNIQUES fails here, before anything starts
        root = _check_logdir(_default_logdir() if logdir is None else logdir)
        rank = process_rank()
        #: Where this process writes: ``<logdir>/rank<N>`` under torchrun (or in a process group
        #: of several, mp.spawn's), else ``logdir``.
        self.logdir = root if rank is None else _check_logdir(os.path.join(root, f"rank{rank}"))
        self.root = root
        self.rank = rank
        self._pid = os.getpid()
        _tensor_type()  # binds _Tensor, which log() compares against without a call
        _compiled.skip_log_frames()  # torch.compile already in use (a model compiled before the session)
        from .profiling import regions

        regions.load_flags()  # before any compiled code reads them (a rebound global recompiles)
        sampler = None
        if system_metrics:
            from .sinks.system import SystemSampler

            sampler = SystemSampler(self._completed)
        steps_done = int(steps_done)  # a numpy integer too
        self.step = steps_done + 1  # the step in progress; records are filed under it
        # float(): threading's waits refuse a np.float32 (the writer died at its first wait)
        self._recorder = Recorder(self.logdir, flush_secs=float(flush_secs),
                                  completed=self._completed,
                                  sample=sampler, resumed_at=self.step if steps_done else None)
        self._buf = self._recorder.buf
        self._recorder.steps_coming = self._steps_coming
        if rank is None:  # a process group started after this session: said at the first wake
            self._recorder.once = functools.partial(warn_ranks_mixed, root)
        self._log_every = int(log_every)  # a numpy integer too
        self._wake = self._recorder.wake
        # The step of the batch a patched loader handed out last: a loss logged after
        # optimizer.step() belongs to the step that batch fed, not to the next one.
        self._batch_step: Optional[int] = None
        self._names: set = set()  # names s.log has checked (a valid name is checked once)
        self._primary: Any = None  # the first patched optimizer to step: it counts the steps
        #: a patched loader counts its batches as steps: set at the session's first batch when
        #: no optimizer here is going to step (grad mode off, or each patched one last stepped in
        #: another session), until a patched optimizer's step() is called here
        self._batches_are_steps = False
        #: the step of the batch last handed out, counted as a step, has not ended yet
        self._batch_pending = False
        self._last_step_end: Any = None  # perf_counter float, or a CUDA event on a GPU
        #: host time (perf_counter) of the last step's end, for regions where it is a CUDA event
        self._last_step_host: Optional[float] = None
        #: the CUDA device the steps run on (the primary optimizer's parameters', or a
        #: to_device destination before its first step), once known: where the loader's and
        #: the regions' events go. None: not known yet (timing.steps_device guesses).
        self._cuda_device: Optional[int] = None
        self._closed = False
        self._on_close: List[Callable[[], None]] = []
        #: id of a patched DataLoader (as the user passed it) -> [its number, a weak reference
        #: to it, passes begun]: its settings are recorded at its first pass (trainkit._loaderinfo)
        self._loaders: Dict[int, List[Any]] = {}
        self._waiting_optimizers: List[str] = []  # set at the close (_record_optimizers)
        #: technique -> value in force, as read by tk.technique during this session.
        self.techniques: Dict[str, Any] = {}
        self._profiler = None
        try:
            from .profiling import gcwatch
            from .techniques import backends

            self._on_close.append(gcwatch.install(self))
            if self.profile is not None:
                from .profiling.trace import start_profiler

                self._profiler = start_profiler(self)
            _activate(self)
            backends.apply(self)  # tf32 / cudnn_benchmark overrides, restored on close
        except BaseException as exc:  # leave no session, thread or hook half-started
            close_over(self.close, exc, sys._getframe(user_stacklevel() - 1))
            raise

    # -- public ----------------------------------------------------------------------------------
    def log(self, name: str, value: Any, *, step: Optional[int] = None) -> None:
        """Record a user scalar under ``name`` (e.g. ``"loss"``) at the current step.

        The value is filed under the step that the batch last handed out by a patched loader
        feeds while its loop goes on (so logging after ``optimizer.step()`` is right); else, with
        no patched loader or after its loop, under the step in progress.
        Tensors are not read here: a CPU tensor is read at once (no device to wait for), a CUDA
        tensor once the GPU has passed it, by the writer thread. Several values logged within one
        step (the micro-batches of an accumulation window) are averaged. In code that
        ``torch.compile`` traces, it runs outside the graph (a graph break at the call, as
        ``print``; so under ``fullgraph=True`` it is refused: log the returned value outside).

        Example::

            s.log("loss", loss)
        """
        if _compiling():  # this frame compiled by dynamo: not skipped yet (skip_log_frames)
            return _compiled.outside_graph()(self, name, value, step)
        if step is None and value.__class__ is _Tensor and name.__class__ is str \
                and name in self._names and (not _cuda._initialized or not value.is_cuda):
            # The common call, s.log("loss", loss) on the CPU: reading the value is a memory read,
            # not a device sync, and reading it now (rather than keeping the tensor) frees the
            # autograd graph the loss still holds.
            try:
                v = value.item()
            except RuntimeError:  # not one element: the general path below says what to do
                pass
            else:
                if v.__class__ is not complex:  # a complex one: the general path refuses it
                    n = self._batch_step
                    self._buf.append((name, self.step if n is None else n, v))
                    return
        if name.__class__ is not str or name not in self._names:
            check_log_name(name)
            if len(self._names) < 10_000:  # names made up per call are checked every time
                self._names.add(name)
        if step is None:
            step = self.step if self._batch_step is None else self._batch_step
        elif isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0 \
                or step > MAX_STEP:  # past int64, the event file's step wrapped (2**64 + 5 -> 5)
            raise bad_log_step(step)
        else:
            step = int(step)  # a numpy integer too
        if type(value) is float:
            self._buf.append((name, step, value))
        else:
            self._buf.append((name, step, to_scalar(name, value)))

    def close(self) -> None:
        """Flush everything recorded and close the event files. Safe to call twice."""
        self._close(shown=False)

    def _close(self, *, shown: bool) -> None:  # shown: warnings never raised (_close_active)
        global _active
        if os.getpid() != self._pid:  # a forked child (a DataLoader worker) writes nothing
            if _active is self:
                _active = None  # and may start a session of its own
            return
        if self._closed:
            return
        # What the close warns of: said once all of it is done (raised mid-way, see say_all)
        said: List[Tuple[Optional[str], type]] = []
        try:
            # A second Ctrl-C (or a SIGTERM) acts once all is written. Marked closed only once
            # they are held: one that came between the two left the session closed, inactive
            # and never written (exit and SIGTERM close the active session only).
            with _signals.held():
                self._closed = True
                if _active is self:
                    _active = None
                try:
                    self.end_batch_step(timing.now())  # a pass over a patched loader under way
                    if self._profiler is not None:
                        try:
                            self._profiler.close(said)  # writes the cycle under way
                        except Exception as exc:  # its folder deleted, a full disk: a write
                            say(f"trainkit: the profiler's last trace could not be written to "
                                f"{self.logdir!r} ({type(exc).__name__}: {exc}); everything "
                                f"else recorded is written", RuntimeWarning,  # that failed:
                                user_stacklevel())  # shown, never raised
                finally:
                    try:
                        for undo in reversed(self._on_close):
                            undo()
                    finally:
                        # From here s.log says the session is closed (another thread's too);
                        # what was appended before is in the recorder's buffer, which its
                        # close drains.
                        self._buf = ClosedBuffer(repr(self))
                        try:
                            self._record_optimizers()
                        finally:  # whatever that did, everything recorded is written
                            self._recorder.close()
        finally:
            _signals.release()
        # Counts only when no step ended: the step in progress is still the session's first.
        said.append((_unstepped.message(self._recorder.unstepped, self.step,
                                        batches=self._last_step_end is not None,  # none stepped
                                        waiting=self._waiting_optimizers), RuntimeWarning))
        if self._recorder.once is not None:  # the writer never woke after a step
            self._recorder.once = None
            said.append((ranks_mixed(self.root), RuntimeWarning))
        from .switches import unread

        said.append((unread(self), RuntimeWarning))  # TRAINKIT_TECHNIQUES misspelled?
        say_all(said, stacklevel=user_stacklevel(), shown=shown)

    def _record_optimizers(self) -> None:
        """The optimizers patched at the end, and whether each stepped here (for TA110)."""
        from ._optinfo import META_OPTIMIZERS, patched_summary

        summary = patched_summary(self)
        self._recorder.meta.append((META_OPTIMIZERS, self.step, summary))
        #: the types of the patched optimizers that never stepped (for the close's warning)
        self._waiting_optimizers = [o["type"] for o in json.loads(summary) if not o["stepped"]]

    def flush(self) -> None:
        """Write every completed step recorded so far, now (the writer does it every ``flush_secs``).

        Example::

            s.flush()   # e.g. before a checkpoint
        """
        if not self._closed and os.getpid() == self._pid:
            self._recorder.flush_now()

    closed = property(lambda self: self._closed)  #: whether it is closed

    @property
    def steps_done(self) -> int:
        """The steps of the run's x axis done so far (``session(steps_done=...)``'s included): the
        count to save in a checkpoint, to resume with ``tk.session(logdir, steps_done=n)``."""
        return self.step - 1

    def __call__(self, fn: Any = None, *args: Any, **kwargs: Any) -> Any:
        # @tk.session(logdir=...) on a function: tk.session(...) has started recording by now,
        # and "'Session' object is not callable" left it active (the next session refused).
        self.close()
        raise TypeError(f"tk.session(logdir={self.root!r}) is no decorator: it starts recording "
                        f"where it is called (now closed again); open it inside the function, "
                        f"e.g. with tk.session(logdir={self.root!r}) as s: ...")

    def __enter__(self) -> "Session":
        if self._closed:
            raise RuntimeError(f"{self!r} is closed and records nothing more; start a new one, "
                               f"e.g. with tk.session(logdir={self.root!r}) as s:")
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[1] is None:
            self.close()
            return
        # The exception leaving the block goes on unchanged (this returns None): a close warning
        # the filters make an error is shown, not raised over it (sys.exit(3) exited 1)
        close_over(self.close, exc[1], sys._getframe(1))

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"step {self.step}"
        return f"<trainkit.Session logdir={self.logdir!r} {state}>"

    # -- for techniques (hot path: keep these cheap) -----------------------------------------------
    def record(self, tag: str, value: Any) -> None:
        self._buf.append((tag, self.step, value))

    def _completed(self) -> int:
        return self.step - 1

    def on_close(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the session closes (restores backend flags a technique changed)."""
        if self._closed:  # it would never run: what it undoes would stay
            raise ValueError("s.on_close(...): the session is closed, its close has run; make "
                             "the change (and its undo) while the session is open")
        self._on_close.append(undo)


_Tensor: Any = None
_cuda: Any = None  # torch.cuda: log() reads its _initialized (no CUDA tensor can exist before)


def _tensor_type() -> Any:
    global _Tensor, _cuda, _compiling
    if _Tensor is None:
        import torch

        _Tensor, _cuda = torch.Tensor, torch.cuda
        # s.log in code torch.compile traces runs outside the graph, as print() would (a graph
        # break): traced, its appends to the buffer the writer thread empties broke dynamo's
        # guards ("Guard failed on the same frame it was created"), and reading a value needs
        # the real tensor anyway.
        _compiling = _compiled.is_compiling_function(torch)
    return _Tensor


#: torch's "is dynamo tracing this" (:func:`trainkit._compiled.is_compiling_function`), bound
#: with the tensor type (no session exists before).
_compiling: Callable[[], bool] = bool

# A call of s.log in code dynamo traces is a graph break at the caller's call site (see
# trainkit._compiled), never an inlined s.log.
_compiled.never_traced(Session.log, _compiled.LOG_IN_GRAPH)


# -- activation, exit and signals ------------------------------------------------------------------
_start_lock = threading.RLock()


def _check_none_active() -> None:
    if _active is not None and not _active.closed and _active._pid == os.getpid():
        raise RuntimeError(f"a trainkit session is already active ({_active!r}); close it first "
                           f"(leave its `with` block or call s.close()) — one session at a time")


def _activate(s: Session) -> None:
    global _active
    _active = s
    _signals.install()  # closed at exit, flushed on SIGTERM and SIGHUP


def _close_active() -> None:
    """Close the active session at the process's end (atexit, SIGTERM, SIGHUP), its warnings
    shown, never raised, where the filters make them errors: nobody can catch them there."""
    s = _active
    if s is not None:
        s._close(shown=True)


def session(logdir: Optional[Union[str, "os.PathLike[str]"]] = None, *, profile: Any = None,
            log_every: int = 1000, flush_secs: float = 2.0, system_metrics: bool = True,
            steps_done: int = 0) -> Session:
    """Start recording into ``logdir`` (TensorBoard layout; created if missing).

    Args:
        logdir: the run's folder (``~`` is the home folder, ``~user`` that user's: a ``~name``
            of no user is refused); ``None`` gives a new ``runs/<date>_<host>`` (``-2``... after
            it for runs started in the same second).
            Under torchrun each rank writes ``<logdir>/rank<N>``.
        profile: a :class:`trainkit.ProfileSchedule` to record torch.profiler traces, or None.
        log_every: wake the writer every this many steps (it also wakes every ``flush_secs``).
        flush_secs: at most this many seconds of records are lost if the process is SIGKILLed
            (at least 0.05: each write takes the GIL from the training loop).
        system_metrics: sample CPU load, RSS and peak memory (off the hot path).
        steps_done: optimizer steps the run did before this session: for a run resumed from a
            checkpoint, the step count saved in it. Steps are numbered on from there, into the
            same ``logdir``: TensorBoard (and ``trainkit analyze``) show one run, and the steps
            after the checkpoint that the stopped session had recorded are dropped from view
            (by TensorBoard's default loader, only where the resumed session writes their tags
            again: see the README).

    Example::

        with tk.session(logdir="runs/exp1") as s:
            tk.patch(optimizer)
            ...

        # resumed: one run in TensorBoard, from the checkpoint's step on
        with tk.session(logdir="runs/exp1", steps_done=checkpoint["step"]) as s:
            ...
    """
    return Session(logdir, profile=profile, log_every=log_every, flush_secs=flush_secs,
                   system_metrics=system_metrics, steps_done=steps_done)
