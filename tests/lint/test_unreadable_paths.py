"""Files and folders that cannot be read: ``trainkit lint`` on a folder it may not list said
"0 files checked" and exited 0, a folder it may not list inside a linted one was passed over in
silence, and a file it may not read was ``cannot read: [Errno 13] Permission denied``. Each is
now an error naming the path and the fix (exit 2), the other files still linted.

Permissions do not stop root, so as root the commands run as ``nobody`` (uid 65534, through
``setpriv``) with an interpreter that user can run (this one, or the system's ``python3``:
linting needs the standard library alone); where none can, the tests skip.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

from tests.lint._helpers import REPO_ROOT

TK301 = "import gc\nfor x in d:\n    x.backward()\n    gc.collect()\n"
_AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@lru_cache(maxsize=None)
def _runner() -> Optional[List[str]]:
    """The command prefix that runs Python as a user that permissions stop; None: none here."""
    if os.name != "posix":
        return None
    if os.geteuid() != 0:
        return [sys.executable]
    if shutil.which("setpriv") is None:
        return None
    for python in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not python:
            continue
        probe = subprocess.run(
            _AS_NOBODY + [python, "-c", "import sys; assert sys.version_info >= (3, 9); "
                                        "import trainkit.lint"],
            cwd=str(REPO_ROOT), env=_env(), capture_output=True, timeout=60)
        if probe.returncode == 0:
            return _AS_NOBODY + [python]
    return None


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONDONTWRITEBYTECODE="1")


def _lint(*args: str) -> subprocess.CompletedProcess:
    runner = _runner()
    if runner is None:
        pytest.skip("no way to run as a user that file permissions stop (root without setpriv, "
                    "or no Python that uid 65534 can run)")
    return subprocess.run(runner + ["-m", "trainkit", "lint", *args], cwd=str(REPO_ROOT),
                          env=_env(), capture_output=True, text=True, timeout=60)


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder the other user can reach (pytest's tmp_path is root's alone), removed after."""
    path = Path(tempfile.mkdtemp(prefix="trainkit-lint-unreadable-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for root, dirs, _ in os.walk(path):  # top-down: each folder opened before it is walked
            for d in dirs:
                os.chmod(os.path.join(root, d), stat.S_IRWXU)
        shutil.rmtree(path)


def test_a_folder_given_that_cannot_be_listed_is_an_error(folder: Path) -> None:
    locked = folder / "locked"
    locked.mkdir()
    (locked / "train.py").write_text(TK301)
    locked.chmod(0)
    result = _lint(str(locked))
    assert result.returncode == 2, result.stderr
    assert (f"{locked}: cannot read: a folder you have no permission to list: its files are not "
            f"linted; make it readable (chmod u+rx {locked})") in result.stderr, result.stderr
    assert "(0 files checked, 1 could not be read)" in result.stderr


def test_a_folder_found_inside_that_cannot_be_listed_is_reported(folder: Path) -> None:
    (folder / "ok.py").write_text(TK301)
    sub = folder / "sub"
    sub.mkdir()
    (sub / "train.py").write_text(TK301)
    sub.chmod(0)
    result = _lint(str(folder))
    assert result.returncode == 2, result.stderr
    assert f"{sub}: cannot read: a folder you have no permission to list" in result.stderr
    assert "ok.py" in result.stdout and "TK301" in result.stdout
    assert "(1 file checked, 1 could not be read)" in result.stderr


def test_a_file_that_cannot_be_read_names_the_fix(folder: Path) -> None:
    secret = folder / "secret.py"
    secret.write_text(TK301)
    secret.chmod(0)
    result = _lint(str(secret))
    assert result.returncode == 2, result.stderr
    assert (f"{secret}: cannot read: no permission to read it: not linted; make it readable "
            f"(chmod u+r {secret})") in result.stderr
    assert "Errno" not in result.stderr


def test_lint_paths_raises_for_a_folder_inside_that_cannot_be_listed(folder: Path) -> None:
    """The API says the first path it cannot read, as it does a missing one."""
    runner = _runner()
    if runner is None:
        pytest.skip("no way to run as a user that file permissions stop")
    (folder / "ok.py").write_text(TK301)
    sub = folder / "sub"
    sub.mkdir()
    sub.chmod(0)
    code = ("import sys; from trainkit.lint import LintError, lint_paths\n"
            "try:\n    lint_paths(sys.argv[1])\nexcept LintError as exc:\n    print(exc.path)\n")
    result = subprocess.run(runner + ["-c", code, str(folder)], cwd=str(REPO_ROOT), env=_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == str(sub), result.stderr
