"""What a run folder holds beyond one session: several sessions.

The tab, ``trainkit analyze`` and ``tk.analyze`` read a folder the same way (``analyze_run``),
so each case is checked through all three.
"""
from __future__ import annotations

import gc
import os
import shutil
import time

import pytest

import trainkit as tk
from trainkit.profiling import runs
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.cli import main
from trainkit.sinks.tbplugin.data import TabData
from trainkit.sinks.tensorboard import EventFileWriter

from .conftest import FIXTURES, train

PROFILE = tk.ProfileSchedule(wait=1, warmup=1, active=2)


def codes(findings):
    return [f.code for f in findings]


def next_second():
    """Event files are named by the second they start in (then host, pid and a per-process
    count, compared as text): two sessions of one process in one second may sort either way."""
    time.sleep(1.01 - time.time() % 1)


def event_files(folder):
    return sorted(f for f in os.listdir(folder) if "tfevents" in f)


def traces(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith(".pt.trace.json"))


# -- several sessions in one folder -------------------------------------------------------------

def test_a_rerun_into_the_same_folder_is_analyzed_for_its_latest_session(tmp_path, capsys):
    """A script run again with the same logdir: steps restart at 1 in a second event file. The
    last value per step was kept, so the long first run's later steps (a gc.collect() in each)
    showed through the clean rerun's: TA106 for a run that has none."""
    logdir = str(tmp_path / "exp")
    train(logdir, steps=20, each_step=gc.collect)
    next_second()
    train(logdir, steps=8)
    first, latest = event_files(logdir)

    found = tk.analyze(logdir)
    assert codes(found) == ["TA111"], found
    (f,) = found
    assert f.count == 2 and f.severity == "low" and f.share is None
    assert f"the latest one's, {latest}" in f.evidence and "1 earlier one(s)" in f.evidence
    assert "tk.session(logdir='runs/exp2')" in f.fix

    # the same report as for a folder holding the latest session alone
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(os.path.join(logdir, latest), alone)
    mixed, clean = analyze_run(logdir, logdir), analyze_run(str(alone), str(alone))
    assert (mixed.steps, mixed.breakdown) == (clean.steps, clean.breakdown)
    assert mixed.steps < 10

    # the tab and the CLI say the same
    rep = TabData(str(tmp_path)).report("exp")
    assert [x["code"] for x in rep["findings"]] == ["TA111"] and rep["steps"] == clean.steps
    assert main([logdir]) == 1 and "TA111 low" in capsys.readouterr().out


def test_the_latest_session_is_the_one_with_planted_causes(tmp_path):
    logdir = str(tmp_path / "exp")
    train(logdir, steps=20)
    next_second()
    train(logdir, steps=8, each_step=gc.collect)
    assert codes(tk.analyze(logdir)) == ["TA106", "TA111"]


def test_each_session_keeps_its_traces(tmp_path):
    logdir = str(tmp_path / "exp")
    train(logdir, steps=8, profile=PROFILE)
    (old,) = traces(logdir)
    next_second()
    train(logdir, steps=8, profile=PROFILE)
    (new,) = set(traces(logdir)) - {old}
    run = runs.load_run(logdir, logdir)
    assert [os.path.basename(t) for t in run.traces] == [new]
    assert [os.path.basename(t) for t in run.earlier_traces] == [old]
    (f,) = [f for f in tk.analyze(logdir) if f.code == "TA111"]
    assert "and 1 trace(s) are left out" in f.evidence
    data = TabData(logdir)
    rep = data.report(".")
    assert rep["traces"] == [new] and rep["earlier_traces"] == [old]
    assert data.trace_path(".", old) == os.path.join(logdir, old)  # still downloadable


def test_one_session_per_folder_is_unchanged(tmp_path):
    """The normal case: a folder per run; a user's own SummaryWriter beside trainkit's session
    (no trainkit/ tags) is no second session."""
    train(str(tmp_path / "a"), steps=8, each_step=gc.collect, profile=PROFILE)
    train(str(tmp_path / "b"), steps=8)
    w = EventFileWriter(str(tmp_path / "a"))
    for step in range(1, 40):
        w.write_scalars(step=step, values={"loss": 1.0 / step, "my/metric": 2.0})
    w.close()
    run = runs.load_run(str(tmp_path), str(tmp_path / "a"))
    assert len(run.sessions) == 1 and len(run.traces) == 1 and not run.earlier_traces
    found = tk.analyze(tmp_path)
    assert "TA111" not in codes(found) and [f.run for f in found] == ["a"]
    assert codes(found) == ["TA106"]

