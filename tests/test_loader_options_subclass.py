"""The ``num_workers`` override (the ablation's) on a DataLoader subclass: it stays that subclass."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import trainkit as tk
from trainkit import switches


class _WhereLoaded(Dataset):
    """Each sample says which worker loaded it (-1: the main process)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        info = get_worker_info()
        return torch.tensor(float(i)), torch.tensor(-1 if info is None else info.id)


class _Scaled(DataLoader):
    """A subclass with its own ``__iter__`` (a user's preprocessing in the loader)."""

    def __iter__(self):
        for x, where in super().__iter__():
            yield x * 100, where


def test_a_num_workers_override_keeps_a_dataloader_subclass_and_its_iter():
    # It was rebuilt as a plain DataLoader: the subclass's __iter__ was gone (x, not x * 100),
    # and the ablation compared another pipeline than the user's.
    loader = _Scaled(_WhereLoaded(), batch_size=3)
    with switches.overrides({"num_workers": 1}):
        patched = tk.patch(loader)
    assert type(patched.source) is _Scaled and patched.num_workers == 1
    assert patched.prefetch_factor == 2 and patched.sampler is loader.sampler
    got = list(patched)
    assert [b[0].tolist() for b in got] == [[0.0, 100.0, 200.0], [300.0, 400.0, 500.0]]
    assert all(b[1].tolist() == [0, 0, 0] for b in got)  # loaded by worker 0
    assert loader.num_workers == 0 and tk.unpatch(patched) is loader  # the user's, unchanged


def test_a_no_workers_override_on_a_subclass_with_persistent_workers():
    loader = _Scaled(_WhereLoaded(), batch_size=3, num_workers=1, persistent_workers=True)
    with switches.overrides({"num_workers": 0}):
        patched = tk.patch(loader)
    assert type(patched.source) is _Scaled
    assert (patched.num_workers, patched.persistent_workers, patched.prefetch_factor) == (0, False, None)
    for _ in range(2):
        got = list(patched)
        assert [b[0].tolist() for b in got] == [[0.0, 100.0, 200.0], [300.0, 400.0, 500.0]]
        assert all(b[1].tolist() == [-1, -1, -1] for b in got)  # in the main process
    assert (loader.num_workers, loader.persistent_workers) == (1, True)
