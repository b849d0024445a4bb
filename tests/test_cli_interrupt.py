"""Ctrl-C during ``trainkit analyze`` or ``trainkit lint`` (however started: ``trainkit``,
``python -m trainkit.lint``, ``python -m trainkit.profiling.cli``): said in a line, not a
traceback, and the process still ends by SIGINT.

The SIGINT is a real one, sent by the command's process to itself once its work begins (a
function of the work, wrapped). These tests stopped the commands while they read a named pipe
(FIFO) given as an event file or a ``.py`` file; both now refuse such a file rather than wait on
it (tests/lint/test_special_files.py, tests/profiling/test_special_files.py).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.test_switches_cli_import import REPO, _env

pytestmark = pytest.mark.skipif(os.name != "posix", reason="ends by SIGINT: POSIX")


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
    ("trainkit", "trainkit.profiling.analyze:analyze_runs", "analyze"),
])
def test_ctrl_c_in_python_m_entry_points_is_said_in_a_line(tmp_path, module, target, command):
    """Each printed a 20-line KeyboardInterrupt traceback: ``trainkit analyze``/``lint`` until
    commit 90a8d18, ``python -m trainkit.lint`` and ``python -m trainkit.profiling.cli`` after."""
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


# The console script (``from trainkit.cli import main; sys.exit(main())``), with a real SIGINT sent
# while MODULE, the subcommand's, is being imported (as its import is asked for): a Ctrl-C in the
# first moments of ``trainkit lint`` (its rules take ~0.2 s to import) or ``trainkit analyze``.
_IMPORTING = """
import importlib.abc, os, signal, sys
module = sys.argv.pop(1)
class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupt())
from trainkit.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("module, command", [("trainkit.lint.cli", "lint"),
                                             ("trainkit.profiling.cli", "analyze")])
def test_ctrl_c_while_the_subcommand_imports_is_said_in_a_line(tmp_path, module, command):
    """The parser was built (the subcommand's module imported) before the Ctrl-C was handled:
    a KeyboardInterrupt traceback out of importlib, where later it is one line."""
    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / "driver.py").write_text(_IMPORTING)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py"), module, command, str(tmp_path)],
        env=_env(), cwd=REPO, capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr == f"trainkit {command}: interrupted\n", proc.stderr[-3000:]
    assert proc.stdout == ""
