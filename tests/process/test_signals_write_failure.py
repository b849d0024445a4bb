"""A write that fails (a full disk) in the training thread: in ``s.flush()`` before a checkpoint,
or in the flush of a SIGTERM that the user's own handler lets the process survive. It is said
once, as the writer thread's failure is, and the training goes on: before, the OSError came out
of ``s.flush()``, and out of the SIGTERM handler in place of the user's handler."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ._util import child_env

SCRIPT = """
import os, resource, signal, sys
import torch, trainkit as tk
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG: a full disk
requested = []
signal.signal(signal.SIGTERM, lambda signum, frame: requested.append(signum))
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
with tk.session(logdir=sys.argv[1], system_metrics=False, flush_secs=60) as s:
    tk.patch(opt)
    for i in range(1, 201):
        loss = m(torch.randn(8, 4)).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
        s.log("loss", loss)
        if i == 100:
            resource.setrlimit(resource.RLIMIT_FSIZE, (200, resource.RLIM_INFINITY))
            if sys.argv[2] == "flush":
                s.flush()  # e.g. before saving a checkpoint
            else:
                os.kill(os.getpid(), signal.SIGTERM)
    print("trained", i, "requested", requested, "failed", type(s._recorder.failed).__name__,
          flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flags", [[], ["-W", "error"]], ids=["", "warnings-as-errors"])
@pytest.mark.parametrize("how, requested", [("flush", "[]"), ("sigterm", "[15]")])
def test_a_write_failing_in_the_training_thread_is_said_and_the_training_goes_on(tmp_path, how,
                                                                                 requested, flags):
    # Where warnings are errors (-W error), the warning itself came out of s.flush() and out
    # of the SIGTERM handler: the training stopped after all.
    proc = subprocess.run([sys.executable, *flags, "-c", SCRIPT, str(tmp_path / "run"), how],
                          env=child_env(), capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["trained", "200", "requested", requested, "failed",
                                   "OSError"], (proc.stdout, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("RuntimeWarning: trainkit: writing the run to") == 1, proc.stderr
