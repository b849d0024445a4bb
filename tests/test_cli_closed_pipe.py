"""``trainkit`` with no command, its help read by a reader that went away: exit 2, no traceback."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.test_switches_cli_import import REPO, _env


def test_the_help_into_a_closed_pipe_exits_2_quietly():
    """A BrokenPipeError traceback and exit 1 (bad usage is 2)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        out = subprocess.run([sys.executable, "-m", "trainkit"], stdout=write,
                             stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO, timeout=120)
    finally:
        os.close(write)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
