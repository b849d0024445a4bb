"""A patched loader's passes in a training loop: the wait that starts a pass (a DataLoader starts
its workers in ``iter()``) and an evaluation pass between epochs."""
from __future__ import annotations

import time

import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp


def _items(got):
    """Items per step, as TensorBoard's samples_per_s x step_time_ms give them back."""
    times = dict(got["trainkit/step_time_ms"])
    return [round(v * times[st] / 1e3, 2) for st, v in got["trainkit/samples_per_s"]]


def test_a_patched_validation_pass_between_epochs_adds_no_items_to_training_steps(tmp_path):
    # The evaluation runs under no_grad over its own patched loader while training goes on: its
    # images are not trained on, so they are no samples of the next training step (its wait and
    # time stay in that step, whose wall time holds them).
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    train, val = tk.patch(loader(n=24, batch_size=8)), tk.patch(loader(n=20, batch_size=5, seed=2))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for _ in range(2):
            for x, y in train:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
            with torch.no_grad():
                correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in val)
            s.log("val/acc", correct / 20)
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/step_time_ms"]] == list(range(1, 7))
    assert _items(got) == [8.0] * 6  # the first step after an evaluation had 8 + 20
    assert [st for st, _ in got["val/acc"]] == [4, 7]


class _SlowStart:
    """An iterable whose ``iter()`` takes a while, as a DataLoader's starting its workers does."""

    def __init__(self, batches, delay: float) -> None:
        self.batches, self.delay = batches, delay

    def __iter__(self):
        time.sleep(self.delay)
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def test_the_wait_for_a_pass_to_start_is_data_wait_of_its_first_step(tmp_path):
    # DataLoader(num_workers=2) without persistent_workers starts its workers in iter(), every
    # epoch: the loop waits for that before its first batch, and the step time holds it.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = tk.patch(_SlowStart(list(loader(n=16, batch_size=8)), 0.15))
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in range(2):
            for x, y in batches:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    got = scalars(tmp_path)
    wait, times = dict(got["trainkit/data_wait_ms"]), dict(got["trainkit/step_time_ms"])
    assert sorted(times) == [1, 2, 3, 4]
    for step in (1, 3):  # each pass's first step
        assert wait[step] >= 150, (step, wait)
        assert times[step] >= wait[step], (step, wait, times)
    assert wait[2] < 150 and wait[4] < 150
