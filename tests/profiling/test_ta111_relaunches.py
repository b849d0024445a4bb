"""TA111 is said where a rerun's steps hide an earlier session's steps, and only there.

A relaunch that crashed in setup writes its close's system sample alone, at step 1. The analysis
hides such a session whole where another counted steps (runs.py), and TA111 said that a later
session "counted its steps again" where none had counted a step, and that the findings left a
session out where no step of any was left out. The same for such a relaunch followed by a rerun
that counts steps.
"""
from __future__ import annotations

import contextlib
import os
import shutil

import pytest

import trainkit as tk
from trainkit.profiling import runs
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.cli import main

from .conftest import event_files

STEP_TIME = "trainkit/step_time_ms"


def session(logdir, *, steps, crash=False):
    """A session with system metrics (sampled at its close) around a patched SGD stepping
    ``steps`` times; ``crash``: an error after them (a setup that fails, when ``steps=0``)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.01))
    with pytest.raises(RuntimeError, match="planted") if crash else contextlib.nullcontext():
        with tk.session(logdir=logdir, system_metrics=True):
            for _ in range(steps):
                loss = torch.nn.functional.mse_loss(model(torch.randn(8, 16)), torch.randn(8, 1))
                opt.zero_grad()
                loss.backward()
                opt.step()
            if crash:
                raise RuntimeError("CUDA out of memory (planted)")


def codes(findings):
    return [f.code for f in findings]


def test_two_relaunches_that_crashed_in_setup_after_a_run_get_no_ta111(tmp_path, capsys):
    logdir = str(tmp_path / "exp")
    session(logdir, steps=12)
    session(logdir, steps=0, crash=True)
    session(logdir, steps=0, crash=True)
    trained, crashed, again = event_files(logdir)
    run = runs.load_run(logdir, logdir)
    assert run.hidden == (crashed, again) and run.hidden_counted == ()  # no step in either
    assert STEP_TIME not in runs.read_scalars(logdir, [crashed])
    assert STEP_TIME not in runs.read_scalars(logdir, [again])

    found = tk.analyze(logdir)
    assert "TA111" not in codes(found) and "TA110" not in codes(found), found
    alone = tmp_path / "alone"  # the run's steps, all of them, as if relaunched into nothing
    alone.mkdir()
    shutil.copy(os.path.join(logdir, trained), alone)
    assert analyze_run(logdir, logdir).steps == analyze_run(str(alone), str(alone)).steps == 10
    capsys.readouterr()
    main([logdir])
    assert "TA111" not in capsys.readouterr().out


def test_a_rerun_after_a_relaunch_that_crashed_in_setup_gets_no_ta111(tmp_path):
    """The crash's sample at step 1 is hidden by the rerun counting from step 1: no step of it
    is left out, as for the crash after the run."""
    logdir = str(tmp_path / "exp")
    session(logdir, steps=0, crash=True)
    session(logdir, steps=12)
    crashed, _ = event_files(logdir)
    assert runs.load_run(logdir, logdir).hidden == (crashed,)
    assert "TA111" not in codes(tk.analyze(logdir))


def test_relaunches_that_only_crashed_get_no_ta111_and_ta110_still(tmp_path):
    logdir = str(tmp_path / "exp")
    session(logdir, steps=0, crash=True)
    session(logdir, steps=0, crash=True)
    first, _ = event_files(logdir)
    assert runs.load_run(logdir, logdir).hidden == (first,)
    assert codes(tk.analyze(logdir)) == ["TA110"]


def test_a_rerun_that_counted_steps_still_gets_ta111_over_the_crashes_between(tmp_path):
    """The run's steps hidden by a rerun's: TA111, saying every session it leaves out."""
    logdir = str(tmp_path / "exp")
    session(logdir, steps=12)
    session(logdir, steps=0, crash=True)
    session(logdir, steps=6)
    trained, crashed, rerun = event_files(logdir)
    assert runs.load_run(logdir, logdir).hidden == (trained, crashed)
    (f,) = [f for f in tk.analyze(logdir) if f.code == "TA111"]
    assert "3 sessions wrote" in f.evidence and "counted its steps again" in f.evidence
    assert f"TensorBoard shows, {rerun}" in f.evidence and "the 1 earlier one(s)" in f.evidence
    assert "so is 1 session(s) that counted no step" in f.evidence, f.evidence
