"""Audit: the wait at a pass's end (the ``next()`` that raises StopIteration) is data wait.

A ``DataLoader`` with workers and no ``persistent_workers`` shuts its workers down in that last
``next()`` (tens of ms a pass, more with more workers); the step that holds it in its wall time
(the next pass's first) showed it nowhere in ``data_wait_ms``, only as an unexplained rest of its
``step_time_ms``. Real loops, read back from the event files.
"""
from __future__ import annotations

import time

import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import mlp

END = 0.2  # s: a pass's end, a DataLoader joining its workers (above a busy machine's jitter)


class _SlowEnd:
    """An iterable whose pass takes a while to end, as a DataLoader's shutting its workers down."""

    def __init__(self, batches) -> None:
        self.batches = batches

    def __iter__(self):
        yield from self.batches
        time.sleep(END)

    def __len__(self) -> int:
        return len(self.batches)


def _batches(n=3):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
            for _ in range(n)]


def _model_and_optimizer():
    model = mlp()
    return model, tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))


def _backward(model, x, y):
    torch.nn.functional.cross_entropy(model(x), y).backward()


def _times_and_waits(logdir):
    """``step -> ms`` of the run's step times and data waits, read back from its event files."""
    got = scalars(logdir)
    return dict(got["trainkit/step_time_ms"]), dict(got["trainkit/data_wait_ms"])


def test_the_end_of_a_pass_is_data_wait_of_the_step_that_holds_it(tmp_path):
    model, opt = _model_and_optimizer()
    train = tk.patch(_SlowEnd(_batches()))
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in range(2):
            for x, y in train:
                _backward(model, x, y)
                opt.step()
                opt.zero_grad()
    times, waits = _times_and_waits(tmp_path)
    assert sorted(times) == sorted(waits) == list(range(1, 7))  # no point after the last step
    assert times[4] >= END * 1e3  # the second epoch's first step holds the first pass's end...
    assert waits[4] >= END * 1e3  # ...which was a wait for the loader
    assert times[4] - waits[4] < END * 1e3 / 2
    assert all(waits[st] < END * 1e3 / 2 for st in (2, 3, 5, 6))


def test_the_end_of_a_pass_is_data_wait_where_batches_are_steps(tmp_path):
    # An evaluation over two passes: a step ends where the next wait begins, so the first pass's
    # end is in the wall time of the second pass's first step.
    model = mlp()
    data = tk.patch(_SlowEnd(_batches()))
    with tk.session(logdir=tmp_path, system_metrics=False), torch.no_grad():
        for _ in range(2):
            for x, _y in data:
                model(x)
    times, waits = _times_and_waits(tmp_path)
    assert sorted(times) == sorted(waits) == list(range(1, 7))
    assert times[4] >= END * 1e3 and waits[4] >= END * 1e3
    assert times[4] - waits[4] < END * 1e3 / 2


def test_a_pass_end_before_the_partial_window_tk_accumulate_steps_at_its_exit(tmp_path):
    # A per-epoch accumulate block: its exit steps the last, shorter window after the pass's
    # end, in that window's step, which no next pass begins in (the pass end was dropped).
    model, opt = _model_and_optimizer()
    train = tk.patch(_SlowEnd(_batches()))
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in range(2):
            with tk.accumulate(2, opt):
                for x, y in train:
                    _backward(model, x, y)
                    opt.step()
                    opt.zero_grad()
    times, waits = _times_and_waits(tmp_path)
    assert sorted(times) == sorted(waits) == [1, 2, 3, 4]
    for st in (2, 4):  # each epoch's partial window, stepped at the block's exit; the last too
        assert times[st] >= END * 1e3 and waits[st] >= END * 1e3
        assert times[st] - waits[st] < END * 1e3 / 2
    assert all(waits[st] < END * 1e3 / 2 for st in (1, 3))


def test_a_pass_end_before_a_partial_window_stepped_by_hand_after_the_loop(tmp_path):
    model, opt = _model_and_optimizer()
    train = tk.patch(_SlowEnd(_batches()))
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in range(2):
            i = -1
            for i, (x, y) in enumerate(train):
                _backward(model, x, y)
                if (i + 1) % 2 == 0:
                    opt.step()
                    opt.zero_grad()
            if (i + 1) % 2:  # the last, shorter window
                opt.step()
                opt.zero_grad()
    _, waits = _times_and_waits(tmp_path)
    assert sorted(waits) == [1, 2, 3, 4]
    assert waits[2] >= END * 1e3 and waits[4] >= END * 1e3
    assert waits[1] < END * 1e3 / 2 and waits[3] < END * 1e3 / 2


def test_the_end_of_a_validation_pass_inside_the_training_loop_is_that_steps_wait(tmp_path):
    model, opt = _model_and_optimizer()
    train = tk.patch(_batches(4))
    val = tk.patch(_SlowEnd(_batches(2)))
    with tk.session(logdir=tmp_path, system_metrics=False):
        for i, (x, y) in enumerate(train):
            _backward(model, x, y)
            opt.step()
            opt.zero_grad()
            if i == 1:  # step 2's validation, inside the loop's body, after its update
                with torch.no_grad():
                    for vx, _vy in val:
                        model(vx)
    times, waits = _times_and_waits(tmp_path)
    assert sorted(waits) == [1, 2, 3, 4]
    # after step 2's update: in step 3's wall time, as its validation batches' waits are
    assert times[3] >= END * 1e3 and waits[3] >= END * 1e3
    assert times[3] - waits[3] < END * 1e3 / 2
    assert all(waits[st] < END * 1e3 / 2 for st in (1, 2, 4))
