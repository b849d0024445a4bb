"""What a real TensorBoard shows for a run folder two sessions wrote into, and that trainkit's
analysis (the tab's included) is of the session it shows."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from trainkit.profiling.runs import read_scalars
from trainkit.sinks.tbplugin.data import TabData

from ..profiling.conftest import train
from ._util import REPO, child_env, free_port, stop_server

TAG = "trainkit/step_time_ms"


@contextlib.contextmanager
def tensorboard(logdir, tmp_path, load_fast):
    port = free_port()
    log_path = tmp_path / f"tensorboard-{load_fast}.log"
    log = open(log_path, "wb")  # a file, not a pipe nobody drains
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "1", f"--load_fast={load_fast}"],
        cwd=str(REPO), env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        yield port, server, log_path
    finally:
        stop_server(server, log)


def points(port, server, log_path, want):
    """The step_time_ms points TensorBoard serves for run "exp", once their steps are ``want``'s
    (it may serve part of the files while it loads), or what it serves after 90 s."""
    query = urllib.parse.urlencode({"run": "exp", "tag": TAG})
    deadline, got = time.monotonic() + 90, None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            text = log_path.read_text(errors="replace")
            if "--load_fast=true" in text or "data server" in text.lower():
                pytest.skip(f"TensorBoard's data server cannot run here: {text[-500:]}")
            pytest.fail(text[-3000:])
        try:
            url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?{query}"
            with urllib.request.urlopen(url, timeout=2) as resp:
                got = [(p[1], p[2]) for p in json.loads(resp.read())]
        except (urllib.error.URLError, ConnectionError, OSError, ValueError):
            got = None
        if got is not None and [p[0] for p in got] == [p[0] for p in want]:
            break
        time.sleep(0.5)
    return got or []


def same(got, want):
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tensorboard_shows_the_latest_session_and_trainkit_analyzes_it(tmp_path):
    root = tmp_path / "logs"
    logdir = str(root / "exp")
    train(logdir, steps=14)
    time.sleep(1.01 - time.time() % 1)  # event files are named by their second (then pid, count)
    train(logdir, steps=6)
    first, latest = sorted(f for f in os.listdir(logdir) if "tfevents" in f)
    old = [(s, v) for s, v in read_scalars(logdir, [first])[TAG]]
    new = [(s, v) for s, v in read_scalars(logdir, [latest])[TAG]]
    assert new[0][0] <= old[-1][0]  # the second session's steps start again

    # TensorBoard's default loader (the Rust data server): the latest session only
    with tensorboard(root, tmp_path, "true") as server:
        same(points(*server, want=new), new)
    # the legacy loader: both, one after the other
    with tensorboard(root, tmp_path, "false") as server:
        same(points(*server, want=old + new), old + new)

    rep = TabData(str(root)).report("exp")
    assert [f["code"] for f in rep["findings"]] == ["TA111"] and latest in rep["findings"][0]["evidence"]
    assert rep["steps"] == len(new) - 1  # the latest session's timed steps (its first left out)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tensorboard_shows_a_resumed_run_as_one_and_trainkit_reads_it_the_same(tmp_path):
    """14 steps, then resumed from a checkpoint of step 9 (steps_done=9): both of TensorBoard's
    loaders show steps 1-9 of the first session and 10-15 of the resumed one, as trainkit does."""
    from trainkit.profiling.runs import load_run

    root = tmp_path / "logs"
    logdir = str(root / "exp")
    train(logdir, steps=14)
    time.sleep(1.01 - time.time() % 1)
    train(logdir, steps=6, steps_done=9)
    run = load_run(str(root), logdir)
    want = run.scalars[TAG]
    assert [s for s, _ in want] == list(range(1, 16)) and run.hidden == ()
    for load_fast in ("true", "false"):
        with tensorboard(root, tmp_path, load_fast) as server:
            same(points(*server, want=want), want)
    rep = TabData(str(root)).report("exp")
    assert [f["code"] for f in rep["findings"]] == [] and rep["steps"] == len(want) - 1
