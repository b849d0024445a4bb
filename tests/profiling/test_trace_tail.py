"""The work after the last optimizer step (an evaluation after the loop, a checkpoint) is no
training step: torch.profiler would close it into one more ``ProfilerStep`` at the session's
close, and the analyzer counted it as one (95% of the summed step time in the probe's run)."""
from __future__ import annotations

import os
import warnings

import pytest

import trainkit as tk
from trainkit.profiling.trace import AFTER_LAST_STEP
from trainkit.profiling.tracefiles import read_trace
from trainkit.profiling.tracestats import STEP_PREFIX, summarize


def _run(logdir: str, schedule: tk.ProfileSchedule, steps: int, evals: int) -> None:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with tk.session(logdir=logdir, profile=schedule, system_metrics=False):
        tk.patch(opt)
        for _ in range(steps):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():  # the evaluation after the loop, in the same session
            for _ in range(evals):
                (model(x).argmax(1) == y).float().mean().item()


def _traces(logdir: str) -> list:
    return sorted(os.path.join(logdir, f) for f in os.listdir(logdir) if ".pt.trace.json" in f)


def _marks(events: list) -> dict:
    return {e["name"]: e for e in events if e.get("cat") == "user_annotation"
            and (e["name"].startswith(STEP_PREFIX) or e["name"] == AFTER_LAST_STEP)}


@pytest.mark.parametrize("gzip", [False, True])
def test_the_evaluation_after_the_last_step_is_not_a_profiled_step(logdir, gzip):
    _run(logdir, tk.ProfileSchedule(wait=2, warmup=1, active=5, gzip=gzip), steps=5, evals=40)
    (path,) = _traces(logdir)
    events = read_trace(path)
    marks = _marks(events)
    assert sorted(n for n in marks if n.startswith(STEP_PREFIX)) == ["ProfilerStep#3",
                                                                     "ProfilerStep#4"]
    tail = marks[AFTER_LAST_STEP]  # still in the trace, under a name that is no step's
    items = [e for e in events if e.get("name") == "aten::_local_scalar_dense"]
    assert len(items) == 40
    assert all(tail["ts"] <= e["ts"] <= tail["ts"] + tail["dur"] for e in items)
    st = summarize(events)
    assert st.steps == 2
    assert st.count("aten::_local_scalar_dense") == 0  # the evaluation's .item()s are not the step's
    steps_us = sum(marks[f"ProfilerStep#{n}"]["dur"] for n in (3, 4))
    assert st.step_us == pytest.approx(steps_us)


def test_a_trace_holding_only_the_tail_has_no_step_and_says_so(logdir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the second cycle's first active step would be the 11th: the session closes before it
        _run(logdir, tk.ProfileSchedule(wait=2, warmup=2, active=2, repeat=2), steps=10, evals=5)
    first, second = _traces(logdir)
    assert len([n for n in _marks(read_trace(first)) if n.startswith(STEP_PREFIX)]) == 2
    marks = _marks(read_trace(second))
    assert list(marks) == [AFTER_LAST_STEP]
    st = summarize(read_trace(second))
    assert (st.steps, st.step_us) == (0, 0.0)  # not the whole host activity taken as one step
    said = [w for w in caught if "holds no training step" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert os.path.basename(second) in str(said[0].message)
    assert said[0].filename == __file__  # the user's line (the session's close), not trainkit's


def test_a_session_closing_right_after_a_step_outside_the_window_is_untouched(logdir):
    # the cycle ended (written at its last step) before the close: no tail in any trace
    _run(logdir, tk.ProfileSchedule(wait=1, warmup=1, active=2), steps=6, evals=3)
    (path,) = _traces(logdir)
    marks = _marks(read_trace(path))
    assert sorted(marks) == ["ProfilerStep#2", "ProfilerStep#3"]


def test_each_trace_says_how_its_steps_map_to_trainkits(logdir):
    """torch's ProfilerStep#N is trainkit's step N + 1 (step_time_ms, s.log): each trace says so
    in its metadata, and the steps it holds are those the schedule profiles in trainkit's count."""
    import json

    from trainkit.profiling.trace import STEP_OFFSET, TRACE_META

    # wait=3, warmup=1: trainkit's steps 5 and 6 are profiled, in both cycles' places
    _run(logdir, tk.ProfileSchedule(wait=3, warmup=1, active=2, repeat=2), steps=12, evals=0)
    for path, first in zip(_traces(logdir), (5, 11)):
        with open(path) as fh:
            data = json.load(fh)
        assert data[TRACE_META]["step_offset"] == STEP_OFFSET == 1
        assert "ProfilerStep#N is trainkit step N + 1" in data[TRACE_META]["about"]
        steps = sorted(int(n[len(STEP_PREFIX):]) + STEP_OFFSET for n in _marks(data["traceEvents"])
                       if n.startswith(STEP_PREFIX))
        assert steps == [first, first + 1]
