"""TA101 where its earlier advice misled: an in-memory TensorDataset without workers (told
num_workers=1, which made the probe's CPU loop 3.5x slower), and a DataLoader made anew each
epoch (the same wrong fix said once per loader, worker start-up not named)."""
from __future__ import annotations

import json
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainkit as tk
from trainkit._loaderinfo import META_LOADER, PASSES
from trainkit.recorder import PREFIX
from trainkit.sinks.tensorboard import EventFileWriter


def _ta101(logdir):
    return [f for f in tk.analyze(logdir) if f.code == "TA101"]


def _sleepy_start(_worker_id):  # a worker's start-up made visible (module level: picklable)
    time.sleep(0.1)


class Samples(torch.utils.data.Dataset):
    """A map-style dataset of its own (not in memory as far as trainkit can tell: it could read
    files); module level: picklable for workers."""

    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 16), torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def _loop(logdir, make_loader, *, epochs):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with tk.session(logdir=logdir, system_metrics=False):
        tk.patch(opt)
        for _ in range(epochs):
            for x, y in tk.patch(make_loader()):
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()


NO_WORKERS = {"type": "DataLoader", "num_workers": 0, "persistent_workers": False,
              "pin_memory": False, "prefetch_factor": None, "batch_size": 32,
              "cuda_available": False, "role": "train"}


def _run_with_waits(logdir, wait_ms, step_ms):
    """A run as a session writes it: one loader without workers, each step ``step_ms`` of which
    ``wait_ms`` waits for the batch (the probe's in-memory TensorDataset: 0.38 of 1.13 ms)."""
    w = EventFileWriter(logdir)
    w.write_text(META_LOADER + "0", json.dumps(NO_WORKERS), step=1)
    for step in range(1, 60):
        values = {PREFIX + "step_time_ms": step_ms, PREFIX + "data_wait_ms": wait_ms}
        if step == 1:
            values[PASSES.format(0)] = 1.0
        w.write_scalars(step=step, values=values)
    w.close()


def test_batches_loaded_in_well_under_a_millisecond_get_no_workers(logdir):
    _run_with_waits(logdir, 0.38, 1.13)
    (f,) = _ta101(logdir)
    assert "num_workers=" not in f.fix.replace("num_workers=0", ""), f.fix
    assert "keep num_workers=0" in f.fix and "0.38 ms" in f.fix
    assert "BatchSampler" in f.fix and "batch_size=None" in f.fix  # what does help
    assert "trains on the CPU" in f.fix  # cuda_available: false: workers would take its cores


def test_slow_batches_without_workers_still_get_workers(logdir):
    _run_with_waits(logdir, 8.0, 12.0)
    (f,) = _ta101(logdir)
    assert "persistent_workers=True): with num_workers=0" in f.fix, f.fix
    assert "BatchSampler" not in f.fix


def test_an_in_memory_tensor_dataset_is_not_told_to_use_workers(logdir):
    ds = TensorDataset(torch.randn(32 * 60, 16), torch.randn(32 * 60, 1))
    _loop(logdir, lambda: DataLoader(ds, batch_size=32), epochs=1)
    for f in _ta101(logdir):  # whether TA101 fires depends on this machine's speed
        assert "num_workers=" not in f.fix.replace("num_workers=0", ""), f.fix


def test_a_new_dataloader_each_epoch_is_one_loader_with_worker_start_up_said_once(logdir):
    ds = Samples(8)
    _loop(logdir, lambda: DataLoader(ds, batch_size=2, num_workers=2,
                                     worker_init_fn=_sleepy_start), epochs=3)
    (f,) = _ta101(logdir)
    assert f.fix.count("persistent_workers=True") == 1, f.fix
    assert "create the DataLoader once" in f.fix, f.fix
    assert "loader 1" not in f.fix and "loader 2" not in f.fix  # said once, for the three
    assert "a new DataLoader for each of its 3 passes" in f.evidence, f.evidence
    assert f.evidence.count("the steps were fed by") == 1, f.evidence
    per_epoch = float(f.fix.split("saving ~")[1].split(" ms")[0])
    assert 70 <= per_epoch <= 2000, f.fix  # each start sleeps 0.1 s in the workers


def test_a_new_persistent_dataloader_each_epoch_is_told_to_be_made_once(logdir):
    ds = Samples(8)
    _loop(logdir, lambda: DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True,
                                     worker_init_fn=_sleepy_start), epochs=3)
    (f,) = _ta101(logdir)
    assert "create the DataLoader once" in f.fix, f.fix


def test_workers_over_an_in_memory_dataset_are_told_to_go(logdir):
    # A TensorDataset made a new DataLoader with 2 workers each epoch (the probe's loop): the
    # fix said both "create the DataLoader once, persistent_workers=True" and "make the
    # per-sample work cheaper (__getitem__, transforms)", where the data is in memory and the
    # workers only hand its batches over: no workers, one indexing a batch.
    ds = TensorDataset(torch.randn(8, 16), torch.randn(8, 1))
    _loop(logdir, lambda: DataLoader(ds, batch_size=2, num_workers=2,
                                     worker_init_fn=_sleepy_start), epochs=3)
    (f,) = _ta101(logdir)
    assert f.fix.startswith("num_workers=0 and load each batch with one indexing"), f.fix
    assert "in memory (TensorDataset)" in f.fix and "its 2 workers" in f.fix
    assert "per-sample work cheaper" not in f.fix and "persistent_workers" not in f.fix
    assert "a new DataLoader for each of its 3 passes" in f.evidence  # the evidence stays


def test_the_settings_say_whether_the_dataset_is_in_memory(logdir):
    from torch.utils.data import Subset, random_split

    from trainkit._loaderinfo import settings

    ds = TensorDataset(torch.randn(8, 16), torch.randn(8, 1))
    part, _ = random_split(ds, [6, 2])
    for data, kind, in_memory in [(ds, "TensorDataset", True), (part, "Subset", True),
                                  (Subset(part, [0, 1]), "Subset", True),
                                  (Samples(8), "Samples", False)]:
        got = settings(DataLoader(data, batch_size=2), role="train")
        assert (got["dataset"], got["in_memory"]) == (kind, in_memory)


def test_slow_batches_of_an_in_memory_dataset_without_workers_get_one_indexing(logdir):
    w = EventFileWriter(logdir)
    w.write_text(META_LOADER + "0", json.dumps(dict(NO_WORKERS, dataset="TensorDataset",
                                                    in_memory=True)), step=1)
    for step in range(1, 60):
        values = {PREFIX + "step_time_ms": 12.0, PREFIX + "data_wait_ms": 8.0}
        if step == 1:
            values[PASSES.format(0)] = 1.0
        w.write_scalars(step=step, values=values)
    w.close()
    (f,) = _ta101(logdir)
    assert f.fix.startswith("load each batch with one indexing"), f.fix
    assert "num_workers=" not in f.fix and "8.00 ms" in f.fix
