"""Under ``python -W error``, a session the script never closed is closed at the process's end (by
atexit, or by the SIGTERM handler) with everything written, and its close's warnings are shown:
nobody can catch them there. Raised in the atexit callback, the first printed "Exception ignored
in atexit callback" and a traceback; raised in the SIGTERM handler, right before the process
killed itself by the signal, all were lost unsaid."""
from __future__ import annotations

import signal
import sys

import pytest

from ._util import Child, read_scalars

UNSTEPPED = "RuntimeWarning: trainkit: this session counted no step"
UNREAD = "RuntimeWarning: trainkit: TRAINKIT_TECHNIQUES sets 'fuse'"

# Never closed: 'x' at steps 1-5, and 'loss' twice under the session's one step (a warning at
# the close), with a misspelt technique in the environment (another).
SCRIPT = """
import sys, time, trainkit as tk
s = tk.session(logdir=sys.argv[1], system_metrics=False, flush_secs=60)
for i in range(1, 6):
    s.log("x", float(i), step=i)
s.log("loss", 1.0)
s.log("loss", 2.0)
print("ready", flush=True)
if sys.argv[2] == "wait":
    time.sleep(60)
"""


def _run(tmp_path, monkeypatch, how):
    monkeypatch.setenv("TRAINKIT_TECHNIQUES", '{"fuse": true}')
    child = Child([sys.executable, "-W", "error", "-c", SCRIPT, tmp_path / "run", how])
    try:
        child.wait_for(lambda line: line == "ready", timeout=90)
        if how == "wait":
            child.proc.send_signal(signal.SIGTERM)
        rc = child.wait(60)
    finally:
        child.kill()
    return child, rc


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how, expect_rc", [("end", 0), ("wait", -signal.SIGTERM)],
                         ids=["atexit", "SIGTERM"])
def test_the_close_at_the_end_shows_its_warnings_in_order_and_writes_everything(
        tmp_path, monkeypatch, how, expect_rc):
    child, rc = _run(tmp_path, monkeypatch, how)
    err = child.stderr
    assert rc == expect_rc, (rc, err[-3000:])
    assert "Exception ignored" not in err and "Traceback" not in err, err[-3000:]
    assert err.count(UNSTEPPED) == 1 and err.count(UNREAD) == 1, err[-3000:]
    assert err.index(UNSTEPPED) < err.index(UNREAD), err[-3000:]  # in the order they came
    scalars = read_scalars(tmp_path / "run")
    assert scalars["x"] == [(i, float(i)) for i in range(1, 6)]
    assert scalars["loss"] == [(1, 1.5)]
