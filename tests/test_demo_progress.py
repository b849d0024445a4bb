"""``trainkit demo``'s progress where stderr is no terminal (a log file, ``| tee``, CI) or a dumb
one: plain lines as it goes, no control characters."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

CODE = ("import sys\n"
        "from trainkit import cli\n"
        "raise SystemExit(cli.main(['demo', '--logdir', sys.argv[1], '--epochs', '2',\n"
        "                           '--train-size', '128', '--batch-size', '64']))\n")


def _run(tmp_path, **env_extra):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **env_extra)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "COLUMNS"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", CODE, str(tmp_path / "run")], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(300)
def test_progress_into_a_log_file_is_a_line_per_epoch(tmp_path):
    """Piped (``trainkit demo 2>&1 | tee log``), rich drew nothing until the run ended, then one
    bar: nothing to tell a run that goes on from one that hangs, for up to 50 s."""
    out = _run(tmp_path, TERM="xterm")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert [re.sub(r", \d+:\d\d:\d\d$", "", line) for line in lines] == [
        "training: epoch 1/2, 2/4 steps", "training: epoch 2/2, 4/4 steps"], out.stderr
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", out.stderr)  # no escapes, no \r
    assert out.stdout.startswith("4 optimizer steps, ")


@pytest.mark.timeout(300)
def test_progress_on_a_dumb_terminal_is_lines_without_escapes(tmp_path):
    """TERM=dumb (an editor's shell, a serial console): rich draws no bar there either, and
    said nothing until the end. A real terminal (a pty), so stderr is a TTY."""
    import pty

    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TERM="dumb")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "COLUMNS", "NO_COLOR"):
        env.pop(name, None)
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", CODE, str(tmp_path / "run")], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=child)
    os.close(child)
    said = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child's end closed
            break
        if not chunk:
            break
        said += chunk
    os.close(main)
    assert proc.wait(timeout=300) == 0
    proc.stdout.close()
    text = said.decode().replace("\r\n", "\n")
    assert [re.sub(r", \d+:\d\d:\d\d$", "", line) for line in text.splitlines()] == [
        "training: epoch 1/2, 2/4 steps", "training: epoch 2/2, 4/4 steps"], text
    assert "\x1b" not in text and "\r" not in text


@pytest.mark.timeout(300)
def test_a_closed_stderr_gets_no_progress_and_the_run_goes_on(tmp_path):
    """``trainkit demo 2>&-``: Python's sys.stderr is None; the plain lines wrote to it and the
    run died of an AttributeError at its first epoch's end."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", CODE, str(tmp_path / "run")], env=env,
                         stdout=subprocess.PIPE, text=True, timeout=300,
                         preexec_fn=lambda: os.close(2))
    assert out.returncode == 0
    assert out.stdout.startswith("4 optimizer steps, ") and "training" not in out.stdout
