"""A DataLoader worker dying while a session writes, simulated: shared by the in-process tests
and the script a SIGTERM stops (tests/process/scripts/workers_die_with_sigterm.py)."""
from __future__ import annotations

import os
import signal


class WorkerDiesNow:
    """A pending value whose reading, in the final write, meets the SIGCHLD of a dead worker."""

    def ready(self):
        return True

    def value(self, wait):
        os.kill(os.getpid(), signal.SIGCHLD)
        return 2.0

    def release(self):
        pass


def torch_like_sigchld(signum, frame):
    """What torch's DataLoader does on SIGCHLD once one of its workers died."""
    raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Terminated. ")
