"""Ctrl-C during ``trainkit analyze`` or ``trainkit lint``: said in a line, not a traceback.

The commands are stopped while they read a named pipe (a FIFO) given as an event file or as a
``.py`` file: the read waits for a writer that never writes, so the SIGINT lands inside the
command's work, wherever a slower or faster machine would be at that moment.
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.test_switches_cli_import import REPO, _env

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")


def _interrupted_while_reading(fifo, *args):
    """Run ``trainkit ARGS`` until it opens ``fifo`` to read it, then send it SIGINT."""
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainkit", *args], env=_env(), cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        # a child of its own: SIGINT is not inherited ignored (a shell's background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    writer = None
    try:
        deadline = time.monotonic() + 120
        while writer is None:
            try:  # opens only once the command holds the pipe open to read it
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO, exc
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the command never read the pipe"
                time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        if writer is not None:
            os.close(writer)
    return proc.returncode, out, err


@pytest.mark.parametrize("command", ["analyze", "lint"])
def test_ctrl_c_is_said_in_a_line_and_ends_by_sigint(tmp_path, command):
    """Both printed a 20-line KeyboardInterrupt traceback (and died by SIGINT)."""
    if command == "analyze":
        (tmp_path / "exp").mkdir()
        fifo = tmp_path / "exp" / "events.out.tfevents.1700000000.host.1.0"
    else:
        fifo = tmp_path / "train.py"
    code, out, err = _interrupted_while_reading(str(fifo), command, str(tmp_path))
    assert code == -signal.SIGINT, (code, err[-3000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err == f"trainkit {command}: interrupted\n", err
    assert out == ""


# Runs ``python -m MODULE ARGS`` as runpy runs it, the SIGINT sent once the command's work begins
# (when TARGET, ``module:function``, is first called): a real signal, at a known point.
_DRIVER = """
import importlib, os, runpy, signal, sys
target, module, *args = sys.argv[1:]
owner, name = target.split(":")
owner = importlib.import_module(owner)
real = getattr(owner, name)
def interrupted(*a, **k):
    os.kill(os.getpid(), signal.SIGINT)
    return real(*a, **k)
setattr(owner, name, interrupted)
sys.argv = [module, *args]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module, target, command", [
    ("trainkit.lint", "trainkit.lint._api:lint_file", "lint"),
    ("trainkit.profiling.cli", "trainkit.profiling.analyze:analyze_runs", "analyze"),
    ("trainkit", "trainkit.lint._api:lint_file", "lint"),
])
def test_ctrl_c_in_python_m_entry_points_is_said_in_a_line(tmp_path, module, target, command):
    """``python -m trainkit.lint`` and ``python -m trainkit.profiling.cli`` printed the
    KeyboardInterrupt traceback that ``trainkit lint``/``analyze`` no longer print."""
    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / "driver.py").write_text(_DRIVER)
    args = [command] if module == "trainkit" else []
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py"), target, module, *args, str(tmp_path)],
        env=_env(), cwd=REPO, capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr == f"trainkit {command}: interrupted\n", proc.stderr[-3000:]
    assert proc.stdout == ""
