"""An example's bad ``--logdir`` (a file, a folder under a file, a broken link, a folder it may not
write) is argparse's usage error, exit 2 in one line, before anything is made: it was the
session's ValueError traceback and exit 1, once the data and the model were made."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_examples import CASES, _run_example

#: Runs a command as root without the capabilities that let root write anywhere.
_NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
           "--inh-caps=-dac_override,-dac_read_search"]


def _refused(capsys, name, logdir, said):
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"{name}: error: argument --logdir: {said}", err
    assert err.count("\n") == 2, err  # the usage line and the error: no traceback


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("case", ["file", "under a file", "broken link"])
def test_a_logdir_that_is_no_folder_is_a_usage_error(tmp_path, monkeypatch, capsys, name, case):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("x")
    os.symlink(tmp_path / "gone", tmp_path / "link")
    logdir, bad = {"file": ("f", "f"), "under a file": ("f/run", "f"),
                   "broken link": ("link", "link")}[case]
    with pytest.raises(SystemExit) as exited:
        _run_example(name, ["--logdir", logdir], monkeypatch)
    assert exited.value.code == 2
    _refused(capsys, name, logdir, f"{logdir!r}: {str(tmp_path / bad)!r} is not a folder; give "
                                   f"a folder (made if missing), e.g. --logdir runs/exp1")
    assert sorted(os.listdir(tmp_path)) == ["f", "link"]  # nothing made


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_empty_logdir_is_a_usage_error(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        _run_example(name, ["--logdir", ""], monkeypatch)
    assert exited.value.code == 2
    _refused(capsys, name, "", "must not be empty, e.g. --logdir runs/exp1")
    assert os.listdir(tmp_path) == []


def test_a_logdir_in_a_folder_it_may_not_write_is_a_usage_error(tmp_path):
    prefix = [sys.executable]
    if os.geteuid() == 0:  # root writes anywhere: run it without that power
        if shutil.which("setpriv") is None:
            pytest.skip("run as root, and no setpriv to drop root's power to write anywhere")
        prefix = _NO_DAC + prefix
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        out = subprocess.run([*prefix, os.path.join(REPO, "examples", "closure_step.py"),
                              "--logdir", "locked/run"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    finally:
        locked.chmod(0o755)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines()[-1] == (
        f"closure_step.py: error: argument --logdir: 'locked/run': {str(locked)!r} is not "
        f"writable; give a folder you can write to, e.g. --logdir runs/exp1"), out.stderr
    assert "Traceback" not in out.stderr and os.listdir(locked) == []


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("given", ["/", "~"])
def test_the_root_or_the_home_folder_as_logdir_is_a_usage_error(tmp_path, monkeypatch, capsys,
                                                                name, given):
    # The session refuses both (its ValueError, a traceback once the data and model were made).
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        _run_example(name, ["--logdir", given], monkeypatch)
    assert exited.value.code == 2
    _refused(capsys, name, given, f"{given!r} is the filesystem root or your home folder: give "
                                  f"the run a folder of its own, e.g. --logdir runs/exp1")
    assert os.listdir(tmp_path) == []
