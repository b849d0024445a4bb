"""torch.profiler driven by the patched optimizer's steps.

The session calls :meth:`Tracer.step` at each real optimizer step, so the user's loop needs no
``prof.step()``. Traces land in the session's logdir in the layout of torch.profiler's
``tensorboard_trace_handler`` (``<worker>.<time>.pt.trace.json``), one file per cycle and rank.
"""
from __future__ import annotations

import os
import socket
from typing import Any, List


class Tracer:
    """One torch.profiler run for one session.

    Example::

        t = Tracer(logdir, tk.ProfileSchedule(wait=1, warmup=1, active=2)); ...; t.step(); t.close()
    """

    def __init__(self, logdir: str, schedule: Any, *, rank: Any = None) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule as make_schedule

        activities: List[Any] = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        worker = f"{socket.gethostname()}_{os.getpid()}" + ("" if rank is None else f"_rank{rank}")
        self.logdir = logdir
        self.traces: List[str] = []
        self._prof = profile(
            activities=activities,
            schedule=make_schedule(wait=schedule.wait, warmup=schedule.warmup,
                                   active=schedule.active, repeat=schedule.repeat),
            on_trace_ready=self._write(worker),
            record_shapes=False,
            with_stack=False,
        )
        self._prof.__enter__()
        self._closed = False

    def _write(self, worker: str) -> Any:
        from torch.profiler import tensorboard_trace_handler

        handler = tensorboard_trace_handler(self.logdir, worker_name=worker)

        def on_ready(prof: Any) -> None:
            before = set(os.listdir(self.logdir))
            handler(prof)
            self.traces.extend(sorted(os.path.join(self.logdir, f)
                                      for f in set(os.listdir(self.logdir)) - before))

        return on_ready

    def step(self) -> None:
        self._prof.step()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._prof.__exit__(None, None, None)


def start_profiler(session: Any) -> Tracer:
    """The session's tracer, writing into ``session.logdir``."""
    return Tracer(session.logdir, session.profile, rank=session.rank)
