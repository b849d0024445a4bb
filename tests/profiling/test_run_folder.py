"""What a run folder holds beyond one finished session: several sessions, a trace being written.

The tab, ``trainkit analyze`` and ``tk.analyze`` read a folder the same way (``analyze_run``),
so each case is checked through all three.
"""
from __future__ import annotations

import gc
import gzip
import json
import os
import shutil
import time

import pytest

import trainkit as tk
from trainkit.profiling import runs, tracefiles
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.cli import main
from trainkit.sinks.tbplugin.data import TabData
from trainkit.sinks.tensorboard import EventFileWriter

from .conftest import FIXTURES, event_files, next_second, train

PROFILE = tk.ProfileSchedule(wait=1, warmup=1, active=2)


def codes(findings):
    return [f.code for f in findings]


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
    assert f"the session(s) TensorBoard shows, {latest}" in f.evidence
    assert "1 earlier one(s)" in f.evidence
    assert "tk.session(logdir='runs/exp2')" in f.fix
    assert "torchrun restart" in f.evidence and "-restart<K>" in f.fix  # (one looks the same)

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


def test_a_run_resumed_with_steps_done_is_one_run(tmp_path, capsys):
    """Stopped after 20 steps, resumed from its checkpoint of step 12 into the same folder: the
    resumed session numbers its steps from 13, the stopped one's steps 13-20 leave the view
    (TensorBoard's legacy reader drops them at the resumed file's SessionLog.START, as for
    SummaryWriter(purge_step=13)), and the run is analyzed whole: no TA111."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = str(tmp_path / "exp")
    train(logdir, steps=20, profile=PROFILE)
    next_second()
    train(logdir, steps=8, steps_done=12, profile=PROFILE)
    stopped, resumed = event_files(logdir)
    assert [s for s, _ in runs.read_scalars(logdir, [resumed])["trainkit/step_time_ms"]] \
        == list(range(13, 21))
    run = runs.load_run(logdir, logdir)
    assert run.sessions == (stopped, resumed) and run.hidden == () and run.started is None
    assert len(run.traces) == 2 and not run.earlier_traces  # each session's trace is the run's
    tag = "trainkit/step_time_ms"
    assert [s for s, _ in run.scalars[tag]] == list(range(1, 21))
    kept = dict(runs.read_scalars(logdir, [stopped])[tag][:12])
    kept.update(runs.read_scalars(logdir, [resumed])[tag])
    assert run.scalars[tag] == sorted(kept.items())
    legacy = EventAccumulator(logdir)
    legacy.Reload()
    assert [(e.step, pytest.approx(e.value)) for e in legacy.Scalars(tag)] == run.scalars[tag]
    assert "TA111" not in codes(tk.analyze(logdir))
    assert analyze_run(logdir, logdir).steps == 19  # 20 timed steps, the first left out
    capsys.readouterr()
    rc = main([logdir, "--json"])
    found = {f["code"] for f in json.loads(capsys.readouterr().out)}
    # A toy run of 20 steps: a few slow data waits on a loaded machine (8 test workers on the GPU
    # machine) make TA101 come and go; nothing is to be said of its sessions
    assert found <= {"TA101"} and rc == (1 if found else 0), found


def test_a_rerun_hides_the_sessions_before_it_and_a_resume_after_it_continues_it(tmp_path):
    """Three sessions: 20 steps; a rerun from step 1 (10 steps), which hides the first; that
    rerun resumed at its step 6. The run is the rerun's steps 1-6 and the resumed 7-14."""
    logdir = str(tmp_path / "exp")
    train(logdir, steps=20)
    next_second()
    train(logdir, steps=10, each_step=gc.collect)
    next_second()
    train(logdir, steps=8, steps_done=6)
    first, rerun, resumed = event_files(logdir)
    run = runs.load_run(logdir, logdir)
    assert run.hidden == (first,) and run.started is not None
    assert [s for s, _ in run.scalars["trainkit/step_time_ms"]] == list(range(1, 15))
    (f,) = [f for f in tk.analyze(logdir) if f.code == "TA111"]
    assert f"TensorBoard shows, {rerun}, {resumed}" in f.evidence and "1 earlier" in f.evidence
    assert "steps_done=" in f.fix
    assert "TA106" in codes(tk.analyze(logdir))  # the rerun's gc.collect() steps are shown


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


def test_a_relaunch_killed_before_its_first_flush_hides_nothing(tmp_path):
    """A relaunch into the folder killed at once (its file: the header and the versions text)
    shows nothing in TensorBoard and hides nothing there: no TA111, and the run before it is the
    one analyzed (as before the versions text, when such a file held no trainkit tag)."""
    from trainkit._runfile import META_VERSIONS, versions

    run = str(tmp_path / "a")
    train(run, steps=8, each_step=gc.collect)
    next_second()
    w = EventFileWriter(run)
    w.write_text(META_VERSIONS, versions(), step=0)
    w.close()
    loaded = runs.load_run(str(tmp_path), run)
    assert len(loaded.sessions) == 2 and loaded.hidden == ()
    assert codes(tk.analyze(tmp_path)) == ["TA106"]


# -- a trace still being written -----------------------------------------------------------------

def half_written(folder, name="host_1.1795000000000000000.pt.trace.json"):
    """The first half of a real trace, as torch.profiler leaves it mid-write."""
    with open(os.path.join(FIXTURES, "gpu_healthy.pt.trace.json"), "rb") as fh:
        data = fh.read()
    if name.endswith(".gz"):
        data = gzip.compress(data)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "wb") as fh:
        fh.write(data[:len(data) // 2])
    return path, data


def age(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_a_trace_being_written_is_said_so_and_analyzed_once_complete(tmp_path, capsys):
    run = str(tmp_path / "run")
    train(run, steps=8)
    path, data = half_written(run)
    name = os.path.basename(path)

    with pytest.warns(UserWarning, match=rf"trace '{name}' of run '\.' is still being written"):
        assert tk.analyze(run) == []  # no TA100: not a broken file
    rep = TabData(run).report(".")
    assert rep["writing"] == [name] and rep["traces"] == [] and rep["findings"] == []
    assert TabData(run).trace_path(".", name) is None  # no download of half a trace
    assert main([run]) == 0
    assert "is still being written" in capsys.readouterr().err

    with open(path, "wb") as fh:
        fh.write(data)  # complete now
    rep = TabData(run).report(".")
    assert rep["writing"] == [] and rep["traces"] == [name] and rep["findings"] == []


@pytest.mark.parametrize("name", ["h_1.1795000000000000000.pt.trace.json",
                                  "h_1.1795000000000000000.pt.trace.json.gz"])
def test_only_a_trace_being_written_is_not_a_run_without_steps(tmp_path, name):
    path, _ = half_written(str(tmp_path / "run"), name)
    rep = analyze_run(str(tmp_path / "run"), str(tmp_path / "run"))
    assert rep.writing == (path,)  # no TA100: not a broken file
    # but nothing was analyzed, which is no clean run (trainkit analyze exits 1, not 0)
    (f,) = rep.findings
    assert f.code == "TA110" and "still being written" in f.evidence


def test_a_trace_unchanged_for_a_while_is_broken_for_good(tmp_path):
    path, _ = half_written(str(tmp_path / "run"))
    age(path, tracefiles.WRITING_GRACE_S + 5)
    (f,) = tk.analyze(tmp_path / "run")
    assert f.code == "TA100" and os.path.basename(path) in f.evidence
    rep = analyze_run(str(tmp_path / "run"), str(tmp_path / "run"))
    assert rep.writing == () and rep.traces == (path,)


def test_a_trace_still_growing_is_being_written_whatever_its_mtime(tmp_path, monkeypatch):
    """A writer whose clock is behind this one's: the mtime looks old, but the file grows."""
    from trainkit.profiling import analyze

    path, data = half_written(str(tmp_path / "run"))
    later = lambda: time.time() + 3600  # noqa: E731 - the mtime is an hour old to this clock
    assert codes(analyze_run(str(tmp_path / "run"), str(tmp_path / "run"),
                             clock=later).findings) == ["TA100"]

    read = analyze.read_trace

    def read_while_growing(p):
        with open(p, "ab") as fh:
            fh.write(data[len(data) // 2:len(data) // 2 + 100])
        return read(p)

    monkeypatch.setattr(analyze, "read_trace", read_while_growing)
    rep = analyze_run(str(tmp_path / "run"), str(tmp_path / "run"), clock=later)
    assert rep.writing == (path,) and codes(rep.findings) == ["TA110"]  # nothing analyzed yet


def test_the_tab_does_not_keep_a_report_with_a_trace_being_written(tmp_path, monkeypatch):
    """Unchanged past the grace period, the trace's files look the same as when the report said
    "being written": a cached report would have said so for good."""
    path, _ = half_written(str(tmp_path / "run"))
    data = TabData(str(tmp_path))
    assert data.report("run")["writing"] == [os.path.basename(path)]
    monkeypatch.setattr(tracefiles, "WRITING_GRACE_S", 0.0)  # the grace period is over
    rep = data.report("run")
    assert rep["writing"] == [] and [f["code"] for f in rep["findings"]] == ["TA100"]
