"""TA101's advice fitted to the DataLoader that fed the steps: its settings are recorded once per
session (``trainkit/meta/loader/<i>``) and each pass's start (``trainkit/loader/<i>/passes``)."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainkit as tk
from trainkit._loaderinfo import META_LOADER, PASSES, find_dataloader
from trainkit.loader import PatchedLoader
from trainkit.profiling.analyzers import loaders as advice
from trainkit.profiling.runs import load_run
from trainkit.recorder import PREFIX
from trainkit.sinks.tensorboard import EventFileWriter

from .conftest import SleepyDataset


def _ta101(logdir):
    (f,) = [f for f in tk.analyze(logdir) if f.code == "TA101"]
    return f


def _sleepy_start(_worker_id):  # a worker's start-up made visible (module level: picklable)
    time.sleep(0.2)


def _train(logdir, loaders, *, epochs, patch_each_epoch=False, evaluate=None):
    """A tiny regression loop over each epoch's pass; ``evaluate`` a loader iterated under
    no_grad after each epoch."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.01))
    patched = tk.patch(loaders)
    with tk.session(logdir=logdir, system_metrics=False):
        for _ in range(epochs):
            for x, y in (tk.patch(loaders) if patch_each_epoch else patched):
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
            if evaluate is not None:
                with torch.no_grad():
                    for x, _y in tk.patch(evaluate):
                        model(x)


def _meta(logdir):
    run = load_run(logdir, logdir)
    return {int(t[len(META_LOADER):]): json.loads(v) for t, v in run.meta.items()
            if t.startswith(META_LOADER)}, run


def test_no_workers_gets_num_workers_from_the_cpu_count(logdir):
    loader = DataLoader(SleepyDataset(14, 0.004), batch_size=2)
    _train(logdir, loader, epochs=1)
    meta, _ = _meta(logdir)
    assert meta == {0: {"type": "DataLoader", "role": "train", "num_workers": 0,
                        "persistent_workers": False, "pin_memory": False,
                        "prefetch_factor": None, "batch_size": 2,
                        "cuda_available": torch.cuda.is_available(),
                        "dataset": "SleepyDataset", "in_memory": False}}
    f = _ta101(logdir)
    n = max(1, min(8, (os.cpu_count() or 1) - 1))
    assert f"DataLoader(..., num_workers={n}, persistent_workers=True)" in f.fix, f.fix
    assert f"os.cpu_count()={os.cpu_count()}" in f.fix and "guess" not in f.fix
    assert "loader 0 (DataLoader: num_workers=0, pin_memory=False, batch_size=2)" in f.evidence
    assert "% of step time" in f.evidence and "ms a step" in f.fix  # the numbers it saw
    assert "pin_memory=True" not in f.fix  # a CPU run: nothing copied to a GPU


def test_workers_started_each_epoch_get_persistent_workers_with_the_cost(logdir):
    ds = SleepyDataset(8, 0.0)  # no TensorDataset: workers over one are told to go
    loader = DataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=_sleepy_start)
    _train(logdir, loader, epochs=3, patch_each_epoch=True)
    meta, run = _meta(logdir)
    assert list(meta) == [0]  # patched again each epoch: still one loader, recorded once
    assert meta[0]["num_workers"] == 2 and meta[0]["persistent_workers"] is False
    assert meta[0]["prefetch_factor"] == 2
    assert sorted(run.values(PASSES.format(0)).items()) == [(1, 1.0), (5, 2.0), (9, 3.0)]
    f = _ta101(logdir)
    assert f.fix.startswith("DataLoader(..., persistent_workers=True): the workers then start "
                            "once, saving ~"), f.fix
    per_epoch = float(f.fix.split("saving ~")[1].split(" ms")[0])
    assert 150 <= per_epoch <= 2000, f.fix  # each start sleeps 0.2 s in the workers
    assert "over the 2 later pass(es) here" in f.fix
    assert "measured on 3 of its 3 passes" in f.evidence and "workers start again" in f.evidence


def test_persistent_workers_are_not_told_to_persist(logdir):
    ds = SleepyDataset(8, 0.0)
    loader = DataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=_sleepy_start,
                        persistent_workers=True)
    _train(logdir, loader, epochs=3)
    meta, _ = _meta(logdir)
    assert meta[0]["persistent_workers"] is True
    found = [f for f in tk.analyze(logdir) if f.code == "TA101"]
    assert all("persistent_workers=True" not in f.fix for f in found), found


@pytest.mark.parametrize("cores, says", [
    (64, "DataLoader(..., num_workers="),
    (2, "make the per-sample work cheaper"),
])
def test_workers_that_cannot_keep_up_get_more_workers_or_cheaper_samples(
        logdir, monkeypatch, cores, says):
    # 2 workers, 10 ms an item, 2 items a batch: a batch every ~10 ms against a step of ~1 ms
    loader = DataLoader(SleepyDataset(24, 0.01), batch_size=2, num_workers=2,
                        persistent_workers=True)
    _train(logdir, loader, epochs=1)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    f = _ta101(logdir)
    assert f.fix.startswith(says), f.fix
    assert "each of the 2 workers takes ~" in f.fix and "ms a sample" in f.fix
    if cores == 64:
        need = int(f.fix.split("num_workers=")[1].split(")")[0])
        assert 2 < need <= 64 and f"keeping up with the step takes ~{need} workers" in f.fix
    else:
        assert "more than the 2 cores here" in f.fix


def test_an_evaluation_loader_is_kept_apart_from_the_training_one(logdir):
    train = DataLoader(SleepyDataset(8, 0.004), batch_size=2)
    val = DataLoader(TensorDataset(torch.randn(6, 16), torch.randn(6, 1)), batch_size=3,
                     num_workers=1)
    _train(logdir, train, epochs=2, evaluate=val)
    meta, run = _meta(logdir)
    assert meta[0]["role"] == "train" and meta[0]["num_workers"] == 0
    assert meta[1]["role"] == "eval" and meta[1]["num_workers"] == 1
    assert sorted(run.values(PASSES.format(1))) == [5, 9]  # after each epoch's 4 steps
    f = _ta101(logdir)
    assert "fed by loader 0 (" in f.evidence and "loader 1" not in f.evidence
    assert "num_workers=0 each batch is loaded in the training process" in f.fix


def test_a_plain_iterable_records_nothing_and_gets_the_guess(logdir):
    def batches():
        for _ in range(10):
            time.sleep(0.004)
            yield torch.randn(2, 16), torch.randn(2, 1)

    class Batches:
        def __iter__(self):
            return batches()

    source = Batches()
    patched = tk.patch(source)
    _train(logdir, source, epochs=2)
    run = load_run(logdir, logdir)
    assert not [t for t in run.meta if t.startswith(META_LOADER)] and not [t for t in run.scalars if t.startswith(PREFIX + "loader/")]
    assert len(run.values(PREFIX + "step_time_ms")) == 20  # a step a batch, as before
    f = _ta101(logdir)
    assert f.fix == advice.GUESS_FIX and "so this is a guess" in f.fix
    list(patched)
    assert "_dataloader" not in patched.__dict__  # no session: nothing looked up or recorded


def test_an_old_run_without_settings_still_analyzes(logdir):
    w = EventFileWriter(logdir)  # what trainkit wrote before it recorded loader settings
    for step in range(1, 13):
        w.write_scalars(step=step, values={PREFIX + "step_time_ms": 10.0,
                                           PREFIX + "data_wait_ms": 6.0})
    w.close()
    f = _ta101(logdir)
    assert f.fix == advice.GUESS_FIX and "num_workers=4" in f.fix and "60%" in f.evidence


def _synthetic(logdir, settings, waits, *, h2d=None, pinned=None):
    """A run as a session writes it, with the given settings and data waits (10 ms steps)."""
    w = EventFileWriter(logdir)
    w.write_text(META_LOADER + "0", json.dumps(dict(settings, role="train")), step=1)
    for step, wait in enumerate(waits, 1):
        values = {PREFIX + "step_time_ms": 10.0 + wait, PREFIX + "data_wait_ms": wait}
        if step == 1:
            values[PASSES.format(0)] = 1.0
        if h2d is not None:
            values[PREFIX + "h2d_ms"] = h2d
            values[PREFIX + "h2d_pinned_pct"] = pinned
        w.write_scalars(step=step, values=values)
    w.close()


WORKERS = {"type": "DataLoader", "num_workers": 4, "persistent_workers": True,
           "pin_memory": False, "prefetch_factor": 2, "batch_size": 32, "cuda_available": True}


def test_bursty_waits_get_a_deeper_prefetch(logdir):
    # Slow batches in bursts: rounds of the 4 workers that barely wait, then a run of long waits.
    # (One long wait in every 4 steps is no burst: 4 workers in step that fall short wait so.)
    _synthetic(logdir, WORKERS, [0.1] * 3 + ([0.1] * 12 + [40.0] * 4) * 2)
    f = _ta101(logdir)
    assert f.fix.startswith("DataLoader(..., prefetch_factor=4): most steps barely wait"), f.fix
    assert "(median 0.10 ms)" in f.fix and "now 2" in f.fix


def test_workers_in_step_that_fall_short_are_no_burst(logdir):
    # 4 workers handing out 4 batches together: one step in 4 waits for them all, the others
    # barely. The median step waits ~0 ms, yet every round of the workers waits 40 ms: a steady
    # shortfall (prefetching deeper would not help), which the per-step median read as a burst.
    _synthetic(logdir, WORKERS, [0.1] * 3 + [40.0, 0.1, 0.1, 0.1] * 8)
    f = _ta101(logdir)
    assert "prefetch_factor=4" not in f.fix, f.fix
    assert "each of the 4 workers takes ~" in f.fix, f.fix


def test_unpinned_batches_copied_to_a_gpu_get_pin_memory(logdir):
    _synthetic(logdir, WORKERS, [8.0] * 12, h2d=3.0, pinned=0.0)
    f = _ta101(logdir)
    assert "DataLoader(..., pin_memory=True): its batches are in pageable memory (0% of the " \
           "bytes tk.to_device copied were pinned)" in f.fix, f.fix
    assert "a median 3.00 ms a step" in f.fix


def test_pinned_batches_get_no_pin_memory_advice(tmp_path):
    _synthetic(str(tmp_path), dict(WORKERS, pin_memory=True), [8.0] * 12, h2d=3.0, pinned=100.0)
    assert "pin_memory=True" not in _ta101(str(tmp_path)).fix


class _Shard:
    """accelerate's DataLoaderShard as recent versions make it: the DataLoader it iterates in
    ``base_dataloader``, attributes forwarded to it, and its class the DataLoader's."""

    def __init__(self, dl):
        self.base_dataloader = dl

    def __getattr__(self, name):
        if name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    @property
    def __class__(self):
        return self.base_dataloader.__class__

    def __iter__(self):
        return iter(self.base_dataloader)


class _Bar:
    """tqdm's way: the iterable it wraps in ``iterable``."""

    def __init__(self, iterable):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)


def test_the_dataloader_inside_a_wrapper_is_found():
    dl = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    assert find_dataloader(dl) is dl
    assert find_dataloader(_Shard(dl)) is dl
    assert find_dataloader(_Bar(_Shard(dl))) is dl
    assert find_dataloader([1, 2]) is None and find_dataloader(iter([1])) is None
    assert find_dataloader(_Bar(_Bar(_Bar(_Bar(_Bar(_Bar(dl))))))) is None  # too deep


def test_a_wrapped_loader_records_the_inner_settings(logdir):
    dl = DataLoader(SleepyDataset(10, 0.004), batch_size=2, pin_memory=False)
    _train(logdir, _Bar(_Shard(dl)), epochs=1)
    meta, _ = _meta(logdir)
    assert meta[0]["num_workers"] == 0 and meta[0]["batch_size"] == 2


def test_settings_are_recorded_once_a_pass_not_per_batch(logdir, monkeypatch):
    from trainkit import _loaderinfo

    calls = []
    real = _loaderinfo.settings
    monkeypatch.setattr(_loaderinfo, "settings", lambda *a, **k: calls.append(1) or real(*a, **k))
    loader = DataLoader(TensorDataset(torch.randn(12, 16), torch.randn(12, 1)), batch_size=2)
    _train(logdir, loader, epochs=3)
    run = load_run(logdir, logdir)
    assert len(calls) == 1  # once a session
    assert sorted(run.values(PASSES.format(0)).items()) == [(1, 1.0), (7, 2.0), (13, 3.0)]
    assert isinstance(tk.patch(loader), PatchedLoader)


def test_the_session_keeps_no_patched_loader_alive(logdir):
    # Held by the session (which only the GC frees), a DataLoader's persistent workers were shut
    # down by the GC, which waits seconds for them; dropped by the user, it goes at once.
    import weakref

    loader = DataLoader(TensorDataset(torch.randn(4, 16), torch.randn(4, 1)), batch_size=2)
    _train(logdir, loader, epochs=2)
    gone = weakref.ref(loader)
    del loader
    assert gone() is None


def test_tensorboard_reads_the_settings_as_text_and_a_rerun_shows_its_own(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ds = TensorDataset(torch.randn(4, 16), torch.randn(4, 1))
    _train(logdir, DataLoader(ds, batch_size=2), epochs=1)
    _train(logdir, DataLoader(ds, batch_size=4, num_workers=1), epochs=1)  # a rerun, from step 1
    meta, run = _meta(logdir)
    assert len(run.sessions) == 2 and len(run.hidden) == 1
    assert meta[0]["batch_size"] == 4 and meta[0]["num_workers"] == 1  # the session shown's
    ea = EventAccumulator(logdir, size_guidance={"tensors": 0})
    ea.Reload()
    assert ea.SummaryMetadata(META_LOADER + "0").plugin_data.plugin_name == "text"
    (last,) = ea.Tensors(META_LOADER + "0")[-1:]
    assert json.loads(last.tensor_proto.string_val[0]) == meta[0]


def test_accelerates_prepared_loader_records_the_dataloader_inside(logdir):
    accelerate = pytest.importorskip("accelerate")
    acc = accelerate.Accelerator(cpu=True)
    dl = DataLoader(TensorDataset(torch.randn(8, 16), torch.randn(8, 1)), batch_size=2,
                    num_workers=1, persistent_workers=True)
    prepared = acc.prepare(dl)
    assert "base_dataloader" in vars(prepared)  # the layout find_dataloader looks into
    _train(logdir, prepared, epochs=2)
    meta, run = _meta(logdir)
    assert meta[0]["num_workers"] == 1 and meta[0]["persistent_workers"] is True
    assert meta[0]["batch_size"] == 2 and meta[0]["type"] == "DataLoader"
    assert sorted(run.values(PASSES.format(0))) == [1, 5]


def test_an_evaluation_run_is_advised_on_its_own_loader(logdir):
    # No optimizer steps: the batches are the steps, and the loader iterated under no_grad fed them
    model = torch.nn.Linear(16, 1)
    loader = DataLoader(SleepyDataset(12, 0.004), batch_size=2)
    with tk.session(logdir=logdir, system_metrics=False), torch.no_grad():
        for x, _y in tk.patch(loader):
            model(x)
    meta, _ = _meta(logdir)
    assert meta[0]["role"] == "eval"
    f = _ta101(logdir)
    assert "fed by loader 0 (DataLoader: num_workers=0" in f.evidence
    assert "num_workers=0 each batch is loaded in the training process" in f.fix


def test_the_settings_recorded_are_those_a_technique_override_put_in_force(logdir):
    loader = DataLoader(TensorDataset(torch.randn(4, 16), torch.randn(4, 1)), batch_size=2)
    with tk.switches.overrides({"num_workers": 1}):
        _train(logdir, loader, epochs=1)
    meta, _ = _meta(logdir)
    assert meta[0]["num_workers"] == 1 and meta[0]["prefetch_factor"] == 2


def test_two_passes_begun_in_one_step_show_the_count_not_its_mean(logdir):
    # A peek at one batch (next(iter(loader))) and the first epoch's pass both begin in step 1:
    # the count was averaged as a user's value is, 1.5 for 2 (pass 2 never showed).
    model = torch.nn.Linear(16, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.01))
    train = tk.patch(DataLoader(TensorDataset(torch.randn(12, 16), torch.randn(12, 1)),
                                batch_size=2))
    with tk.session(logdir=logdir, system_metrics=False):
        x0, _ = next(iter(train))
        assert x0.shape == (2, 16)
        for _ in range(2):
            for x, y in train:
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    run = load_run(logdir, logdir)
    assert sorted(run.values(PASSES.format(0)).items()) == [(1, 2.0), (7, 3.0)]
