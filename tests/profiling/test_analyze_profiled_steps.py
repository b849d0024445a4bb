"""``trainkit analyze`` says which steps its trace findings come from.

A schedule profiles a few steps per cycle, and the trace findings (host syncs, idle GPU,
``empty_cache``) are of those steps alone; neither the text nor ``--json`` said which they were,
so a user could not find them in TensorBoard's step times, nor tell, with no findings, that only
steps 3-5 had been looked at for syncs. Each run now gets a ``traces:`` line in trainkit's step
numbering (torch's ``ProfilerStep#N`` is step N + 1), and each JSON finding its run's steps.
"""
from __future__ import annotations

import gc
import json
import os

import trainkit as tk
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.cli import main, render
from trainkit.profiling.trace import STEP_OFFSET
from trainkit.profiling.tracefiles import read_trace
from trainkit.profiling.tracestats import STEP_PREFIX

from .conftest import train

#: wait 1, warm up 1, record 3, twice: torch's ProfilerStep#2-4 and #7-9, trainkit's 3-5 and 8-10
TWICE = tk.ProfileSchedule(wait=1, warmup=1, active=3, repeat=2)


def traces(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if ".pt.trace.json" in f)


def marked_steps(path):
    """trainkit's numbers of the steps torch marked in a trace, read from the file itself."""
    names = {e["name"] for e in read_trace(path) if e.get("cat") == "user_annotation"}
    return sorted(int(n[len(STEP_PREFIX):]) + STEP_OFFSET for n in names
                  if n.startswith(STEP_PREFIX))


def test_the_text_names_the_profiled_steps_in_trainkits_numbering(logdir, capsys):
    train(logdir, steps=12, profile=TWICE)
    first, second = traces(logdir)
    assert (marked_steps(first), marked_steps(second)) == ([3, 4, 5], [8, 9, 10])
    profiled = analyze_run(logdir, logdir).profiled
    assert profiled.ranges() == [(3, 5), (8, 10)] and profiled.traces == 2

    rc = main([logdir])
    out = capsys.readouterr().out
    # whatever a loaded machine makes of a toy run's data waits, the line is there, last
    assert out.endswith("traces: steps 3-5, 8-10 (2 traces)\n"), out
    assert rc == (0 if out.startswith("no findings") else 1)


def test_with_no_findings_the_steps_are_still_said(logdir):
    """"no findings" alone read as "nothing wrong anywhere", where only the profiled steps were
    looked at for what traces show."""
    train(logdir, steps=12, profile=TWICE)
    report = analyze_run(logdir, logdir)
    assert render([], [report]) == (
        "no findings: nothing in the records or traces points at lost step time\n"
        "traces: steps 3-5, 8-10 (2 traces)\n")


def test_json_findings_carry_their_runs_profiled_steps(logdir, capsys):
    """The JSON stays the list of findings it was (existing readers index it); each finding
    gains ``profiled``, and the line goes to stderr, as an empty list has no place for it."""
    train(logdir, steps=12, profile=TWICE, each_step=gc.collect)  # TA106: a finding for sure
    assert main([logdir, "--json"]) == 1
    got = capsys.readouterr()
    found = json.loads(got.out)
    assert isinstance(found, list) and "TA106" in [f["code"] for f in found]
    for f in found:
        assert f["profiled"] == {"traces": 2, "steps": [[3, 5], [8, 10]], "unnumbered": 0}
        assert set(f) == {"code", "title", "evidence", "share", "count", "fix", "severity",
                          "run", "profiled"}
    assert "trainkit analyze: traces: steps 3-5, 8-10 (2 traces)\n" in got.err


def test_the_work_after_the_last_step_is_no_profiled_step(logdir, capsys):
    """The session closes inside the cycle (wait 2, warm-up 1, 5 steps): the trace holds steps 4
    and 5, and what ran after the loop, which is no step and not named as one."""
    train(logdir, steps=5, profile=tk.ProfileSchedule(wait=2, warmup=1, active=5))
    main([logdir])
    assert capsys.readouterr().out.endswith("traces: steps 4-5 (1 trace)\n")


def test_each_run_says_its_own_and_a_rerun_names_only_the_traces_analyzed(tmp_path, capsys):
    """Runs side by side get a line each, tagged as their findings are; in a folder run again,
    the earlier session's trace is left out (TA111), and so are its steps."""
    root = str(tmp_path / "runs")
    train(os.path.join(root, "a"), steps=12, profile=TWICE)
    train(os.path.join(root, "b"), steps=6)
    rerun = os.path.join(root, "c")
    train(rerun, steps=12, profile=tk.ProfileSchedule(wait=0, warmup=1, active=2))
    train(rerun, steps=12, profile=tk.ProfileSchedule(wait=5, warmup=1, active=1))
    main([root])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == ["traces: steps 3-5, 8-10 (2 traces) [a]",
                          "traces: none [b]",
                          "traces: step 7 (1 trace) [c]"], lines
    assert any(line.startswith("TA111") and line.endswith("[c]") for line in lines)
