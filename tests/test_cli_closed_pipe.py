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


def test_output_that_cannot_be_written_is_said_in_a_line_and_exits_1(tmp_path):
    """`trainkit lint x.py > /dev/full`: an OSError traceback (exit 1 all the same)."""
    import pytest

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    script = tmp_path / "loop.py"
    script.write_text("import torch\nfor x in range(3):\n    torch.cuda.empty_cache()\n")
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-m", "trainkit", "lint", str(script)], stdout=full,
                             stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO, timeout=120)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
    assert "could not write the output (No space left on device)" in out.stderr
