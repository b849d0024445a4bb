"""System load and memory, sampled by the writer thread (never in the training step)."""
from __future__ import annotations

import resource
import sys
from typing import Dict

from .. import timing
from ..recorder import PREFIX

CPU_PERCENT = PREFIX + "system/cpu_percent"
RSS_MB = PREFIX + "system/rss_MB"
PEAK_MB = PREFIX + "memory/peak_MB"


class SystemSampler:
    """Callable returning ``{tag: value}`` for CPU load, RSS and peak memory.

    ``memory/peak_MB`` is the CUDA allocator's peak on the current device when this process uses
    CUDA, else the process's peak resident set size.

    Example::

        sample = SystemSampler(); sample()["trainkit/system/rss_MB"]
    """

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process()
        psutil.cpu_percent(interval=None)  # the first call only starts the measuring interval

    def __call__(self) -> Dict[str, float]:
        rss = self._proc.memory_info().rss / 2**20
        out = {CPU_PERCENT: float(self._psutil.cpu_percent(interval=None)), RSS_MB: rss}
        if timing.cuda_in_use():
            torch = sys.modules["torch"]
            out[PEAK_MB] = torch.cuda.max_memory_allocated() / 2**20
        else:
            # ru_maxrss is in KiB on Linux (bytes on macOS).
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            out[PEAK_MB] = peak / (2**20 if sys.platform == "darwin" else 2**10)
        return out
