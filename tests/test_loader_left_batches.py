"""Batches as steps (an evaluation, inference): a batch the loader handed out that no loop body
ran for (zip's unpaired batch, a break at the top of the loop) makes no step of its own. In
training its items leave the step in progress; those of a batch worked on before the loop was
left stay there, for the step after the loop."""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp


def _steps(got, tag):
    return [st for st, _ in got.get(tag, [])]


def _check_rates(got, items, body_s):
    """Every step holds its body and its items: samples/s is items / step time, none a spike."""
    step_ms = got["trainkit/step_time_ms"]
    assert _steps(got, "trainkit/samples_per_s") == [st for st, _ in step_ms]
    for (st, sps), (_, ms) in zip(got["trainkit/samples_per_s"], step_ms):
        assert body_s * 1e3 <= ms < 1000, (st, ms)
        assert sps == pytest.approx(items / (ms / 1e3), rel=1e-4), st


@pytest.mark.parametrize("partner", ["patched", "plain"])
def test_zip_with_a_shorter_iterable_makes_no_step_of_the_unpaired_batch(tmp_path, partner):
    # zip(long, short) pulls the long loader's next batch before the short one runs out, and no
    # body runs for it. It was a step of its own as the loop ended: its wait alone for a step
    # time, so samples/s spiked, and the pass made one step more than it ran. Now its items leave
    # and its wait stays in the step in progress: the next pass's first step (whose wall time
    # holds it), or, when nothing follows, a data_wait_ms point with no step time.
    a = [torch.zeros(4, 2)] * 3
    b = [torch.zeros(6, 2)] * 2
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for _ in range(2):
            short = tk.patch(b) if partner == "patched" else b
            for i, _ in enumerate(zip(tk.patch(a), short)):
                time.sleep(0.01)
                s.log("i", float(i))
    got = scalars(tmp_path)
    assert got["i"] == [(1, 0.0), (2, 1.0), (3, 0.0), (4, 1.0)]
    assert _steps(got, "trainkit/step_time_ms") == [1, 2, 3, 4]
    _check_rates(got, 10 if partner == "patched" else 4, 0.01)
    assert _steps(got, "trainkit/data_wait_ms") == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("body", ["plain", "region", "no_grad"])
def test_a_break_at_the_top_of_an_evaluation_loop_makes_no_step_of_the_batch_left(tmp_path, body):
    # `if i == n: break` first in the body (evaluation capped at n batches): the batch n+1 was
    # handed out, no work was done on it, and it was a step of its own (its wait alone: a
    # samples/s spike) after every capped pass. A body that records nothing (plain), one that
    # records a region, and one beside a patched optimizer that does not step (no_grad).
    batches = [torch.zeros(4, 8)] * 5
    model = mlp()
    if body == "no_grad":
        tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False), torch.no_grad():
        for _ in range(2):
            for i, x in enumerate(tk.patch(batches)):
                if i == 2:
                    break
                if body == "region":
                    with tk.profile_region("forward"):
                        model(x)
                        time.sleep(0.01)
                else:
                    model(x)
                    time.sleep(0.01)
        x = next(iter(tk.patch(batches)))  # a batch taken to look at: no step either
    got = scalars(tmp_path)
    assert _steps(got, "trainkit/step_time_ms") == [1, 2, 3, 4]
    _check_rates(got, 4, 0.01)
    assert _steps(got, "trainkit/data_wait_ms") == [1, 2, 3, 4, 5]
    if body == "region":
        assert _steps(got, "trainkit/region/forward_ms") == [1, 2, 3, 4]


def test_a_break_after_the_body_keeps_the_last_step(tmp_path):
    # A break at the bottom of the body (after the work): the batch's step holds its body, whether
    # the body recorded something or took as long as the earlier ones.
    batches = [torch.zeros(4, 2)] * 5
    for run in ("logged", "timed"):
        with tk.session(logdir=tmp_path / run, system_metrics=False) as s:
            for i, _ in enumerate(tk.patch(batches)):
                time.sleep(0.01 if run == "timed" or i == 0 else 0.002)
                if run == "logged":
                    s.log("i", float(i))
                if i == 2:
                    break
        got = scalars(tmp_path / run)
        assert _steps(got, "trainkit/step_time_ms") == [1, 2, 3], run
        _check_rates(got, 4, 0.002)


def test_a_body_left_after_its_work_counts_by_what_it_recorded_or_its_time(tmp_path):
    # The limit (README): left in a pass's first batch, a body counts only if it recorded
    # something, as its time cannot be told from a break at the top (no earlier body to compare).
    batches = [torch.zeros(4, 2)] * 3
    for run, steps in (("region", [1]), ("nothing", [])):
        with tk.session(logdir=tmp_path / run, system_metrics=False):
            for _ in tk.patch(batches):
                if run == "region":
                    with tk.profile_region("work"):
                        time.sleep(0.01)
                else:
                    time.sleep(0.01)
                break
        got = scalars(tmp_path / run)
        assert _steps(got, "trainkit/step_time_ms") == steps, run
        assert _steps(got, "trainkit/data_wait_ms") == [1], run


def test_a_batch_left_untrained_by_a_break_or_a_zip_brings_no_items_to_the_next_step(tmp_path):
    # A break at the top of the loop (steps per epoch capped), and the unpaired batch of
    # zip(long, short): the loader handed out a batch that no step trained on. Its items left
    # in the step in progress made the next epoch's first step count two batches (samples/s
    # doubled at every epoch boundary); its wait stays there, inside that step's wall time.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    data = list(loader(n=80, batch_size=8))
    with tk.session(logdir=tmp_path / "break", system_metrics=False):
        batches = tk.patch(data)
        for epoch in range(3):
            for i, (x, y) in enumerate(batches):
                if i == 3:
                    break
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    with tk.session(logdir=tmp_path / "zip", system_metrics=False):
        for epoch in range(2):
            for (x, y), _ in zip(tk.patch(data[:3]), tk.patch([None] * 2)):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    for run, steps in (("break", 9), ("zip", 4)):
        got = scalars(tmp_path / run)
        step_ms = got["trainkit/step_time_ms"]
        assert [st for st, _ in step_ms] == list(range(1, steps + 1)), run
        for (st, sps), (_, ms) in zip(got["trainkit/samples_per_s"], step_ms):
            assert sps == pytest.approx(8 / (ms / 1e3), rel=1e-4), (run, st)
        # the last untrained batch's wait: a step of its own, with no items (nothing follows)
        assert [st for st, _ in got["trainkit/data_wait_ms"]][-1] == steps + 1, run
        assert len(got["trainkit/samples_per_s"]) == steps, run


@pytest.mark.parametrize("how", ["accumulate", "by hand"])
@pytest.mark.parametrize("left_at", [4, 5, 6])
def test_a_batch_trained_on_before_a_break_keeps_its_items_in_the_window_stepped_after(
        tmp_path, how, left_at):
    # A loop capped mid-window (max_steps, a time budget): the batch it was left at had its
    # forward and backward, and the step after the loop (accumulate's partial last window, or
    # the user's) trains on it. Its items were taken out as if no body had run for it: step 2
    # counted 5, 10, 15 items for 10, 15, 20 (a window of one batch: no samples_per_s at all).
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    data = [(x[:5], y[:5]) for x, y in loader(n=160, batch_size=8)]
    with tk.session(logdir=tmp_path, system_metrics=False):
        if how == "accumulate":
            with tk.accumulate(4, opt):
                for i, (x, y) in enumerate(tk.patch(data)):
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    time.sleep(0.02 if i == left_at else 0.002)  # the margin, as below
                    opt.step()
                    opt.zero_grad()
                    if i == left_at:
                        break
        else:
            for i, (x, y) in enumerate(tk.patch(data)):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                # The body left records nothing: it tells from the time it took (over half the
                # quickest earlier one's), with a margin a loaded machine keeps (a CI run, 2
                # cores shared, once had the earlier ones over twice the 2 ms of the last).
                time.sleep(0.02 if i == left_at else 0.002)
                if (i + 1) % 4 == 0:
                    opt.step()
                    opt.zero_grad()
                if i == left_at:
                    break
            opt.step()  # the partial last window
            opt.zero_grad()
    got = scalars(tmp_path)
    steps = dict(got["trainkit/step_time_ms"])
    items = {st: round(sps * steps[st] / 1e3, 3) for st, sps in got["trainkit/samples_per_s"]}
    assert items == {1: 20.0, 2: 5.0 * (left_at - 3)}
