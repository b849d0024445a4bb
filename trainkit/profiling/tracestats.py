"""What the findings need from one Chrome trace, summarised in one pass over its events.

torch.profiler (Kineto) writes complete events (``"ph": "X"``) with a category: ``cpu_op`` for
ATen operators, ``user_annotation`` for ``record_function`` ranges (``ProfilerStep#N`` marks each
step), ``cuda_runtime`` / ``cuda_driver`` for host-side CUDA calls, and on the GPU ``kernel``,
``gpu_memcpy`` and ``gpu_memset``. Times are in microseconds.

torch numbers the step marks from 0 as the profiler starts; trainkit's traces record, in their
top-level ``"trainkit"`` metadata, which of the run's steps ``ProfilerStep#0`` is (a session
resumed with ``steps_done`` starts its profiler after that many steps of the run), and which
session wrote them (its event file's name, :data:`SESSION_FILE`).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")
STEP_PREFIX = "ProfilerStep#"
#: What trainkit renames the range torch.profiler opens after the session's last step to, when the
#: session closes during a profiled cycle: the work after the loop (an evaluation, a checkpoint)
#: stays visible in the trace, but is no training step.
AFTER_LAST_STEP = "trainkit/after_last_step"
#: The top-level key of a trace's trainkit metadata, whose ``"step_offset"`` says that the trace's
#: ``ProfilerStep#N`` is the run's step ``N + step_offset`` (``trainkit/step_time_ms``, ``s.log``).
TRACE_META = "trainkit"
#: The offset of a session not resumed: its profiler starts before its step 1, and torch counts
#: from 0. Also the reading of a trace that records none (trainkit's from before it recorded one,
#: or a profiler's of the user's), which can only be taken as a fresh session's.
STEP_OFFSET = 1
#: The key of trainkit's trace metadata naming the session that wrote the trace: the name of that
#: session's event file (``events.out.tfevents.<time>.<host>.<pid>.<n>``), which tells the
#: sessions of one folder apart where their clocks cannot (:mod:`.tracesessions`).
SESSION_FILE = "session_file"


@dataclasses.dataclass(frozen=True)
class TraceStats:
    """Per-trace totals, all restricted to the profiled steps (``ProfilerStep#N`` ranges).

    Example::

        events = read_trace(path); st = summarize(events, meta=events.meta)
        st.run_steps, st.gpu_busy_us / st.window_us
    """

    steps: int
    step_us: float  # sum of the steps' durations
    window_us: float  # from the first step's start to the last step's end
    host: Dict[str, Tuple[int, float]]  # name -> (count, total us) of host events
    steps_with: Dict[str, int]  # host event name -> number of steps containing one
    gpu_busy_us: float  # union of GPU activity inside the window
    kernels: int
    median_kernel_us: float
    median_gap_us: float  # between consecutive GPU activities inside the window
    memcpy: Dict[str, Tuple[int, float]]  # gpu_memcpy name -> (count, bytes)
    #: the N of each ``ProfilerStep#N`` summarised, in order (torch's numbering, from 0): which
    #: steps of the run the totals are of. Empty for a trace without the step marks.
    step_numbers: Tuple[int, ...] = ()
    #: ``ProfilerStep#N`` is the run's step ``N + step_offset`` (see :func:`recorded_offset`)
    step_offset: int = STEP_OFFSET

    @property
    def run_steps(self) -> Tuple[int, ...]:
        """The steps summarised, numbered as ``trainkit/step_time_ms`` numbers them."""
        return tuple(n + self.step_offset for n in self.step_numbers)

    @property
    def has_gpu(self) -> bool:
        return self.kernels > 0 or bool(self.memcpy)

    def count(self, *names: str) -> int:
        return sum(self.host.get(n, (0, 0.0))[0] for n in names)

    def time_us(self, *names: str) -> float:
        return sum(self.host.get(n, (0, 0.0))[1] for n in names)


def _union(intervals: Iterable[Tuple[float, float]]) -> Tuple[float, List[float]]:
    """Total length of the union of intervals, and the gaps between the merged pieces."""
    total, gaps = 0.0, []
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
                gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total, gaps


def recorded_offset(meta: Mapping[str, Any]) -> int:
    """The step offset a trace's top-level entries ``meta`` record, else :data:`STEP_OFFSET`
    (also for a malformed one: the analysis goes on, as for a malformed event).

    Example::

        recorded_offset(read_trace(path).meta)  # 11 for a session resumed with steps_done=10
    """
    own = meta.get(TRACE_META)
    offset = own.get("step_offset") if isinstance(own, dict) else None
    # bool is an int, and a session's offset is steps_done + 1, at least 1
    if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 1:
        return offset
    return STEP_OFFSET


def recorded_session(meta: Mapping[str, Any]) -> Optional[str]:
    """The name of the event file of the session that wrote a trace, as its top-level entries
    ``meta`` record it; None where they record none (a trace from before trainkit recorded it,
    from torch before 2.1, a profiler's of the user's) or a malformed one.

    Example::

        recorded_session(read_trace(path).meta)  # 'events.out.tfevents.1795514398.vm.7.000001'
    """
    own = meta.get(TRACE_META)
    name = own.get(SESSION_FILE) if isinstance(own, dict) else None
    return name if isinstance(name, str) and name else None


def summarize(events: List[Dict[str, Any]], *,
              meta: Optional[Mapping[str, Any]] = None) -> TraceStats:
    """Summarise the events of one trace (see :func:`trainkit.profiling.tracefiles.read_trace`).

    ``meta``: the trace's top-level entries (``read_trace(path).meta``), which say which steps of
    the run its step marks are; without them, those of a session not resumed.
    """
    complete = []
    for e in events:
        if e.get("ph") != "X":
            continue
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue  # a malformed event: skip it rather than fail the whole analysis
        if not (math.isfinite(ts) and math.isfinite(dur)):
            continue  # "NaN" or 1e400: no time on any clock
        complete.append((ts, dur, str(e.get("cat", "")), str(e.get("name", ""))))
    marks = sorted((ts, ts + dur, name) for ts, dur, cat, name in complete
                   if cat == "user_annotation" and name.startswith(STEP_PREFIX))
    steps = [(s, e) for s, e, _ in marks]
    if not steps and any(name == AFTER_LAST_STEP for _, _, _, name in complete):
        # trainkit's trace of a cycle the session closed in before its first step: only the work
        # after the last step, no training step to summarise
        return TraceStats(0, 0.0, 0.0, {}, {}, 0.0, 0, 0.0, 0.0, {})
    if not steps:  # a trace without the step marks: take the whole host activity as one step
        host = [(ts, ts + dur) for ts, dur, cat, _ in complete if cat in HOST_CATS]
        steps = [(min(s for s, _ in host), max(e for _, e in host))] if host else []
    if not steps:
        return TraceStats(0, 0.0, 0.0, {}, {}, 0.0, 0, 0.0, 0.0, {})
    lo, hi = steps[0][0], steps[-1][1]
    host_tot: Dict[str, List[float]] = {}
    seen: Dict[str, set] = {}
    gpu: List[Tuple[float, float]] = []
    kernel_durs: List[float] = []
    memcpy: Dict[str, List[float]] = {}
    for ts, dur, cat, name in complete:
        if cat in GPU_CATS:
            if ts + dur < lo or ts > hi:
                continue
            gpu.append((max(ts, lo), min(ts + dur, hi)))
            if cat == "kernel":
                kernel_durs.append(dur)
            elif cat == "gpu_memcpy":
                memcpy.setdefault(name, [0, 0.0])[0] += 1
            continue
        if cat not in HOST_CATS or name.startswith(STEP_PREFIX) or ts < lo or ts > hi:
            continue
        acc = host_tot.setdefault(name, [0, 0.0])
        acc[0] += 1
        acc[1] += dur
        seen.setdefault(name, set()).add(_step_index(steps, ts))
    _add_memcpy_bytes(events, memcpy, lo, hi)
    busy, gaps = _union(gpu)
    return TraceStats(
        steps=len(steps),
        step_us=sum(e - s for s, e in steps),
        window_us=hi - lo,
        host={k: (int(v[0]), v[1]) for k, v in host_tot.items()},
        steps_with={k: len(v) for k, v in seen.items()},
        gpu_busy_us=busy,
        kernels=len(kernel_durs),
        median_kernel_us=statistics.median(kernel_durs) if kernel_durs else 0.0,
        median_gap_us=statistics.median(gaps) if gaps else 0.0,
        memcpy={k: (int(v[0]), v[1]) for k, v in memcpy.items()},
        step_numbers=tuple(n for n in (_step_number(name) for _, _, name in marks)
                           if n is not None),
        step_offset=recorded_offset(meta or {}),
    )


def _step_number(name: str) -> Optional[int]:
    """The N of ``ProfilerStep#N``; None for a name torch does not write (a malformed trace)."""
    digits = name[len(STEP_PREFIX):]
    try:
        return int(digits) if digits.isdecimal() else None
    except ValueError:  # more digits than int() converts
        return None


def _step_index(steps: List[Tuple[float, float]], ts: float) -> int:
    for i, (s, e) in enumerate(steps):
        if ts <= e:
            return i
    return len(steps) - 1


def _add_memcpy_bytes(events: List[Dict[str, Any]], memcpy: Dict[str, List[float]],
                      lo: float, hi: float) -> None:
    for e in events:
        name = str(e.get("name", ""))  # as summarize names it: a malformed name is no dict key
        if e.get("cat") == "gpu_memcpy" and name in memcpy:
            args = e.get("args")
            args = args if isinstance(args, dict) else {}
            try:
                size = float(args.get("bytes", 0))
                if lo <= float(e.get("ts", lo)) <= hi and math.isfinite(size):
                    memcpy[name][1] += size
            except (TypeError, ValueError):
                continue
