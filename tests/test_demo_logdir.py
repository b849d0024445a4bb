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


def _tiny(logdir):
    return demo.DemoConfig(logdir=logdir, epochs=1, train_size=64, val_size=64, batch_size=64,
                           progress=False)


def test_a_folder_holding_a_run_is_said_when_the_next_one_starts(tmp_path, monkeypatch, capsys):
    """A second demo into one --logdir said nothing: its summary counted its own steps, but
    TensorBoard showed the two sessions as one run and `trainkit analyze` reported TA111."""
    import datetime

    monkeypatch.chdir(tmp_path)
    assert demo.main(_tiny("runs/x")) == 0
    assert "already holds" not in capsys.readouterr().err
    (first,) = os.listdir("runs/x")
    when = datetime.datetime.fromtimestamp(int(first.split("tfevents.")[1].split(".")[0]))
    (tmp_path / "runs" / "x-2").mkdir()  # taken: the folder suggested is one that is free
    assert demo.main(_tiny("runs/x")) == 0
    assert capsys.readouterr().err == (
        f"trainkit demo: runs/x already holds a run (from {when:%Y-%m-%d %H:%M}); this one is "
        f"added beside it: TensorBoard shows them as one run, and trainkit analyze reports TA111 "
        f"(several sessions in one run folder); use --logdir runs/x-3 for a run of its own\n")
    assert len(os.listdir("runs/x")) == 2


def test_the_default_folder_is_a_new_one_each_run_so_nothing_is_said(tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert demo.main(_tiny(None)) == 0
    assert "already holds" not in capsys.readouterr().err
    assert len(os.listdir("runs")) == 2
