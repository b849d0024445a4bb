"""``trainkit demo`` stopped by Ctrl-C, or read by a reader that went away: said, not a traceback."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.test_switches_cli_import import REPO, _env
from trainkit import demo
from trainkit.profiling.runs import EVENTS_MARK, read_scalars


@pytest.mark.parametrize("signum, said", [(signal.SIGINT, "interrupted"),
                                          (signal.SIGTERM, "terminated (SIGTERM)"),
                                          (signal.SIGHUP, "terminated (SIGHUP)")])
def test_a_stop_keeps_the_run_says_where_and_dies_by_its_signal(tmp_path, signum, said):
    """Ctrl-C in training printed a 30-line KeyboardInterrupt traceback and never said that the
    steps so far were kept, nor where; a SIGTERM (`timeout 30 trainkit demo`, `kill PID`) said
    nothing at all, nor did a SIGHUP (the terminal closed). The process still ends by the signal,
    as it did (exit 130, 143 or 129 in a shell)."""
    logdir = tmp_path / "my runs" / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainkit", "demo", "--logdir", str(logdir), "--epochs", "1000",
         "--no-progress"], env=dict(_env(), CUDA_VISIBLE_DEVICES=""), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a child of its own: SIGINT is not inherited ignored (a shell's background job), nor
        # SIGHUP (a test run under nohup)
        preexec_fn=lambda: [signal.signal(sig, signal.SIG_DFL)
                            for sig in (signal.SIGINT, signal.SIGHUP)])
    try:
        deadline = time.monotonic() + 120
        steps = []
        while not steps and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            names = [n for n in os.listdir(logdir) if EVENTS_MARK in n] if logdir.is_dir() else []
            steps = read_scalars(str(logdir), names).get("trainkit/step_time_ms", []) if names else []
        assert steps, "the demo recorded no step in time"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signum, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert f"trainkit demo: {said}; the steps recorded so far are in {logdir}" in err
    assert f"tensorboard --logdir '{logdir}')" in err
    names = [n for n in os.listdir(logdir) if EVENTS_MARK in n]
    assert len(read_scalars(str(logdir), names)["trainkit/step_time_ms"]) >= len(steps)


#: ``trainkit demo`` whose SIGTERM comes once its options are checked, before torch trains (a
#: real signal, sent by the process to itself at a known point).
_TERM_BEFORE_TRAINING = """
import os, signal, sys
from trainkit import cli, demo
real = demo.check_memory
def checked(config):
    real(config)
    os.kill(os.getpid(), signal.SIGTERM)
demo.check_memory = checked
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_sigterm_before_training_is_said_and_dies_by_sigterm(tmp_path):
    """It ended silently (exit 143) where a Ctrl-C there says that nothing was recorded."""
    proc = subprocess.run(
        [sys.executable, "-c", _TERM_BEFORE_TRAINING, "demo", "--logdir", str(tmp_path / "r"),
         "--no-progress"], env=dict(_env(), CUDA_VISIBLE_DEVICES=""), cwd=REPO,
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr == ("trainkit demo: terminated (SIGTERM) before training began; nothing "
                           "was recorded\n"), proc.stderr[-3000:]


class _Gone(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_reader_gone_ends_the_summary_quietly(tmp_path, monkeypatch, capsys):
    """`trainkit demo | true`: BrokenPipeError traceback and exit 1 after a good run."""
    config = demo.DemoConfig(logdir=str(tmp_path / "x"), epochs=1, train_size=64, val_size=64,
                             progress=False)
    monkeypatch.setattr(sys, "stdout", _Gone())
    assert demo.main(config) == 0
