"""Paths that are no regular file: a named pipe (FIFO) given to ``trainkit lint`` or found in a
linted folder made it wait forever for a writer, ``/dev/zero`` read without end, and a broken
link in a folder was ``cannot read: [Errno 2] No such file or directory``. Each is now refused,
said as what it is with its path, and the other files are still linted (exit 2)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lint._helpers import REPO_ROOT

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
TK301 = "import gc\nfor x in d:\n    x.backward()\n    gc.collect()\n"


def lint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainkit", "lint", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)


def test_a_fifo_given_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "train.py")
    result = lint(str(tmp_path / "train.py"))
    assert result.returncode == 2, result.stderr
    assert f"{tmp_path / 'train.py'}: cannot read: a named pipe (FIFO), not a regular file" \
        in result.stderr
    assert "(0 files checked, 1 could not be read)" in result.stderr


def test_a_fifo_and_a_broken_link_in_a_folder_are_said_and_the_rest_linted(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a_pipe.py")
    os.symlink("gone.py", tmp_path / "b_link.py")
    (tmp_path / "c.py").write_text(TK301)
    result = lint(str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert f"{tmp_path / 'a_pipe.py'}: cannot read: a named pipe (FIFO)" in result.stderr
    assert (f"{tmp_path / 'b_link.py'}: cannot read: a broken symbolic link (to 'gone.py', which "
            f"does not exist): not linted; remove the link or point it at the file") in result.stderr
    assert "Errno" not in result.stderr
    assert "TK301" in result.stdout
    assert "(1 file checked, 2 could not be read)" in result.stderr


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_is_refused() -> None:
    result = lint("/dev/zero")
    assert result.returncode == 2
    assert "/dev/zero: cannot read: a device, not a regular file" in result.stderr
