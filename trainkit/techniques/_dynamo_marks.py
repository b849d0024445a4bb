"""What dynamo says about the compiles of ``tk.compiled_step``: how many frames it compiled and
which guards failed (read before and after each call: a call that compiled spent compile time, a
guard failure after warm-up is a recompile), and a filter for a log line of its that reads like an
error. Only ``torch._dynamo.utils``'s counters are read (torch 2.11 and 2.14 keep them alike)."""
from __future__ import annotations

import logging
import re
from typing import Tuple


def dynamo_marks() -> Tuple[int, int]:
    """(frames compiled so far, guard failures so far)."""
    from torch._dynamo.utils import counters, guard_failures

    return counters["frames"]["total"], sum(len(v) for v in guard_failures.values())


def latest_guard_failure(before: int) -> str:
    """The guard failure, among those after the first ``before``, of the newest cache entry:
    older entries fail on stale state (e.g. "the optimizer state is empty", true only before the
    first step), the newest on what changed."""
    from torch._dynamo.utils import guard_failures

    reasons = [str(r) for v in guard_failures.values() for r in v][before:]

    def entry(reason: str) -> int:
        m = re.match(r"\s*\[?(\d+)/(\d+)", reason)
        return int(m.group(2)) if m else -1

    return max(reasons, key=entry).strip() if reasons else "unknown guard"


class _QuietOptimizerRecordFunction(logging.Filter):
    """Drops dynamo's "Profiler record function ... will be ignored" about ``Optimizer.step``.

    torch wraps every optimizer step in a ``record_function``; dynamo drops it from the graph and
    warns once per process, a ``W...`` line that reads like an error. trainkit names the step in
    traces itself (``trainkit/optimizer_step``, outside the graph), so nothing is lost.
    """

    def filter(self, record: logging.LogRecord) -> bool:  # torch <= 2.6: "Profiler function"
        return not str(record.msg).startswith(("Profiler record function", "Profiler function"))


#: The filter, one object: adding it again to a logger's filters adds nothing.
QUIET = _QuietOptimizerRecordFunction()
