"""Records survive the ways a training process ends: SIGTERM, SIGINT, an exception, SIGKILL.

Each child trains Linear(8, 2) forever (scripts/train_forever.py) and prints ``step N LOSS T``
once everything of step N has been recorded; the parent stops it and reads the event file back.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from ._util import REPO, SCRIPTS, Child, child_env, event_files, read_scalars, steps_of

STEP_TIME = "trainkit/step_time_ms"
UPDATE = "trainkit/update_ms"
SCRIPT = SCRIPTS / "train_forever.py"
WAIT_STEP = 30


def _start(logdir, flush_secs, mode, *extra) -> Child:
    return Child([sys.executable, SCRIPT, logdir, str(flush_secs), mode, *extra])


def _run_until_step(child: Child, n: int = WAIT_STEP) -> None:
    child.wait_for(lambda line: line.startswith(f"step {n} "), timeout=90)


def _signal_at_step(logdir, mode, sig, *extra, before_signal=None):
    """Start the child (flush_secs=60: only the signal's flush can save the records), let it run
    to WAIT_STEP, send ``sig`` and wait. Returns ``(child, returncode)``."""
    child = _start(logdir, 60, mode, *extra)
    try:
        _run_until_step(child)
        if before_signal is not None:
            before_signal()
        child.proc.send_signal(sig)
        rc = child.wait(60)
    finally:
        child.kill()
    return child, rc


def _assert_flushed(logdir, child: Child) -> int:
    """Every step the child printed is in the event file, with its loss. Returns that count."""
    printed = child.steps()
    assert printed, f"child printed no step; stderr={child.stderr[-3000:]}"
    n = printed[-1][0]
    assert [p[0] for p in printed] == list(range(1, n + 1))
    assert n >= WAIT_STEP

    files = event_files(logdir)
    assert len(files) == 1, files
    scalars = read_scalars(logdir)

    # Step N was fully recorded before "step N" was printed; only step N+1, in progress when the
    # signal came, may or may not be there.
    steps = steps_of(scalars, STEP_TIME)
    assert steps[:n] == list(range(1, n + 1)), (steps[:5], steps[-5:], n)
    assert len(steps) in (n, n + 1), (len(steps), n)
    assert all(v > 0 for _, v in scalars[STEP_TIME])
    assert steps_of(scalars, UPDATE)[:n] == list(range(1, n + 1))

    losses = dict(scalars["loss"])
    assert len(scalars["loss"]) == len(losses), "a step's loss was written twice"
    assert set(losses) - {n + 1} == set(range(1, n + 1))
    for step, loss, _ in printed:
        assert losses[step] == pytest.approx(loss, rel=1e-6, abs=1e-7), step
    return n


@pytest.mark.timeout(120)
def test_sigterm_flushes_and_dies_by_sigterm(tmp_path):
    logdir = tmp_path / "run"
    child, rc = _signal_at_step(logdir, "plain", signal.SIGTERM)
    assert rc == -signal.SIGTERM, (rc, child.stderr[-3000:])
    assert "Traceback" not in child.stderr, child.stderr[-3000:]
    _assert_flushed(logdir, child)


@pytest.mark.timeout(120)
def test_sigterm_runs_users_own_handler_after_flushing(tmp_path):
    logdir = tmp_path / "run"
    marker = tmp_path / "marker.txt"
    def no_marker_yet():
        assert not marker.exists()

    child, rc = _signal_at_step(logdir, "user_handler", signal.SIGTERM, marker,
                                before_signal=no_marker_yet)
    assert rc == 3, (rc, child.stderr[-3000:])
    assert marker.read_text() == f"handled {int(signal.SIGTERM)}\n"
    _assert_flushed(logdir, child)


@pytest.mark.timeout(120)
def test_sigint_uncaught_flushes_and_dies_by_sigint(tmp_path):
    logdir = tmp_path / "run"
    child, rc = _signal_at_step(logdir, "plain", signal.SIGINT)
    # Since Python 3.8 an uncaught KeyboardInterrupt ends the interpreter by re-raising SIGINT
    # with the default action, so the parent sees death by SIGINT (-2), not exit status 1.
    assert sys.version_info >= (3, 8)
    assert rc == -signal.SIGINT, (rc, child.stderr[-3000:])
    assert "KeyboardInterrupt" in child.stderr, child.stderr[-3000:]
    _assert_flushed(logdir, child)


@pytest.mark.timeout(120)
def test_sigint_caught_outside_session_flushes_and_exits_0(tmp_path):
    logdir = tmp_path / "run"
    child, rc = _signal_at_step(logdir, "catch_kbi", signal.SIGINT)
    assert rc == 0, (rc, child.stderr[-3000:])
    assert child.lines[-1] == "caught", child.lines[-3:]
    assert "Traceback" not in child.stderr, child.stderr[-3000:]
    _assert_flushed(logdir, child)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_session_without_with_is_flushed_on_signal(tmp_path, sig):
    """`s = tk.session(...)` never closed: the SIGTERM handler / atexit still flush it."""
    logdir = tmp_path / "run"
    child, rc = _signal_at_step(logdir, "no_with", sig)
    assert rc == -sig, (rc, child.stderr[-3000:])
    _assert_flushed(logdir, child)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, expect", [("ignore", "done []"), ("flag", "done [15]")])
def test_session_keeps_recording_when_the_process_survives_sigterm(tmp_path, mode, expect):
    logdir = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "sigterm_survived.py"), str(logdir), mode],
                          cwd=str(REPO), env=child_env(), capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[-2] == expect, proc.stdout
    scalars = read_scalars(logdir)
    assert steps_of(scalars, STEP_TIME) == list(range(1, 11))
    assert steps_of(scalars, "loss") == list(range(1, 11))


@pytest.mark.timeout(120)
def test_exception_propagates_unchanged_and_records_are_flushed(tmp_path):
    import torch

    import trainkit as tk

    logdir = tmp_path / "run"
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(5)]
    error = ValueError("boom at step 5")
    logged = []
    try:
        with pytest.raises(ValueError) as info:
            with tk.session(logdir=logdir, flush_secs=60, system_metrics=False) as s:
                tk.patch(opt)
                for i, (x, y) in enumerate(tk.patch(data), start=1):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    s.log("loss", loss)
                    logged.append(loss.item())
                    if i == 5:
                        raise error
    finally:
        tk.unpatch(opt)
    assert info.value is error
    assert info.value.__context__ is None and info.value.__cause__ is None
    # The traceback ends at the user's `raise`, not somewhere in trainkit's exit code.
    assert str(info.traceback[-1].statement).strip() == "raise error"
    assert s.closed and tk.active() is None

    scalars = read_scalars(logdir)
    assert steps_of(scalars, STEP_TIME) == [1, 2, 3, 4, 5]
    assert steps_of(scalars, UPDATE) == [1, 2, 3, 4, 5]
    assert steps_of(scalars, "loss") == [1, 2, 3, 4, 5]
    assert [v for _, v in scalars["loss"]] == pytest.approx(logged, rel=1e-6)


@pytest.mark.timeout(120)
def test_sigkill_loses_at_most_the_last_flush_secs(tmp_path):
    logdir = tmp_path / "run"
    flush_secs = 0.5
    child = _start(logdir, flush_secs, "plain")
    try:
        child.wait_for(lambda line: line.startswith("step 1 "), timeout=90)
        time.sleep(3.0)
        killed_at = time.monotonic()
        child.proc.send_signal(signal.SIGKILL)
        rc = child.wait(30)
    finally:
        child.kill()
    assert rc == -signal.SIGKILL

    printed = child.steps()
    must = [step for step, _, t in printed if t <= killed_at - 3 * flush_secs]
    # ~3 s of training at a few hundred steps/s: well over a second's worth must be safe.
    assert len(must) >= 20, (len(must), len(printed))
    assert must == list(range(1, len(must) + 1))

    scalars = read_scalars(logdir)
    steps = steps_of(scalars, STEP_TIME)
    assert steps[:len(must)] == must, (steps[-3:], must[-3:])
    # Nothing invented: the file holds no step the child had not finished.
    assert len(steps) <= len(printed) + 1
    assert steps == list(range(1, len(steps) + 1))


@pytest.mark.parametrize("flags", [[], ["-W", "error"]], ids=["", "warnings-as-errors"])
def test_a_full_disk_is_said_and_neither_replaces_the_users_exception_nor_fills_memory(tmp_path,
                                                                                      flags):
    # The event file stops taking writes mid-run (RLIMIT_FSIZE stands in for a full disk).
    # The writer says so once, keeps emptying the buffer, and the user's own exception leaves
    # the block unchanged (before, close() raised OSError over it). Where warnings are errors
    # (-W error), the warning raised in the writer thread ended it: the records piled up.
    script = """
import resource, signal, sys, time, warnings
import torch, trainkit as tk
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
try:
    with tk.session(logdir=sys.argv[1], system_metrics=False, flush_secs=0.05) as s:
        tk.patch(opt)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, resource.RLIM_INFINITY))
        for i in range(2000):
            loss = m(torch.randn(8, 4)).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
            s.log("loss", loss)
            if i % 100 == 0:
                time.sleep(0.06)
        time.sleep(0.2)
        print("failed", type(s._recorder.failed).__name__, "buffered", len(s._buf), flush=True)
        raise KeyError("users own")
except KeyError as e:
    print("propagated", repr(e), "context", repr(e.__context__), flush=True)
"""
    proc = subprocess.run([sys.executable, *flags, "-c", script, str(tmp_path / "run")],
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split()
    assert out[:2] == ["failed", "OSError"] and int(out[3]) < 300, (proc.stdout, proc.stderr)
    assert "propagated KeyError('users own') context None" in proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("RuntimeWarning: trainkit: writing the run to") == 1, proc.stderr
    assert "the training goes on" in proc.stderr


def test_a_run_killed_before_its_first_flush_is_a_trainkit_run_with_no_steps(tmp_path):
    # Killed at once (the OOM killer while the model loads): the file held its header alone, and
    # `trainkit analyze` said "no trainkit run ... record one with tk.session" (exit 2) of a run
    # that tk.session recorded. Its first write now says it is trainkit's, with the versions.
    import json

    import trainkit as tk
    from trainkit.profiling.cli import main as analyze_main
    from trainkit.profiling.runs import load_run

    logdir = tmp_path / "run"
    script = ("import os, signal, sys, torch, trainkit as tk\n"
              "tk.session(logdir=sys.argv[1], system_metrics=False).__enter__()\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(logdir)], env=child_env(), cwd=REPO,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert len(event_files(str(logdir))) == 1
    assert [f.code for f in tk.analyze(str(logdir))] == ["TA110"]
    assert analyze_main([str(logdir)]) == 1
    versions = json.loads(load_run(str(logdir), str(logdir)).meta["trainkit/meta/versions"])
    assert versions["trainkit"] == tk.__version__ and versions["torch"] and versions["python"]


def test_os_exit_in_the_main_process_loses_what_a_sigkill_would_as_the_readme_says(tmp_path):
    # os._exit runs no exit handler (atexit, finalizers): as with a SIGKILL, what was recorded
    # since the last write is lost; the exit status is the one given. The README said so of
    # SIGKILL alone.
    logdir = tmp_path / "run"
    script = ("import os, sys, trainkit as tk\n"
              "s = tk.session(logdir=sys.argv[1], system_metrics=False, flush_secs=60)\n"
              "for i in range(1, 6):\n"
              "    s.log('x', float(i), step=i)\n"
              "os._exit(3)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(logdir)], env=child_env(), cwd=REPO,
                          timeout=120)
    assert proc.returncode == 3
    assert len(event_files(str(logdir))) == 1 and "x" not in read_scalars(logdir)
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert "`os._exit(n)` in the main process loses what a SIGKILL loses" in readme
