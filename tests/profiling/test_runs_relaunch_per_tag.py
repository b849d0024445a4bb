"""A relaunch into a run's folder that closed before its first step (a script restarted with the
same logdir that crashed in setup, or exited before ``optimizer.step()``) hid the whole earlier
run: TA110 (no steps) and TA111 (a session "counted its steps again") for a run TensorBoard shows
with all its step times. TensorBoard's default loader hides only the tags it wrote again (its
close's system sample, under step 1 or its ``steps_done``); the analysis, beside a session that
counted steps, hides such a relaunch whole, and it hides nothing (test_runs_failed_relaunch.py:
its data wait at step 1 hid the run's). Where no session counted a step, the sessions merge tag
by tag, as TensorBoard shows them. A later session that counted steps still hides every tag of
the earlier ones from its first counted step on.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import trainkit as tk
from trainkit.profiling import runs
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.cli import main
from trainkit.sinks.system import CPU_PERCENT, PEAK_MB, RSS_MB

from .conftest import event_files

STEP_TIME = "trainkit/step_time_ms"
UPDATE_MS = "trainkit/update_ms"
SYSTEM = (CPU_PERCENT, RSS_MB, PEAK_MB)


def session(logdir, *, steps, steps_done=0, crash=False, log_once=False):
    """A session with system metrics (sampled at its close too) around a patched SGD stepping
    ``steps`` times, logging its loss each step; ``crash``: an error after the steps (a setup
    that fails, when no step ran); ``log_once``: a value logged with no step counted."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.01))
    with tk.session(logdir=logdir, system_metrics=True, steps_done=steps_done) as s:
        if log_once:
            s.log("loss", 123.0)
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(torch.randn(8, 16)), torch.randn(8, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            s.log("loss", loss.item())
        if crash:
            raise RuntimeError("CUDA out of memory (planted)")


def relaunch(logdir, **kw):
    with pytest.raises(RuntimeError, match="planted") if kw.get("crash") \
            else contextlib.nullcontext():
        session(logdir, **kw)


def steps_of(points):
    return [s for s, _ in points]


def legacy(logdir):
    """TensorBoard's EventAccumulator (the ``--load_fast=false`` loader): ``tag -> [(step, v)]``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(logdir)
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


def codes(findings):
    return [f.code for f in findings]


@pytest.mark.parametrize("crash", [False, True], ids=["exited", "crashed_in_setup"])
def test_a_relaunch_that_closed_before_its_first_step_hides_none_of_the_runs_steps(
        tmp_path, capsys, crash):
    logdir = str(tmp_path / "exp")
    session(logdir, steps=12)
    relaunch(logdir, steps=0, crash=crash)
    first, second = event_files(logdir)
    earlier, later = runs.read_scalars(logdir, [first]), runs.read_scalars(logdir, [second])
    assert sorted(later) == sorted(SYSTEM)  # the relaunch wrote its close's sample alone
    assert all(steps_of(later[t]) == [1] for t in SYSTEM)

    run = runs.load_run(logdir, logdir)
    # the relaunch counted no step: hidden whole, and it hides nothing
    assert run.sessions == (first, second) and run.hidden == (second,)
    assert run.hidden_counted == ()
    assert run.started == runs.session_start(os.path.join(logdir, first))
    # the earlier run's steps, as both of TensorBoard's loaders show them
    shown = legacy(logdir)
    for tag in (STEP_TIME, UPDATE_MS, "loss"):
        assert run.scalars[tag] == earlier[tag] and steps_of(run.scalars[tag]) == \
            steps_of(shown[tag])
    assert steps_of(run.scalars[STEP_TIME]) == list(range(2, 13))
    # the system tags the relaunch wrote again: the run's own samples (the default loader
    # shows the relaunch's point alone, dropping the earlier session's from step 1 on; the
    # legacy one, of file version 2, drops nothing)
    assert run.scalars == earlier

    found = tk.analyze(logdir)
    assert "TA110" not in codes(found) and "TA111" not in codes(found), found
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(os.path.join(logdir, first), alone)
    assert analyze_run(logdir, logdir).steps == analyze_run(str(alone), str(alone)).steps == 10
    capsys.readouterr()
    main([logdir])
    out = capsys.readouterr().out
    assert "TA110" not in out and "TA111" not in out, out


def test_a_relaunch_that_logged_before_its_first_step_hides_no_tag_of_the_run(tmp_path):
    """A value logged before the first step (under step 1) hides that tag's points of the run
    before in TensorBoard's default loader; the analysis keeps the run's: the relaunch counted
    no step, so it hides nothing (it hid the run's losses since 42b0c5c)."""
    logdir = str(tmp_path / "exp")
    session(logdir, steps=12)
    session(logdir, steps=0, log_once=True)
    first, second = event_files(logdir)
    earlier = runs.read_scalars(logdir, [first])
    run = runs.load_run(logdir, logdir)
    assert run.hidden == (second,) and run.hidden_counted == ()
    assert run.scalars == earlier and (1, 123.0) not in run.scalars["loss"]
    assert "TA111" not in codes(tk.analyze(logdir))


def test_where_no_session_counted_a_step_they_merge_tag_by_tag(tmp_path):
    """Two sessions that counted no step: the later hides the tags it wrote again, from the step
    it wrote them at, as TensorBoard's default loader does; the others stay (nothing to analyze
    in either: TA110)."""
    logdir = str(tmp_path / "exp")
    session(logdir, steps=0, log_once=True)
    relaunch(logdir, steps=0, crash=True)
    first, second = event_files(logdir)
    later = runs.read_scalars(logdir, [second])
    assert sorted(later) == sorted(SYSTEM)
    run = runs.load_run(logdir, logdir)
    assert run.hidden == () and run.hidden_counted == ()
    assert run.scalars["loss"] == [(1, 123.0)]
    for tag in SYSTEM:
        assert run.scalars[tag] == later[tag]
    assert codes(tk.analyze(logdir)) == ["TA110"]


def test_a_resumed_session_that_closed_before_its_first_step_hides_no_step(tmp_path):
    """Resumed at step 8 (``steps_done=8``) and crashed in setup: its close's sample goes under
    step 8, which dropped the run's steps from 8 on, every tag alike. TensorBoard's default
    loader drops the run's system samples from step 8 on; the analysis hides the relaunch whole
    (it counted no step)."""
    logdir = str(tmp_path / "exp")
    session(logdir, steps=12)
    relaunch(logdir, steps=0, steps_done=8, crash=True)
    first, second = event_files(logdir)
    earlier, later = runs.read_scalars(logdir, [first]), runs.read_scalars(logdir, [second])
    assert all(steps_of(later[t]) == [8] for t in SYSTEM)
    run = runs.load_run(logdir, logdir)
    assert run.hidden == (second,) and run.hidden_counted == ()
    assert run.scalars == earlier
    assert "TA111" not in codes(tk.analyze(logdir))


def test_a_rerun_that_counted_one_step_still_hides_the_run_before_it(tmp_path):
    """One optimizer step, then a crash: no step time yet (a run's first step has none), but its
    update at step 1 restarts the count, so every tag of the run before is hidden (its loss and
    step times too, which the rerun did not write again)."""
    logdir = str(tmp_path / "exp")
    session(logdir, steps=12)
    relaunch(logdir, steps=1, crash=True)
    first, second = event_files(logdir)
    later = runs.read_scalars(logdir, [second])
    assert STEP_TIME not in later and steps_of(later[UPDATE_MS]) == [1]
    run = runs.load_run(logdir, logdir)
    assert run.hidden == run.hidden_counted == (first,) and run.started is not None
    assert run.scalars == later
    assert {"TA110", "TA111"} <= set(codes(tk.analyze(logdir)))


def test_a_rerun_that_counted_steps_hides_every_tag_of_the_run_before_it(tmp_path):
    logdir = str(tmp_path / "exp")
    session(logdir, steps=12)
    session(logdir, steps=5)
    first, second = event_files(logdir)
    run = runs.load_run(logdir, logdir)
    assert run.hidden == (first,) and run.scalars == runs.read_scalars(logdir, [second])
    assert steps_of(run.scalars[STEP_TIME]) == [2, 3, 4, 5]
    assert "TA111" in codes(tk.analyze(logdir))


# -- what a real TensorBoard serves ---------------------------------------------------------------

def served(port, server, log_path, want):
    """``tag -> steps`` TensorBoard's scalars plugin serves for run "exp", once they are
    ``want``'s (it may serve part of the files while it loads), or what it serves after 90 s."""
    base = f"http://127.0.0.1:{port}/data/plugin/scalars"
    deadline, got = time.monotonic() + 90, None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            text = log_path.read_text(errors="replace")
            pytest.skip(f"TensorBoard cannot run here: {text[-500:]}")
        try:
            with urllib.request.urlopen(f"{base}/tags", timeout=2) as resp:
                tags = json.loads(resp.read()).get("exp", {})
            got = {}
            for tag in tags:
                query = urllib.parse.urlencode({"run": "exp", "tag": tag})
                with urllib.request.urlopen(f"{base}/scalars?{query}", timeout=2) as resp:
                    got[tag] = [p[1] for p in json.loads(resp.read())]
        except (urllib.error.URLError, ConnectionError, OSError, ValueError):
            got = None
        if got == want:
            break
        time.sleep(0.5)
    return got


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("steps_done", [0, 8])
def test_tensorboards_default_loader_shows_the_runs_steps_as_the_analysis_reads_them(tmp_path,
                                                                                     steps_done):
    from ..process._util import REPO, child_env, free_port, stop_server

    root = tmp_path / "logs"
    logdir = str(root / "exp")
    session(logdir, steps=12)
    relaunch(logdir, steps=0, steps_done=steps_done, crash=True)
    run = runs.load_run(str(root), logdir)
    first, second = event_files(logdir)
    later = runs.read_scalars(logdir, [second])
    want = {tag: steps_of(points) for tag, points in run.scalars.items()}
    assert want[STEP_TIME] == list(range(2, 13))
    # the system tags the relaunch wrote again: the analysis keeps the run's samples (the
    # relaunch counted no step), TensorBoard drops them from the relaunch's step on
    for tag in SYSTEM:
        assert run.scalars[tag] == runs.read_scalars(logdir, [first])[tag]
        (at,) = steps_of(later[tag])
        want[tag] = [s for s in want[tag] if s < at] + [at]

    port = free_port()
    log_path = tmp_path / "tensorboard.log"
    log = open(log_path, "wb")  # a file, not a pipe nobody drains
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(root), "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "1", "--load_fast=true"],
        cwd=str(REPO), env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        assert served(port, server, log_path, want) == want
    finally:
        stop_server(server, log)
