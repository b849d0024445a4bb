"""The checks of ``tk.session``'s arguments, made before anything starts: each error repeats the
value and shows the fix."""
from __future__ import annotations

import math
import numbers
from typing import Any

#: The largest step an event file holds (an int64); a larger one wrapped around, silently.
MAX_STEP = 2**63 - 1
#: The shortest ``flush_secs``: each write takes the GIL from the training loop, and below this
#: the writer runs nearly all the time (1e-3 s slowed the benchmark's 0.6 ms step by 20-50%,
#: 1e-6 s by ~50%, 0.01 s still by ~5-10%), for records a SIGKILL would lose anyway.
MIN_FLUSH_SECS = 0.05


def check_session_args(*, log_every: Any, flush_secs: Any, system_metrics: Any,
                       steps_done: Any) -> None:
    """Raises TypeError for an argument of ``tk.session`` of the wrong type (``flush_secs='2'``,
    ``log_every=1.5``, ``steps_done=True``), ValueError for one out of its range."""
    if isinstance(log_every, bool) or not isinstance(log_every, numbers.Integral):
        raise TypeError(f"session(log_every={log_every!r}): must be a positive int (steps between "
                        f"writes), not {type(log_every).__name__}, e.g. log_every=50")
    if log_every < 1:
        raise ValueError(f"session(log_every={log_every!r}): must be a positive int "
                         f"(steps between writes), e.g. log_every=50")
    if isinstance(flush_secs, bool) or not isinstance(flush_secs, numbers.Real):
        raise TypeError(f"session(flush_secs={flush_secs!r}): must be a positive number of "
                        f"seconds, not {type(flush_secs).__name__}, e.g. flush_secs=2")
    if not math.isfinite(flush_secs) or flush_secs <= 0:
        raise ValueError(f"session(flush_secs={flush_secs!r}): must be a positive number of "
                         f"seconds, e.g. flush_secs=2")
    if flush_secs < MIN_FLUSH_SECS:
        raise ValueError(f"session(flush_secs={flush_secs!r}): at least {MIN_FLUSH_SECS} s: each "
                         f"write takes the GIL from the training loop, and more often than that "
                         f"the writer runs nearly all the time and slows every step (by 20-50% "
                         f"at 0.001 s); a SIGKILL loses at most flush_secs of records, so "
                         f"e.g. flush_secs=0.5 already loses next to nothing")
    if not isinstance(system_metrics, bool):
        raise TypeError(f"session(system_metrics={system_metrics!r}): must be True or False "
                        f"(CPU load and memory under trainkit/system/), e.g. system_metrics=False")
    what = ("the number of optimizer steps done before this session: 0 for a new run, or for a "
            "run resumed from a checkpoint the step count saved in it, e.g. "
            "steps_done=checkpoint['step']")
    if isinstance(steps_done, bool) or not isinstance(steps_done, numbers.Integral):
        raise TypeError(f"session(steps_done={steps_done!r}): must be an int, not "
                        f"{type(steps_done).__name__}: {what}")
    if steps_done < 0 or steps_done >= MAX_STEP:
        raise ValueError(f"session(steps_done={steps_done!r}): must be an int >= 0 (below "
                         f"2**63 - 1, TensorBoard's int64): {what}")


def bad_log_step(step: Any) -> Exception:
    """The error for ``s.log(..., step=step)`` where ``step`` is no int from 0 to
    :data:`MAX_STEP` (or None): a TypeError for the wrong type, a ValueError out of range."""
    from ._text import brief

    what = ("up to 2**63 - 1 (TensorBoard's int64), or None (None files it under the current "
            "optimizer step)")
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        return TypeError(f"log(step={brief(step)}): step must be an int, not "
                         f"{type(step).__name__}, from 0 {what}")
    # past int64, the event file's step wrapped (2**64 + 5 -> 5)
    return ValueError(f"log(step={brief(step)}): step must be a non-negative int {what}")
