"""A session resumed from a checkpoint (``tk.session(logdir, steps_done=N)``) numbers its steps
from N + 1, and torch its ``ProfilerStep#`` from 0 as the session's profiler starts: the trace's
``ProfilerStep#K`` is trainkit's step N + K + 1. Each trace recorded ``step_offset`` 1 whatever
N was, and ``trainkit analyze`` (its ``traces:`` line, ``--json``, the tab's ``profiled``) added
that constant: with N = 10, the steps profiled as 13-15 were said to be 3-5, steps of the run
before the checkpoint, which TensorBoard's step times show as another part of the run.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings

import trainkit as tk
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.cli import main
from trainkit.profiling.runs import load_run
from trainkit.profiling.trace import TRACE_META
from trainkit.profiling.tracestats import STEP_PREFIX
from trainkit.sinks.tbplugin.data import TabData

from .conftest import FIXTURES, train

#: wait 1, warm up 1, record 3, twice (the profiler restarts for the second cycle): torch's
#: ProfilerStep#2-4 and #7-9, the session's 3rd-5th and 8th-10th steps
TWICE = tk.ProfileSchedule(wait=1, warmup=1, active=3, repeat=2)
DONE = 10  # the steps of the run before the checkpoint


def traces(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if ".pt.trace.json" in f)


def resume(logdir, *, steps=12, profile=TWICE, tail=None, first=None):
    """The run's first DONE steps (profiled as ``first`` says), then a session resumed after
    them, profiled, each of its steps inside a range named after the trainkit step it is
    (``s.step``, the step in progress)."""
    import torch

    train(logdir, steps=DONE, profile=first)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with tk.session(logdir=logdir, profile=profile, system_metrics=False,
                    steps_done=DONE) as s:
        tk.patch(opt)
        for _ in range(steps):
            with torch.profiler.record_function(f"test/step{s.step}"):
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
        if tail is not None:
            tail()


def marked(path):
    """``ProfilerStep#K -> the trainkit step named inside it`` in the trace at ``path``."""
    with open(path) as fh:
        events = json.load(fh)["traceEvents"]
    spans = [e for e in events if e.get("cat") == "user_annotation"]
    out = {}
    for step in (e for e in spans if e["name"].startswith(STEP_PREFIX)):
        inside = [int(e["name"][len("test/step"):]) for e in spans
                  if e["name"].startswith("test/step")
                  and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
        out[int(step["name"][len(STEP_PREFIX):])] = inside
    return out


def test_each_trace_of_a_resumed_session_records_its_own_offset(logdir):
    """Read back from the traces themselves: in both cycles, ProfilerStep#K holds the work of
    trainkit step K + the recorded offset, which is steps_done + 1."""
    resume(logdir)
    first, second = traces(logdir)
    for path, numbers in ((first, [2, 3, 4]), (second, [7, 8, 9])):
        with open(path) as fh:
            meta = json.load(fh)[TRACE_META]
        assert meta["step_offset"] == DONE + 1
        assert f"ProfilerStep#N is trainkit step N + {DONE + 1}" in meta["about"]
        steps = marked(path)
        assert sorted(steps) == numbers
        assert all(inside == [k + meta["step_offset"]] for k, inside in steps.items()), steps


def test_analyze_names_the_steps_a_resumed_session_profiled(logdir, capsys):
    """The ``traces:`` line, ``--json`` and the tab's report: steps 13-15 and 18-20, which
    TensorBoard's step times hold under those numbers (written by the resumed session)."""
    resume(logdir)
    report = analyze_run(logdir, logdir)
    assert report.profiled.ranges() == [(13, 15), (18, 20)]
    profiled = {"traces": 2, "steps": [[13, 15], [18, 20]], "unnumbered": 0}
    assert report.to_dict()["profiled"] == profiled
    tab = TabData(os.path.dirname(logdir)).report(os.path.basename(logdir))
    assert tab is not None and tab["profiled"] == profiled
    step_times = load_run(logdir, logdir).values("trainkit/step_time_ms")
    assert set(report.profiled.steps) <= set(step_times) and max(step_times) == DONE + 12

    rc = main([logdir])
    out = capsys.readouterr().out
    assert out.endswith("traces: steps 13-15, 18-20 (2 traces)\n"), out
    assert rc == (0 if out.startswith("no findings") else 1)
    main([logdir, "--json"])
    assert "trainkit analyze: traces: steps 13-15, 18-20 (2 traces)\n" in capsys.readouterr().err


def test_each_trace_is_read_with_its_own_offset(logdir):
    """Both sessions profiled, into one folder: the first one's traces are steps 3-5 and 8-10,
    the resumed one's 13-15 and 18-20; no one offset per run fits both."""
    resume(logdir, first=TWICE)
    assert len(traces(logdir)) == 4
    assert analyze_run(logdir, logdir).profiled.ranges() == [(3, 5), (8, 10), (13, 15), (18, 20)]


def test_a_trace_recording_no_offset_is_read_as_a_fresh_sessions(tmp_path):
    """Traces written before the offset was recorded (the checked-in GPU fixture, from a
    profiler without trainkit's metadata) keep the old reading, ProfilerStep#K as step K + 1;
    one whose recorded offset is malformed too, rather than failing the analysis."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(os.path.join(FIXTURES, "gpu_healthy.pt.trace.json"), run / "a.pt.trace.json")
    with open(os.path.join(FIXTURES, "gpu_healthy.pt.trace.json")) as fh:
        data = json.load(fh)
    assert TRACE_META not in data
    data[TRACE_META] = {"step_offset": "eleven"}
    data["traceEvents"] = [dict(e, name=e["name"].replace("#2", "#5").replace("#3", "#6"))
                           if str(e.get("name", "")).startswith(STEP_PREFIX) else e
                           for e in data["traceEvents"]]
    with open(run / "b.pt.trace.json", "w") as fh:
        json.dump(data, fh)
    assert analyze_run(str(run), str(run)).profiled.ranges() == [(3, 4), (6, 7)]


def test_the_warning_for_a_trace_left_with_no_step_names_trainkits_step(logdir):
    """The session closes after its 10th step, step 20 of the run, before the second cycle's
    first profiled step: the warning names step 20, the number TensorBoard shows."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resume(logdir, steps=10, profile=tk.ProfileSchedule(wait=2, warmup=2, active=2, repeat=2),
               tail=lambda: torch.randn(4).sum().item())
    said = [str(w.message) for w in caught if "holds no training step" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert f"the session closed after step {DONE + 10}," in said[0], said[0]
