"""A run where nothing could be analyzed is no clean run: ``trainkit analyze`` said "no
findings" and exited 0 for a run whose only trace is empty, holds no training step, or is still
being written (truncated moments ago: a crash, then CI analyzing at once)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

import trainkit as tk
from trainkit.profiling.cli import EXIT_FINDINGS, main

from .conftest import train
from .test_broken_inputs import age


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory):
    """A real torch.profiler trace of a small CPU loop, written by a session."""
    logdir = str(tmp_path_factory.mktemp("real"))
    train(logdir, steps=6, profile=tk.ProfileSchedule(wait=1, warmup=1, active=2))
    (name,) = [f for f in os.listdir(logdir) if f.endswith(".pt.trace.json")]
    return os.path.join(logdir, name)


def _alone(tmp_path, name, text):
    run = tmp_path / "run"
    run.mkdir()
    path = run / name
    path.write_text(text)
    return str(run), str(path)


def _says_nothing_was_analyzed(run, capsys, *words):
    found = tk.analyze(run)
    assert [f.code for f in found] == ["TA110"], found
    assert all(w in found[0].evidence for w in words), found[0].evidence
    assert main([run]) == EXIT_FINDINGS
    out = capsys.readouterr().out
    assert "no findings" not in out and "TA110" in out and "nothing was analyzed" in out


def test_a_run_whose_only_trace_is_empty(tmp_path, capsys):
    run, path = _alone(tmp_path, "w.1795483293708160174.pt.trace.json", '{"traceEvents": []}')
    age(path)
    _says_nothing_was_analyzed(run, capsys, "w.1795483293708160174.pt.trace.json")


@pytest.mark.filterwarnings("ignore:analyze.*still being written:UserWarning")
def test_a_run_whose_only_trace_is_still_being_written(tmp_path, capsys, real_trace):
    with open(real_trace) as fh:
        text = fh.read()
    run, _ = _alone(tmp_path, os.path.basename(real_trace), text[:3000])  # just now, cut short
    _says_nothing_was_analyzed(run, capsys, "still being written", os.path.basename(real_trace))
    assert tk.analyze(run)[0].to_dict()["code"] == "TA110"
    assert main([run, "--json"]) == EXIT_FINDINGS
    assert [f["code"] for f in json.loads(capsys.readouterr().out)] == ["TA110"]


def test_a_run_whose_only_trace_holds_no_training_step(tmp_path, capsys, real_trace):
    with open(real_trace) as fh:
        data = json.load(fh)
    for e in data["traceEvents"]:  # as the trace of a cycle the session closed in before its step
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = "trainkit/after_last_step"
    run, path = _alone(tmp_path, os.path.basename(real_trace), json.dumps(data))
    age(path)
    _says_nothing_was_analyzed(run, capsys, "no trace holds a training step")


def test_a_real_trace_alone_is_still_analyzed(tmp_path, capsys, real_trace):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(real_trace, run)
    assert not [f for f in tk.analyze(str(run)) if f.code == "TA110"]
