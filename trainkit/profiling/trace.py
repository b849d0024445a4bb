"""torch.profiler driven by the patched optimizer's steps.

The session calls :meth:`Tracer.step` at each real optimizer step, so the user's loop needs no
``prof.step()``. Traces land in the session's logdir in the layout of torch.profiler's
``tensorboard_trace_handler`` (``<worker>.<time>.pt.trace.json[.gz]``), one file per cycle and
rank, which is what torch-tb-profiler and trainkit's own tab read.

A trace's size is bounded by the schedule: only the ``active`` steps of each of the ``repeat``
cycles are written, without shapes, stacks or memory events (each of those multiplies the size).
"""
from __future__ import annotations

import os
import socket
from typing import Any, Callable, List, Optional

#: The suffixes of a trace file, plain or gzip-compressed.
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


def is_trace(name: str) -> bool:
    """True for a file name torch.profiler's TensorBoard handler writes."""
    return name.endswith(TRACE_SUFFIXES)


def worker_name(rank: Optional[int]) -> str:
    """``<host>_<pid>[_rank<N>]``: unique per process, so ranks and reruns never overwrite."""
    return f"{socket.gethostname()}_{os.getpid()}" + ("" if rank is None else f"_rank{rank}")


class Tracer:
    """One torch.profiler run for one session, stepped by the session at each real step.

    Records CPU activity, and CUDA activity when a GPU is available. ``traces`` lists the files
    written so far (one per completed cycle).

    Example::

        t = Tracer("runs/p", tk.ProfileSchedule(wait=1, warmup=1, active=2))
        for _ in range(4):
            train_one_step(); t.step()
        t.close(); print(t.traces)
    """

    def __init__(self, logdir: str, schedule: Any, *, rank: Optional[int] = None) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler import schedule as make_schedule

        activities: List[Any] = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.logdir = logdir
        self.gzip = bool(getattr(schedule, "gzip", False))
        self.traces: List[str] = []
        self._prof = profile(
            activities=activities,
            schedule=make_schedule(wait=schedule.wait, warmup=schedule.warmup,
                                   active=schedule.active, repeat=schedule.repeat),
            on_trace_ready=self._writer(worker_name(rank)),
            # Shapes, stacks and memory events each multiply a trace's size; the findings and
            # the tab need none of them.
            record_shapes=False,
            with_stack=False,
            profile_memory=False,
        )
        self._prof.__enter__()
        self._closed = False

    def _writer(self, worker: str) -> Callable[[Any], None]:
        from torch.profiler import tensorboard_trace_handler

        handler = tensorboard_trace_handler(self.logdir, worker_name=worker, use_gzip=self.gzip)

        def on_ready(prof: Any) -> None:
            before = set(os.listdir(self.logdir))
            handler(prof)
            self.traces.extend(sorted(os.path.join(self.logdir, f)
                                      for f in set(os.listdir(self.logdir)) - before
                                      if is_trace(f)))

        return on_ready

    def step(self) -> None:
        """One real optimizer step ended."""
        self._prof.step()

    def close(self) -> None:
        """Stop the profiler; a cycle still recording is written. Idempotent."""
        if not self._closed:
            self._closed = True
            self._prof.__exit__(None, None, None)


def start_profiler(session: Any) -> Tracer:
    """The session's tracer, writing into ``session.logdir``."""
    return Tracer(session.logdir, session.profile, rank=session.rank)
