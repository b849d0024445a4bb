"""SIGHUP (the terminal closed, ``kill -HUP``) ends a training process by default as SIGTERM does:
the session is flushed and closed first, and the process still dies by SIGHUP. It ended the
process at once: every record since the last write was lost (all of them with flush_secs=60).
Where SIGHUP is ignored (``nohup``), it is left ignored, for the programs the script runs too."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from ._util import REPO, child_env
from .test_signals import _assert_flushed, _signal_at_step

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP here")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["plain", "no_with"])
def test_sighup_flushes_and_dies_by_sighup(tmp_path, mode):
    logdir = tmp_path / "run"
    child, rc = _signal_at_step(logdir, mode, signal.SIGHUP)
    assert rc == -signal.SIGHUP, (rc, child.stderr[-3000:])
    assert "Traceback" not in child.stderr, child.stderr[-3000:]
    _assert_flushed(logdir, child)


def test_the_handler_before_the_session_is_back_after_it(tmp_path):
    import trainkit as tk

    def users(signum, frame):
        pass

    prev = signal.signal(signal.SIGHUP, users)
    try:
        with tk.session(logdir=tmp_path / "run", system_metrics=False):
            assert signal.getsignal(signal.SIGHUP) is not users
        assert signal.getsignal(signal.SIGHUP) is users
    finally:
        signal.signal(signal.SIGHUP, prev)


@pytest.mark.timeout(120)
def test_under_nohup_sighup_stays_ignored_for_the_script_and_its_programs(tmp_path):
    script = """
import os, signal, subprocess, sys, trainkit as tk
with tk.session(logdir=sys.argv[1], system_metrics=False) as s:
    s.log("x", 1.0, step=1)
    os.kill(os.getpid(), signal.SIGHUP)  # ignored: the script goes on
    print("here", signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, flush=True)
    subprocess.run([sys.executable, "-c",
                    "import signal; print('child', signal.getsignal(signal.SIGHUP) == signal.SIG_IGN)"])
"""
    proc = subprocess.run(["nohup", sys.executable, "-c", script, str(tmp_path / "run")],
                          cwd=str(REPO), env=child_env(), capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n") == ["here True", "child True", ""], \
        (proc.stdout, proc.stderr[-3000:])
