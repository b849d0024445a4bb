"""A patched loader is its source's class to ``isinstance`` (``__class__`` is the source's, as a
``wrapt.ObjectProxy``'s is), so code such as ``if isinstance(loader, DataLoader):
loader.sampler.set_epoch(epoch)`` runs on it as on the loader; ``type()`` still gives the wrapper,
and pickling, copying, ``tk.patch``/``tk.unpatch``, ``len()`` and what trainkit looks up in a
loader stay as they were."""
from __future__ import annotations

import collections.abc
import copy
import json
import pickle
import time

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainkit as tk
from trainkit._loaderinfo import META_LOADER
from trainkit.loader import PatchedLoader, SizedPatchedLoader
from trainkit.profiling.runs import load_run
from tests.conftest import scalars
from tests.helpers import items_per_step, loader


def _sources():
    return {"DataLoader": loader(n=16, batch_size=4), "list": [torch.zeros(2, 3)] * 3,
            "generator": (torch.zeros(2, 3) for _ in range(3)), "iterator": iter([1, 2, 3])}


@pytest.mark.parametrize("kind", ["DataLoader", "list", "generator", "iterator"])
def test_a_patched_loader_is_an_instance_of_its_sources_class(kind):
    src = _sources()[kind]
    p = tk.patch(src)
    assert isinstance(p, type(src)) and p.__class__ is type(src)
    assert type(p) is not type(src) and isinstance(p, PatchedLoader)  # the wrapper still
    assert tk.patch(p) is p and tk.unpatch(p) is src
    assert repr(p) == f"trainkit.patch({src!r})"
    # one of another class is not (the wrapper's own classes answer by its type)
    assert not isinstance(p, dict) and isinstance(p, SizedPatchedLoader) == hasattr(src, "__len__")
    assert isinstance(p, collections.abc.Sized) == hasattr(src, "__len__")
    assert isinstance(p, collections.abc.Iterator) == hasattr(type(src), "__next__")


def test_a_patched_list_is_a_list_whose_methods_act_on_the_source():
    batches = [torch.zeros(2, 3)]
    p = tk.patch(batches)
    assert isinstance(p, list) and isinstance(p, collections.abc.Sequence)
    p.append(torch.zeros(5, 3))  # forwarded: the source is the list
    assert len(p) == 2 and p.source is batches and len(batches) == 2 and p[1] is batches[1]
    assert list(p) == batches


def test_user_code_that_asks_isinstance_dataloader_sets_the_samplers_epoch(tmp_path):
    # `if isinstance(loader, DataLoader): loader.sampler.set_epoch(epoch)` skipped it: every
    # epoch shuffled as the first.
    ds = TensorDataset(torch.arange(32.0).unsqueeze(1))
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=3)
    plain = DataLoader(ds, batch_size=8, sampler=sampler)
    orders = []
    with tk.session(logdir=tmp_path, system_metrics=False):
        p = tk.patch(plain)
        for epoch in range(3):
            if isinstance(p, DataLoader):
                p.sampler.set_epoch(epoch)
            orders.append(torch.cat([x for x, in p]).flatten().tolist())
    assert sampler.epoch == 2 and len({tuple(o) for o in orders}) == 3
    for epoch, order in enumerate(orders):  # as the unpatched loader gives each epoch
        sampler.set_epoch(epoch)
        assert order == torch.cat([x for x, in plain]).flatten().tolist()
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/loader/0/passes"]] == [1, 5, 9]  # recorded as before


@pytest.mark.parametrize("kind", ["DataLoader", "list", "iterator"])
@pytest.mark.parametrize("how", ["pickle0", "pickle1", "pickle2", "pickle5", "deepcopy", "copy"])
def test_a_patched_loader_pickles_and_copies_to_a_patched_loader(kind, how):
    # pickle refused a __class__ other than type(obj) ("args[0] from __newobj__ args has the
    # wrong class"), and protocols 0 and 1 rebuilt an object of the source's class
    src = _sources()[kind]
    p = tk.patch(src)
    if kind == "iterator":
        assert next(p) == 1  # a pass next() began: the copy begins its own
    if how.startswith("pickle"):
        q = pickle.loads(pickle.dumps(p, protocol=int(how[-1])))
    else:
        q = getattr(copy, how)(p)
    assert type(q) is type(p) and isinstance(q, type(src)) and q.source is not src
    assert q.original is q.source and tk.unpatch(q) is q.source
    if kind == "DataLoader":
        assert len(q) == 4 and [len(x) for x, _ in q] == [4] * 4
    elif kind == "list":
        assert len(q) == 3 and all(torch.equal(a, b) for a, b in zip(q, src))
    else:
        assert list(q) == [2, 3]


def test_a_patched_loader_inside_a_wrapper_records_its_dataloader_once(tmp_path):
    # tqdm-like: a wrapper with the loader in .iterable, patched too. The inner patched loader
    # records its DataLoader; the outer one, looking into the wrapper, stops at a patched loader
    # (a DataLoader to isinstance): it was taken for a second DataLoader, of the wrapper's type.
    class Bar:
        def __init__(self, iterable):
            self.iterable = iterable

        def __iter__(self):
            return iter(self.iterable)

    dl = loader(n=16, batch_size=4)
    with tk.session(logdir=tmp_path, system_metrics=False):
        for epoch in range(2):
            for x, y in tk.patch(Bar(tk.patch(dl))):
                time.sleep(0.002)
    run = load_run(str(tmp_path), str(tmp_path))
    assert [t for t in run.meta if t.startswith(META_LOADER)] == [META_LOADER + "0"]
    info = json.loads(run.meta[META_LOADER + "0"])
    assert info["type"] == "DataLoader" and info["batch_size"] == 4
    assert sorted(scalars(tmp_path)["trainkit/loader/0/passes"]) == [(1, 1.0), (5, 2.0)]


def test_to_device_refuses_a_patched_loader_and_items_count_as_before(tmp_path):
    p = tk.patch(loader(n=16, batch_size=4))
    with pytest.raises(TypeError, match="a loader, not a batch"):
        tk.to_device(p, "cpu")
    assert items_per_step(tmp_path, p) == {1: 4, 2: 4, 3: 4, 4: 4}
