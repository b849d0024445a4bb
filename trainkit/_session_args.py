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
    """Raises ValueError or TypeError for an argument of ``tk.session`` that cannot be used."""
    if isinstance(log_every, bool) or not isinstance(log_every, numbers.Integral) \
            or log_every < 1:
        raise ValueError(f"session(log_every={log_every!r}): must be a positive int "
                         f"(steps between writes), e.g. log_every=50")
    if (isinstance(flush_secs, bool) or not isinstance(flush_secs, numbers.Real)
            or not math.isfinite(flush_secs) or flush_secs <= 0):
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
    if isinstance(steps_done, bool) or not isinstance(steps_done, numbers.Integral) \
            or steps_done < 0 or steps_done >= MAX_STEP:
        raise ValueError(f"session(steps_done={steps_done!r}): must be the number of optimizer "
                         f"steps done before this session, an int >= 0 (below 2**63 - 1, "
                         f"TensorBoard's int64): 0 for a new run, or for a run resumed from a "
                         f"checkpoint the step count saved in it, e.g. "
                         f"steps_done=checkpoint['step']")
