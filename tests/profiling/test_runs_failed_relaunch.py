"""A relaunch into a run's folder that counted no step is no run to analyze, and a resumed run's
earlier traces of steps it counted again are no longer the run's.

A script relaunched with the same logdir that crashes in setup, or in its first step after its
first batch came, writes its close's system sample, its first data wait and the regions it got
through, all at step 1, and no step time. Merged tag by tag (as TensorBoard's default loader
shows them) they hid the run's data waits and region times while its step times stayed: a
data-loader-bound run was reported clean (exit 0). Its ``trainkit/meta`` replaced the run's (the
optimizers TA104 reads). Beside a session that counted steps, such a session is now hidden whole
and hides nothing (``Run.hidden``; ``Run.hidden_counted`` names the hidden sessions that counted
steps, from what the merge read). A run resumed from an earlier checkpoint than its last step
counts steps again that the stopped session had profiled: those traces were analyzed beside the
resumed session's.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

import trainkit as tk
from trainkit._optinfo import META_OPTIMIZERS
from trainkit.profiling import runs
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.cli import main
from trainkit.sinks.tbplugin.data import TabData

from tests.conftest import cpu_fused_or_skip
from .conftest import SleepyDataset, dominated_run, event_files, next_second

STEP_TIME = "trainkit/step_time_ms"
UPDATE_MS = "trainkit/update_ms"
DATA_WAIT = "trainkit/data_wait_ms"
FORWARD = "trainkit/region/forward_ms"


def trace_names(folder):
    return sorted(f for f in os.listdir(folder) if ".pt.trace.json" in f)


def codes(findings):
    return [f.code for f in findings]


def alone(tmp_path, logdir, event_file):
    """A folder holding one session's event file alone: the run as if relaunched into nothing."""
    folder = tmp_path / "alone"
    folder.mkdir()
    shutil.copy(os.path.join(logdir, event_file), folder)
    return str(folder)


def fed(logdir, *, crash=None, system=False):
    """A data-loader-bound loop (each batch takes ~8 ms to load, its step well under 1 ms) of 12
    steps, its forward in a region. ``crash``: ``"batch"`` raises once the first batch came,
    ``"forward"`` after the first forward region, ``"setup"`` before the loop."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.01))
    loader = tk.patch(torch.utils.data.DataLoader(SleepyDataset(24, 0.004), batch_size=2))
    try:
        with tk.session(logdir=logdir, system_metrics=system):
            if crash == "setup":
                raise RuntimeError("CUDA out of memory (planted)")
            for x, y in loader:
                if crash == "batch":
                    raise RuntimeError("CUDA out of memory (planted)")
                with tk.profile_region("forward"):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                if crash == "forward":
                    raise RuntimeError("CUDA out of memory (planted)")
                opt.zero_grad()
                loss.backward()
                opt.step()
    except RuntimeError as exc:
        assert "planted" in str(exc) and crash is not None
    finally:
        tk.unpatch(opt)
        tk.unpatch(loader)


@pytest.mark.parametrize("crash", ["batch", "forward"])
def test_a_relaunch_that_crashed_in_its_first_step_leaves_the_run_analyzed_whole(tmp_path, capsys,
                                                                                crash):
    logdir = str(tmp_path / "exp")
    fed(logdir)
    next_second()
    fed(logdir, crash=crash)
    first, second = event_files(logdir)
    later = runs.read_scalars(logdir, [second])
    # the relaunch's first step: its data wait (and forward) at step 1, no step counted
    assert {DATA_WAIT, FORWARD} & set(later) == ({DATA_WAIT, FORWARD} if crash == "forward"
                                                else {DATA_WAIT})
    assert all(s == 1 for points in later.values() for s, _ in points)
    assert STEP_TIME not in later and UPDATE_MS not in later

    solo = alone(tmp_path, logdir, first)
    mixed, clean = analyze_run(logdir, logdir), analyze_run(solo, solo)
    assert "TA101" in codes(clean.findings)
    assert codes(mixed.findings) == codes(clean.findings)
    assert mixed.breakdown["data_wait"] > 0 and mixed.breakdown["forward"] > 0
    assert (mixed.steps, mixed.breakdown) == (clean.steps, clean.breakdown)
    run = runs.load_run(logdir, logdir)
    assert run.hidden == (second,) and run.hidden_counted == ()
    assert run.scalars == runs.read_scalars(logdir, [first])  # every data wait of the run

    assert [x["code"] for x in TabData(str(tmp_path)).report("exp")["findings"]] \
        == codes(mixed.findings)
    capsys.readouterr()
    assert main([logdir]) == 1
    out = capsys.readouterr().out
    assert "TA101" in out and "TA111" not in out and "TA110" not in out, out


def test_a_relaunch_that_crashed_in_setup_leaves_the_runs_optimizers(tmp_path):
    """The run's fused Adam, whose update dominates: TA104 says it already runs fused. The
    relaunch patched its optimizer and crashed before its first step: its close recorded the
    optimizer as never stepped, and that replaced the run's, so TA104 advised fused=True."""
    import torch

    cpu_fused_or_skip()
    logdir = str(tmp_path / "exp")

    def make(params):
        return torch.optim.Adam(params, lr=1e-3, fused=True)

    # the update dominates by design (a Linear(2048, 2048) of batch 2 left TA104 unsaid in
    # 3 runs of 8 on an idle machine: the backward's matmuls took as long)
    dominated_run(logdir, make)
    next_second()
    opt = tk.patch(make(torch.nn.Linear(16, 1).parameters()))
    try:
        with pytest.raises(RuntimeError, match="planted"):
            with tk.session(logdir=logdir, system_metrics=True):
                raise RuntimeError("planted setup crash")
    finally:
        tk.unpatch(opt)
    first, second = event_files(logdir)
    later = {}
    runs.read_scalars(logdir, [second], meta=later)
    assert json.loads(later[META_OPTIMIZERS])[0]["stepped"] is False

    solo = alone(tmp_path, logdir, first)

    def ta104(folder):
        return [f.fix for f in tk.analyze(folder) if f.code == "TA104"]

    fix = ta104(solo)
    assert fix and "already runs fused" in fix[0]
    assert ta104(logdir) == fix
    run = runs.load_run(logdir, logdir)
    assert run.hidden == (second,) and run.meta == runs.load_run(solo, solo).meta
    assert json.loads(run.meta[META_OPTIMIZERS])[0]["stepped"] is True


def test_hidden_counted_names_the_hidden_sessions_that_counted_steps(tmp_path, monkeypatch):
    """What TA111 asks (did a hidden session count steps?), from the event files read once."""
    logdir = str(tmp_path / "exp")
    fed(logdir)
    next_second()
    fed(logdir, crash="setup", system=True)
    trained, crashed = event_files(logdir)
    run = runs.load_run(logdir, logdir)
    assert run.hidden == (crashed,) and run.hidden_counted == ()

    next_second()
    fed(logdir)  # a rerun: hides the run before it
    trained, crashed, rerun = event_files(logdir)
    read = []
    real = runs.read_scalars

    def counting(folder, names=None, **kw):
        read.extend(names or ())
        return real(folder, names, **kw)

    monkeypatch.setattr(runs, "read_scalars", counting)
    run = runs.load_run(logdir, logdir)
    assert run.hidden == (trained, crashed) and run.hidden_counted == (trained,)
    assert sorted(read) == [trained, crashed, rerun]  # each file parsed once


#: wait 1, warm up 1, record 3, four times: a fresh session's steps 3-5, 8-10, 13-15, 18-20
EVERY_5 = tk.ProfileSchedule(wait=1, warmup=1, active=3, repeat=4)


@pytest.mark.parametrize("steps_done, kept, analyzed", [
    (10, [(3, 5), (8, 10)], [(3, 5), (8, 10), (13, 15), (18, 20)]),
    # the stopped session's trace of steps 8-10 holds step 10, which the resumed one counted
    (9, [(3, 5)], [(3, 5), (12, 14), (17, 19)]),
], ids=["from_step_11", "from_step_10"])
def test_a_run_resumed_from_an_earlier_checkpoint_leaves_out_the_traces_of_steps_it_redid(
        tmp_path, capsys, steps_done, kept, analyzed):
    """20 steps profiled every 5, then resumed from an earlier checkpoint and run to step 20
    again: the stopped session's traces of the steps the resumed one counted again are left
    out, as TensorBoard leaves out its step times there."""
    import torch

    def script(steps, done):
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 1)
        opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.01))
        try:
            with tk.session(logdir=logdir, profile=EVERY_5, system_metrics=False,
                            steps_done=done):
                for _ in range(steps):
                    loss = torch.nn.functional.mse_loss(model(torch.randn(8, 16)),
                                                        torch.randn(8, 1))
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
        finally:
            tk.unpatch(opt)

    logdir = str(tmp_path / "exp")
    script(20, 0)
    stopped = trace_names(logdir)
    assert len(stopped) == 4
    next_second()
    script(20 - steps_done, steps_done)
    resumed = [t for t in trace_names(logdir) if t not in stopped]
    left_out = stopped[len(kept):]

    run = runs.load_run(logdir, logdir)
    assert run.hidden == ()
    rep = analyze_run(logdir, logdir)
    assert [os.path.basename(t) for t in rep.traces] == sorted(stopped[:len(kept)] + resumed)
    assert [os.path.basename(t) for t in rep.earlier_traces] == left_out
    assert rep.profiled.ranges() == analyzed and rep.profiled.traces == len(analyzed)
    assert "TA111" not in codes(rep.findings)

    tab = TabData(str(tmp_path)).report("exp")
    assert tab["traces"] == [os.path.basename(t) for t in rep.traces]
    assert tab["earlier_traces"] == left_out and tab["profiled"] == rep.profiled.to_dict()
    capsys.readouterr()
    main([logdir])
    spans = ", ".join(f"{a}-{b}" for a, b in analyzed)
    assert f"traces: steps {spans} ({len(analyzed)} traces)" in capsys.readouterr().out
