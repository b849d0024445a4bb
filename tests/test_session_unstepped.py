"""A session in which nothing counts steps (nothing patched, or a patched optimizer that never
steps) files every value logged without ``step=`` under its first step, which
TensorBoard shows as one point (or a few, one per flush) where the loop logged many: the close
says so, with the counts and the fix. Sessions that count steps, or whose values each have a step
of their own, say nothing."""
from __future__ import annotations

import gc
import time
import warnings

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp, train

SAID = "this session counted no step"


def _said(record) -> list:
    return [str(w.message) for w in record if SAID in str(w.message)]


def test_values_logged_with_nothing_counting_steps_are_said_at_the_close(tmp_path):
    with pytest.warns(RuntimeWarning, match=SAID) as record:
        with tk.session(logdir=tmp_path, system_metrics=False) as s:
            for i in range(5):
                with tk.profile_region("forward"):
                    pass
                s.log("loss", torch.tensor(float(i)))
                s.log("acc", i / 10)
            s.log("lr", 0.1)  # once: one value at step 1 is just that
    got = scalars(tmp_path)
    assert got["loss"] == [(1, pytest.approx(2.0))]  # the five merged: what the warning is about
    (message,) = _said(record)
    assert "'loss' logged 5 times (their mean)" in message
    assert "'acc' logged 5 times (their mean)" in message
    assert "forward" not in message  # a region's total over a stepless script may be meant
    assert "'lr'" not in message
    assert "tk.patch(optimizer)" in message and "step=" in message
    # It points at the user's `with`, not at trainkit's code.
    assert record[0].filename == __file__


def test_values_written_ahead_during_the_run_are_counted_too(tmp_path):
    # With no step counted, the writer writes the first step's user values while the run goes
    # on (nothing is held to the close): each flush adds a point at step 1. The close counts
    # them all, not only what was left at the end. A collection (trainkit's own gc_ms in step
    # 1) holds back none of them.
    with pytest.warns(RuntimeWarning, match=SAID) as record:
        with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=0.05) as s:
            for i in range(3):
                s.log("loss", float(i))
            gc.collect()
            deadline = time.monotonic() + 60
            while "loss" not in scalars(tmp_path):  # the writer wrote step 1 ahead
                assert time.monotonic() < deadline, "the writer never wrote step 1"
                time.sleep(0.05)
            for i in range(3, 5):
                s.log("loss", float(i))
    got = scalars(tmp_path)["loss"]
    assert len(got) >= 2 and {st for st, _ in got} == {1}
    (message,) = _said(record)
    assert "'loss' logged 5 times" in message


def test_a_resumed_session_names_its_own_first_step(tmp_path):
    with pytest.warns(RuntimeWarning, match=SAID) as record:
        with tk.session(logdir=tmp_path, system_metrics=False, steps_done=40) as s:
            s.log("loss", 1.0)
            s.log("loss", 3.0)
    assert "under step 41" in _said(record)[0]
    assert scalars(tmp_path)["loss"] == [(41, 2.0)]


def test_a_patched_optimizer_that_never_steps_is_said_too(tmp_path):
    # A loop that learns once a replay buffer is warm, cut short: the optimizer is patched, its
    # step() never called.
    opt = torch.optim.SGD(mlp().parameters(), lr=0.1)
    with pytest.warns(RuntimeWarning, match=SAID):
        with tk.session(logdir=tmp_path, system_metrics=False) as s:
            tk.patch(opt)
            for i in range(3):
                s.log("reward", float(i))


@pytest.mark.parametrize("how", ["optimizer", "eval loader", "explicit steps", "once each"])
def test_sessions_whose_values_each_have_a_step_say_nothing(tmp_path, how):
    model = mlp()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with tk.session(logdir=tmp_path, system_metrics=False) as s:
            if how == "optimizer":
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                tk.patch(opt)
                train(model, opt, tk.patch(loader(n=32, batch_size=8)),
                      log=s.log)
            elif how == "eval loader":  # no optimizer: each batch is a step
                with torch.no_grad():
                    for x, _ in tk.patch(loader(n=32, batch_size=8)):
                        s.log("out", model(x).mean())
            elif how == "explicit steps":  # an RL loop logging by environment step
                for i in range(5):
                    s.log("reward", float(i), step=10 * i)
            else:
                s.log("final_accuracy", 0.9)
                s.log("params", 1234.0)
    assert _said(record) == []
    assert scalars(tmp_path)


def test_batches_of_a_loader_under_an_optimizer_that_never_steps_say_why_they_were_no_steps(tmp_path):
    # The advice was "patch one [loader] inside the session" of a loader that was patched: its
    # batches were no steps because a patched optimizer was to step, and never did.
    model = mlp()
    opt = tk.patch(torch.optim.Adam(model.parameters(), lr=0.1))
    with pytest.warns(RuntimeWarning, match=SAID) as record:
        with tk.session(logdir=tmp_path, system_metrics=False) as s:
            for x, _y in tk.patch(loader()):
                s.log("out", model(x).sum())
    (message,) = _said(record)
    assert "The patched loader's batches were no steps because the patched Adam was to step" in message
    assert "torch.no_grad()" in message and "patch one inside the session" not in message
    del opt
