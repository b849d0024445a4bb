"""Which iterations of a patched loader are steps: its batches where no optimizer steps (an
evaluation session after training, under no_grad beside an optimizer not stepped yet), the
optimizer's steps again once it steps (training resumed in a new session, after an evaluation,
accumulating), a batch step's wait and body, zipped and nested patched loaders, and an optimizer
patched inside the loop."""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp, train


def _eval_pass(model, batches, s):
    with torch.no_grad():
        for x, y in tk.patch(batches):
            s.log("acc", float((model(x).argmax(1) == y).float().mean()))


def test_evaluation_session_after_training_counts_its_batches(tmp_path):
    # The training session's optimizer is still alive (and patched) when the evaluation session
    # runs: it stepped in another session, so here each batch is a step, as with no optimizer.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=32, batch_size=8))
    with tk.session(logdir=tmp_path / "train", system_metrics=False) as s:
        train(model, opt, tk.patch(batches), log=s.log)
    with tk.session(logdir=tmp_path / "eval", system_metrics=False) as s:
        _eval_pass(model, batches, s)
    got = scalars(tmp_path / "eval")
    assert [st for st, _ in got["acc"]] == [1, 2, 3, 4]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3, 4]
    assert [st for st, _ in scalars(tmp_path / "train")["loss"]] == [1, 2, 3, 4]


def test_training_resumed_in_a_new_session_counts_optimizer_steps(tmp_path):
    # The same optimizer in a second session (training goes on after an evaluation session):
    # from its first step there, steps are optimizer steps again, each batch's records with it.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=32, batch_size=8))
    with tk.session(logdir=tmp_path / "a", system_metrics=False) as s:
        train(model, opt, tk.patch(batches), log=s.log)
    with tk.session(logdir=tmp_path / "b", system_metrics=False) as s:
        _eval_pass(model, batches[:2], s)
        train(model, opt, tk.patch(batches), log=s.log)
        train(model, opt, tk.patch(batches), log=s.log)
    got = scalars(tmp_path / "b")
    assert [st for st, _ in got["acc"]] == [1, 2]
    assert [st for st, _ in got["loss"]] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert [st for st, _ in got["trainkit/update_ms"]] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == list(range(1, 11))
    with tk.session(logdir=tmp_path / "c", system_metrics=False) as s:  # training right away
        train(model, opt, tk.patch(batches), log=s.log)
    got = scalars(tmp_path / "c")
    assert [st for st, _ in got["loss"]] == [st for st, _ in got["trainkit/update_ms"]] == [1, 2, 3, 4]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3, 4]


def test_evaluation_under_no_grad_counts_batches_beside_an_optimizer_not_stepped_yet(tmp_path):
    # A patched optimizer that never stepped may be about to train; under no_grad it cannot.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=24, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        _eval_pass(model, batches, s)  # under torch.no_grad()
        train(model, opt, tk.patch(batches), log=s.log)
    got = scalars(tmp_path)
    assert [st for st, _ in got["acc"]] == [1, 2, 3]
    assert [st for st, _ in got["loss"]] == [st for st, _ in got["trainkit/update_ms"]] == [4, 5, 6]


def test_training_with_a_plain_loader_after_a_patched_evaluation(tmp_path):
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=32, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        _eval_pass(model, batches[:2], s)
        for x, y in batches:  # not patched: values go under the step in progress
            loss = torch.nn.functional.cross_entropy(model(x), y)
            s.log("loss", loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    assert [st for st, _ in got["acc"]] == [1, 2]
    assert [st for st, _ in got["loss"]] == [st for st, _ in got["trainkit/update_ms"]] == [3, 4, 5, 6]


def test_accumulating_training_after_an_evaluation_steps_once_per_window(tmp_path):
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=32, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        train(model, opt, tk.patch(batches[:1]), log=s.log)
    with tk.session(logdir=tmp_path / "b", system_metrics=False) as s:
        _eval_pass(model, batches[:2], s)
        with tk.accumulate(2, opt):
            train(model, opt, tk.patch(batches), log=s.log)
    got = scalars(tmp_path / "b")
    assert [st for st, _ in got["acc"]] == [1, 2]
    assert [st for st, _ in got["loss"]] == [st for st, _ in got["trainkit/update_ms"]] == [3, 4]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3, 4]
    assert [v for _, v in got["trainkit/samples_per_s"]][-1] > 0  # two batches of 8 in step 4


def test_a_batch_step_holds_its_wait_and_its_body_the_last_and_a_left_one_too(tmp_path):
    # Batches as steps: a step runs from its batch's wait to the next batch's (the loop's end,
    # or where the loop was left), so the body's time is its own batch's, not the next one's.
    batches = [torch.zeros(4, 2)] * 3
    with tk.session(logdir=tmp_path / "full", system_metrics=False):
        for _ in tk.patch(batches):
            time.sleep(0.03)
    with tk.session(logdir=tmp_path / "left", system_metrics=False):
        for i, _ in enumerate(tk.patch(batches)):
            time.sleep(0.03)
            if i == 1:
                break
    for run, steps in (("full", [1, 2, 3]), ("left", [1, 2])):
        got = scalars(tmp_path / run)
        step_ms = got["trainkit/step_time_ms"]
        assert [st for st, _ in step_ms] == steps, run
        assert all(30.0 <= ms < 1000 for _, ms in step_ms), (run, step_ms)
        for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], step_ms):
            assert sps == pytest.approx(4 / (ms / 1e3), rel=1e-4)


def test_zipped_and_nested_patched_loaders_count_one_step_per_iteration_when_batches_are_steps(
        tmp_path):
    # Two patched loaders zipped (paired evaluation sets): a step per pair, holding both waits
    # and both batches' items. Nested: the inner loop's batches are the steps (the outer
    # batch's wait joins the first of them), and the inner loop's end does not end a step
    # twice. Before, every batch of either loader was a step of its own.
    a = [torch.zeros(4, 2)] * 3
    b = [torch.zeros(6, 2)] * 3
    with tk.session(logdir=tmp_path / "zip", system_metrics=False) as s:
        for i, (x, y) in enumerate(zip(tk.patch(a), tk.patch(b))):
            time.sleep(0.01)
            s.log("i", float(i))
    got = scalars(tmp_path / "zip")
    assert got["i"] == [(1, 0.0), (2, 1.0), (3, 2.0)]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2, 3]
    for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], got["trainkit/step_time_ms"]):
        assert sps == pytest.approx(10 / (ms / 1e3), rel=1e-4)  # 4 + 6 items a step
    with tk.session(logdir=tmp_path / "zip_short", system_metrics=False):
        for _ in zip(tk.patch(a), tk.patch(b[:2])):  # the second one ends the pairs
            time.sleep(0.01)
    got = scalars(tmp_path / "zip_short")
    # two pairs, two steps; a's unpaired third batch is no step (its wait: a point of its own)
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3]
    with tk.session(logdir=tmp_path / "nested", system_metrics=False) as s:
        for i, _ in enumerate(tk.patch(a[:2])):
            for j, _ in enumerate(tk.patch(b)):
                time.sleep(0.01)
                s.log("ij", float(10 * i + j))
    got = scalars(tmp_path / "nested")
    assert got["ij"] == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 10.0), (5, 11.0), (6, 12.0)]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2, 3, 4, 5, 6]
    assert all(10.0 <= ms < 1000 for _, ms in got["trainkit/step_time_ms"])


def test_zipped_patched_loaders_feeding_training_add_up_in_the_step(tmp_path):
    # Two sources per step (domain adaptation): both waits and both batches' items in the step
    # the optimizer ends, and the loss logged after the step under it.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    src, tgt = list(loader(n=24, batch_size=8)), list(loader(n=12, batch_size=4, seed=2))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for (x, y), (xt, _) in zip(tk.patch(src), tk.patch(tgt)):
            loss = torch.nn.functional.cross_entropy(model(x), y) + model(xt).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.log("loss", loss)
    got = scalars(tmp_path)
    assert [st for st, _ in got["loss"]] == [1, 2, 3]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3]
    for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], got["trainkit/step_time_ms"]):
        assert sps == pytest.approx(12 / (ms / 1e3), rel=1e-4)  # 8 + 4 items a step


def test_an_optimizer_patched_inside_the_loop_takes_the_batch_in_progress(tmp_path):
    # No optimizer was patched at the first batch, so it was counted as a step; the optimizer
    # patched (lazily) in that iteration makes it a training step: no phantom step.
    model = mlp()
    opt = None
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for i, (x, y) in enumerate(tk.patch(list(loader(n=32, batch_size=8)))):
            if opt is None:
                opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            s.log("loss", float(i))
    got = scalars(tmp_path)
    assert got["loss"] == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)]
    assert [st for st, _ in got["trainkit/update_ms"]] == [1, 2, 3, 4]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2, 3, 4]
