"""A SIGCHLD during the final write (a DataLoader worker that died: killed by the same SIGTERM
sent to the process group, or by the OOM killer) waits until everything is written.

torch's DataLoader handles SIGCHLD with a function that raises when one of its workers died;
raised inside the session's close it lost the run's last records, with a warning blaming the
disk ("Free some space"), and on SIGTERM it could turn the exit by SIGTERM into a traceback.
"""
from __future__ import annotations

import os
import signal
import sys

import pytest

import trainkit as tk
from tests.conftest import scalars

from ._dying_worker import WorkerDiesNow, torch_like_sigchld
from ._util import SCRIPTS, Child

SCRIPT = SCRIPTS / "workers_die_with_sigterm.py"
pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGCHLD"), reason="no SIGCHLD here")


def test_a_worker_dying_during_close_is_told_once_everything_is_written(tmp_path):
    prev = signal.signal(signal.SIGCHLD, torch_like_sigchld)
    try:
        s = tk.session(logdir=tmp_path, system_metrics=False, flush_secs=60)
        for i in range(1, 21):
            s.log("x", float(i), step=i)
        s._buf.append(("y", 20, WorkerDiesNow()))
        with pytest.raises(RuntimeError, match="worker"):
            s.close()  # torch's error comes from here, after the close
        assert signal.getsignal(signal.SIGCHLD) is torch_like_sigchld
    finally:
        signal.signal(signal.SIGCHLD, prev)
    assert [st for st, _ in scalars(tmp_path)["x"]] == list(range(1, 21))
    assert scalars(tmp_path)["y"] == [(20, 2.0)]
    assert s.closed and s._recorder.failed is None


@pytest.mark.timeout(120)
def test_sigterm_with_a_worker_dying_during_the_write_keeps_the_records_and_the_exit(tmp_path):
    child = Child([sys.executable, SCRIPT, tmp_path, "simulated"])
    rc = child.wait(90)
    assert rc == -signal.SIGTERM, (rc, child.lines, child.stderr[-3000:])
    assert "Traceback" not in child.stderr and "failed" not in child.stderr, child.stderr[-3000:]
    got = scalars(tmp_path)
    assert [st for st, _ in got["loss"]] == [1, 2, 3, 4, 5]
    assert got["late"] == [(5, 2.0)]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_to_the_process_group_of_a_loop_with_dataloader_workers(tmp_path):
    # The real thing (a race without the fix: torch's error came only when the workers' exit
    # was seen during the write). A new session: the group's SIGTERM reaches no test runner.
    for attempt in range(3):
        logdir = tmp_path / str(attempt)
        child = Child([sys.executable, SCRIPT, logdir, "dataloader"], new_session=True)
        child.wait_for(lambda line: line == "step 30", timeout=120)
        os.killpg(child.proc.pid, signal.SIGTERM)
        rc = child.wait(60)
        assert rc == -signal.SIGTERM, (rc, child.stderr[-3000:])
        assert "Traceback" not in child.stderr and "failed" not in child.stderr, child.stderr[-3000:]
        steps = [st for st, _ in scalars(logdir)["loss"]]
        assert steps[:30] == list(range(1, 31)), steps[:40]


class _SeesSigchld:
    """A pending value that notes, as the final write reads it, SIGCHLD's handler then."""

    seen = []

    def ready(self):
        return True

    def value(self, wait):
        self.seen.append(signal.getsignal(signal.SIGCHLD))
        return 1.0

    def release(self):
        pass


def test_without_a_python_sigchld_handler_the_close_leaves_sigchld_alone(tmp_path):
    # Nothing there can raise (no DataLoader's handler): a C library's own handler, or the
    # default, is not swapped out and back while the session writes.
    assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
    s = tk.session(logdir=tmp_path, system_metrics=False, flush_secs=60)
    s._buf.append(("y", 1, _SeesSigchld()))
    s.close()
    assert _SeesSigchld.seen == [signal.SIG_DFL]
    assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
