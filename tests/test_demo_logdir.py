"""``trainkit demo --logdir``: a folder that takes in too much is refused, one that holds a run is said."""
from __future__ import annotations

import os
import shlex

import pytest

from trainkit import cli, demo


@pytest.fixture
def never_runs(monkeypatch):
    """The demo's run, replaced by a failure: a folder that should be refused, were it not, must
    not be written into (``/`` above all) by the test that shows it was not."""
    def reached(config):
        raise AssertionError(f"the demo ran into {config.logdir!r}: it was not refused")

    monkeypatch.setattr(demo, "main", reached)


def test_the_filesystem_root_is_refused_before_anything_is_written(capsys, never_runs):
    """`--logdir /` wrote an event file straight into / and printed `tensorboard --logdir /`,
    which reads the whole filesystem."""
    before = sorted(os.listdir("/"))
    assert cli.main(["demo", "--no-progress", "--logdir", "/"]) == 2
    assert capsys.readouterr().err == (
        "trainkit demo: --logdir /: is the filesystem root, so the run would be written straight "
        "into it and TensorBoard, opened there, would read every folder under it; give the run a "
        "folder of its own, e.g. --logdir runs/demo\n")
    assert sorted(os.listdir("/")) == before


@pytest.mark.parametrize("given", ["~", "HOME/", "."])
def test_the_home_folder_itself_is_refused_however_it_is_named(tmp_path, monkeypatch, capsys,
                                                               never_runs, given):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)
    given = given.replace("HOME", str(home))
    assert cli.main(["demo", "--no-progress", "--logdir", given]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainkit demo: --logdir {shlex.quote(given)}: is your home folder "
                          f"({home}), ")
    assert err.endswith("e.g. --logdir ~/runs/demo\n") and err.count("\n") == 1
    assert os.listdir(home) == []


def test_a_folder_of_its_own_under_the_working_folder_is_not_refused(tmp_path, monkeypatch):
    """`--logdir .` in a project folder, `--logdir runs`: usual choices, left alone."""
    monkeypatch.chdir(tmp_path)
    from trainkit._logdir import check_not_everything

    for given in (".", "runs", str(tmp_path / "x")):
        check_not_everything(given, option="--logdir")
