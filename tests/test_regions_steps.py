"""Which step a region's time and a logged value go under: a region wrapping the optimizer's step
under the step it timed, one begun after it under the step in progress, one inside the dataset under
the step its batch feeds; with several steps per batch, a plain loader's loop after a patched one,
and an evaluation longer than flush_secs after each epoch (no second event for a step)."""
from __future__ import annotations

import collections
import time

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import SlowSGD, loader, mlp, train


@pytest.mark.parametrize("profiling", [False, True], ids=["fast-region", "full-region"])
def test_a_region_wrapping_the_step_goes_under_the_step_it_timed(tmp_path, profiling):
    # No patched loader: the step ends inside the region, which belongs to that step (not to the
    # next one). Under a profiler a region takes its full path (record_function), same filing.
    model = mlp()
    opt = tk.patch(SlowSGD(model.parameters(), lr=0.1))
    batches = list(loader(n=40, batch_size=8))
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiling else None
    with tk.session(logdir=tmp_path, system_metrics=False):
        if prof is not None:
            prof.__enter__()
        try:
            for x, y in batches:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                with tk.profile_region("update"):
                    opt.step()
                with tk.profile_region("after"):  # after the step: the step in progress
                    opt.zero_grad()
        finally:
            if prof is not None:
                prof.__exit__(None, None, None)
    got = scalars(tmp_path)
    steps = [st for st, _ in got["trainkit/update_ms"]]
    assert steps == [1, 2, 3, 4, 5]
    assert [st for st, _ in got["trainkit/region/update_ms"]] == steps
    for (_, region), (_, update) in zip(got["trainkit/region/update_ms"], got["trainkit/update_ms"]):
        assert region >= update >= 4.0  # each step's own update, inside its own region
    assert [st for st, _ in got["trainkit/region/after_ms"]] == [2, 3, 4, 5, 6]


def test_regions_by_time_and_values_by_the_batch_while_its_loop_goes_on(tmp_path):
    model = mlp()
    opt = tk.patch(SlowSGD(model.parameters(), lr=0.1))
    batches = list(loader(n=40, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        with tk.profile_region("epoch"):
            for i, (x, y) in enumerate(tk.patch(batches)):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                with tk.profile_region("update"):
                    opt.step()
                with tk.profile_region("after"):  # begins after the step: the step in progress
                    opt.zero_grad()
                    time.sleep(0.002)
                s.log("i", float(i))  # the batch's step
        s.log("val", 0.5)  # after the loop: the step in progress
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/update_ms"]] == [1, 2, 3, 4, 5]
    assert got["i"] == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0), (5, 4.0)]
    assert [st for st, _ in got["trainkit/region/update_ms"]] == [1, 2, 3, 4, 5]
    assert [st for st, _ in got["trainkit/region/after_ms"]] == [2, 3, 4, 5, 6]
    assert got["val"] == [(6, 0.5)]
    (epoch_step, epoch_ms), = got["trainkit/region/epoch_ms"]  # under its last step
    assert epoch_step == 5 and epoch_ms >= 5 * (4.0 + 2.0)


def test_a_plain_loader_loop_after_a_patched_one_goes_by_the_steps(tmp_path):
    # The batch a patched loader handed out last does not hold the values of a later loop over a
    # plain loader (a second training phase): they go under the steps, as with no patched loader.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=48, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        train(model, opt, tk.patch(batches[:3]), log=s.log)
        for i, (x, y) in enumerate(batches[3:]):
            s.log("before", float(i))  # before the step: the step in progress
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            s.log("phase2", float(i))  # after the step: the step in progress, as without a loader
            with tk.profile_region("after"):
                pass
    got = scalars(tmp_path)
    assert [st for st, _ in got["loss"]] == [1, 2, 3]
    assert got["before"] == [(4, 0.0), (5, 1.0), (6, 2.0)]
    assert got["phase2"] == [(5, 0.0), (6, 1.0), (7, 2.0)]
    assert [st for st, _ in got["trainkit/region/after_ms"]] == [5, 6, 7]


class _TimedDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int):
        with tk.profile_region("load"):
            time.sleep(0.003)
            return torch.full((4,), float(i)), i % 2


def test_a_region_inside_the_dataset_goes_under_the_step_its_batch_feeds(tmp_path):
    model = torch.nn.Linear(4, 2)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x, y in tk.patch(torch.utils.data.DataLoader(_TimedDataset(), batch_size=1)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3, 4, 5]
    assert [st for st, _ in got["trainkit/region/load_ms"]] == [1, 2, 3, 4, 5]
    assert all(3.0 <= ms <= wait for (_, ms), (_, wait) in
               zip(got["trainkit/region/load_ms"], got["trainkit/data_wait_ms"]))


def test_several_steps_per_batch_each_get_their_regions(tmp_path):
    # Truncated BPTT: a batch stepped once per chunk. A chunk's region goes under its own step;
    # the loss logged after the batch's chunks goes under the batch's step (its first).
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=24, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for i, (x, y) in enumerate(tk.patch(batches)):
            for chunk in range(3):
                with tk.profile_region("chunk"):
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                opt.zero_grad()
            s.log("batch", float(i))
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/update_ms"]] == list(range(1, 10))
    assert [st for st, _ in got["trainkit/region/chunk_ms"]] == list(range(1, 10))
    assert got["batch"] == [(1, 0.0), (4, 1.0), (7, 2.0)]


def test_an_evaluation_after_each_epoch_longer_than_flush_secs_makes_no_second_event(tmp_path):
    # The writer writes the last completed step once steps stall (an evaluation): what the
    # evaluation records goes under the step in progress, which is not written yet.
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=24, batch_size=8))

    @tk.profile_region("forward")
    def forward(x):
        return model(x)

    with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=0.05) as s:
        for epoch in range(2):
            for x, y in tk.patch(batches):
                torch.nn.functional.cross_entropy(forward(x), y).backward()
                opt.step()
                opt.zero_grad()
            with torch.no_grad(), tk.profile_region("eval"):
                for x, _ in batches:
                    forward(x)
                time.sleep(0.4)  # several writer wakes: the last training step is written
            s.log("val", float(epoch))
    events = collections.Counter()  # (tag, step) -> events holding it, read from the file itself
    for path in tmp_path.glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(path)).Load():
            for v in event.summary.value:
                events[(v.tag, event.step)] += 1
    assert max(events.values()) == 1, [k for k, n in events.items() if n > 1]
    got = scalars(tmp_path)
    assert got["val"] == [(4, 0.0), (7, 1.0)]
    assert [st for st, _ in got["trainkit/region/eval_ms"]] == [4, 7]
    assert [st for st, _ in got["trainkit/region/forward_ms"]] == [1, 2, 3, 4, 5, 6, 7]
