"""A SIGTERM or SIGHUP handler set in C, outside Python's ``signal`` module
(``faulthandler.register(signal.SIGTERM)``, which dumps every thread's stack, a common way to see
where a killed job was), is left alone by a session: ``signal.getsignal`` reports such a signal
as having its default action, so the session set its own handler over it and at close gave back
"the default": from then on SIGTERM killed the process with no stack dumped, for the rest of the
process. There the session does not flush on that signal (the user's handler runs instead).
The same for the block the demo command runs in (``_usage.sigterm_raises``)."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from ._util import REPO, child_env

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no sigaction")

SCRIPT = """
import faulthandler, os, signal, sys, time
import trainkit as tk
faulthandler.register(getattr(signal, sys.argv[2]))  # dumps the stacks, the process lives on
with tk.session(logdir=sys.argv[1], system_metrics=False) as s:
    s.log("x", 1.0, step=1)
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # inside the session
    time.sleep(0.5)
    print("alive inside", flush=True)
os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # after it
time.sleep(0.5)
print("alive after", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_faulthandler_registered_signal_keeps_its_handler(tmp_path, sig):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "run"), sig],
                          cwd=str(REPO), env=child_env(), capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.split("\n") == ["alive inside", "alive after", ""], proc.stderr[-3000:]
    assert proc.stderr.count("Current thread") == 2, proc.stderr[-3000:]  # both dumped


BLOCK = """
import faulthandler, os, signal, sys, time
from trainkit import _usage
from trainkit._signals import set_in_c
faulthandler.register(getattr(signal, sys.argv[1]))
with _usage.sigterm_raises():
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))  # dumped, not raised as Terminated
    time.sleep(0.5)
    print("alive inside", flush=True)
print("kept" if set_in_c(getattr(signal, sys.argv[1])) else "taken away", flush=True)
os.kill(os.getpid(), getattr(signal, sys.argv[1]))
time.sleep(0.5)
print("alive after", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_the_demo_commands_block_keeps_a_faulthandler_registered_signal(sig):
    # sigterm_raises set its own handler over faulthandler's and gave back SIG_DFL at its end
    proc = subprocess.run([sys.executable, "-c", BLOCK, sig], cwd=str(REPO), env=child_env(),
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.split("\n") == ["alive inside", "kept", "alive after", ""], \
        proc.stderr[-3000:]
    assert proc.stderr.count("Current thread") == 2, proc.stderr[-3000:]


def test_a_signal_with_no_handler_in_c_is_not_taken_for_one():
    from trainkit._signals import set_in_c

    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    assert not set_in_c(signal.SIGUSR2)
    import faulthandler

    faulthandler.register(signal.SIGUSR2)
    try:
        assert set_in_c(signal.SIGUSR2)
    finally:
        faulthandler.unregister(signal.SIGUSR2)
    assert not set_in_c(signal.SIGUSR2)
    prev = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        assert not set_in_c(signal.SIGUSR2)  # Python's own: told by getsignal
    finally:
        signal.signal(signal.SIGUSR2, prev)
