"""System load and memory, sampled by the writer thread (never in the training step)."""
from __future__ import annotations

import resource
import sys
from typing import Any, Callable, Dict, Optional, Tuple

from .. import timing
from ..recorder import PREFIX

CPU_PERCENT = PREFIX + "system/cpu_percent"
RSS_MB = PREFIX + "system/rss_MB"
PEAK_MB = PREFIX + "memory/peak_MB"


class SystemSampler:
    """Callable returning ``{tag: value}`` for CPU load, RSS and peak memory.

    ``memory/peak_MB`` is the CUDA allocator's peak (over the devices) when this process uses
    CUDA, else the process's peak resident set size. Which of the two is decided once, so that a
    run's chart has one meaning: at the first sample with CUDA in use, or after the first step
    (``completed() >= 1``) without it; samples before (the model not yet on its GPU) leave it out.

    Example::

        sample = SystemSampler(); sample()["trainkit/system/rss_MB"]
    """

    def __init__(self, completed: Optional[Callable[[], int]] = None) -> None:
        import psutil

        self._completed = completed
        #: peak_MB is the CUDA peak (True), the host's (False), or not decided yet (None)
        self._cuda: Optional[bool] = None
        self._psutil = psutil
        self._proc = psutil.Process()
        # The load since the last sample, from the machine's CPU times kept here: psutil's own
        # cpu_percent(interval=None) keeps them per calling thread, so a first sample taken in
        # another thread (the writer's) than the one that primed it read an interval of ~0.
        self._last = _busy_total(psutil.cpu_times())

    def cpu_percent(self) -> float:
        """The machine's CPU load (%) since the previous call (or since this sampler was made)."""
        busy, total = _busy_total(self._psutil.cpu_times())
        busy0, total0 = self._last
        self._last = busy, total
        if total <= total0:
            return 0.0
        return round(min(100.0, max(0.0, 100.0 * (busy - busy0) / (total - total0))), 1)

    def __call__(self, final: bool = True) -> Dict[str, float]:
        """One sample; ``final=False`` while steps may be still to come (the writer's flushes)."""
        rss = self._proc.memory_info().rss / 2**20
        out = {CPU_PERCENT: self.cpu_percent(), RSS_MB: rss}
        if self._cuda is None:
            if timing.cuda_in_use():
                self._cuda = True
            elif final or self._completed is None or self._completed() >= 1:
                self._cuda = False
            else:
                return out
        if self._cuda:
            # Every device this process allocated on: this (the writer's) thread's current
            # device is device 0, not the one the training thread set (a torchrun rank's).
            cuda = sys.modules["torch"].cuda
            peak = max(cuda.max_memory_allocated(i) for i in range(cuda.device_count()))
            out[PEAK_MB] = peak / 2**20
        else:
            # ru_maxrss is in KiB on Linux (bytes on macOS).
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            out[PEAK_MB] = peak / (2**20 if sys.platform == "darwin" else 2**10)
        return out


def _busy_total(times: Any) -> Tuple[float, float]:
    """(busy, total) seconds of CPU time, as psutil counts them (guest time is inside user)."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total
