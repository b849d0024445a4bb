"""Items of batches that hold no torch tensor, and of empty ones. A numpy batch (a ``collate_fn``
that returns numpy) counts the first dimension of its first array that has one; text a collate
left as strings counts its list of strings; both had no ``samples_per_s`` at all. An empty batch
(first tensor of size 0) counts 0 items: its step's samples/s is 0, not a point left out."""
from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import trainkit as tk
import trainkit._items as items_module
import trainkit._items_other as items_other
from trainkit import recorder
from trainkit._items import ItemsCounter
from trainkit.recorder import BATCH_REC, STEP_REC
from tests.conftest import scalars
from tests.helpers import items_per_step
from tests.test_speedups import needs_c, run_script

both_writers = pytest.mark.parametrize("use_c", [pytest.param(True, marks=needs_c), False],
                                       ids=["C", "Python"])


def _items(logdir) -> dict:
    got = scalars(logdir)
    steps = dict(got["trainkit/step_time_ms"])
    return {st: round(v * steps[st] / 1e3) for st, v in got.get("trainkit/samples_per_s", [])}


# ---- numpy ----------------------------------------------------------------------------------

def test_numpy_batches_count_the_first_dimension_of_their_first_array(tmp_path):
    batches = [np.zeros((5, 3)), (np.zeros((4, 3)), np.zeros(4)),
               {"x": np.zeros((6, 2)), "y": np.zeros(6)}, (np.float32(1.0), np.zeros((2, 2))),
               np.zeros((0, 3))]  # an empty one: 0, as an empty tensor
    assert items_per_step(tmp_path, batches) == {1: 5, 2: 4, 3: 6, 4: 2, 5: 0}


def test_a_0d_array_is_passed_over_and_a_tensor_anywhere_still_counts_first():
    count = ItemsCounter()
    assert count((np.array(3.0), np.zeros((7, 2)))) == 7
    assert ItemsCounter()((np.zeros((5, 2)), torch.zeros(3, 1))) == 3  # the tensor rule, as before
    assert ItemsCounter()((np.array(3.0),)) is None


def _numpy_collate(samples):
    xs, ys = zip(*samples)
    return np.stack(xs), np.array(ys)


def test_a_training_loop_over_a_loader_that_collates_numpy_counts_its_samples(tmp_path):
    ds = [(np.full(8, i, dtype=np.float32), i % 3) for i in range(10)]
    model = torch.nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        for x, y in tk.patch(DataLoader(ds, batch_size=4, collate_fn=_numpy_collate)):
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)),
                                                     torch.from_numpy(y))
            loss.backward()
            time.sleep(0.002)
            opt.step()
            opt.zero_grad()
    assert _items(tmp_path) == {1: 4, 2: 4, 3: 2}


# ---- strings --------------------------------------------------------------------------------

def test_text_batches_count_their_list_of_strings(tmp_path):
    batches = [["a b", "c d"], (["e", "f", "g"], [0, 1, 0]), {"text": ("h",), "label": [1]},
               [[], ["i", "j"]]]
    assert items_per_step(tmp_path, batches) == {1: 2, 2: 3, 3: 1, 4: 2}


def test_a_dataloader_over_strings_counts_its_texts(tmp_path):
    # default_collate leaves strings as they are: a list of them, or a dict holding one
    texts = [f"sentence {i}" for i in range(7)]
    assert items_per_step(tmp_path / "list", DataLoader(texts, batch_size=3)) == \
        {1: 3, 2: 3, 3: 1}
    records = [{"text": t, "n": 2} for t in texts]
    assert items_per_step(tmp_path / "dict", DataLoader(records, batch_size=3)) == \
        {1: 3, 2: 3, 3: 1}  # (its tensor, n, counts first: as before)


def test_a_string_alone_or_a_namedtuple_of_strings_is_no_count():
    import collections

    Pair = collections.namedtuple("Pair", "a b")
    assert ItemsCounter()("a whole batch") is None
    assert ItemsCounter()(Pair("x", "y")) is None
    assert ItemsCounter()([]) is None and ItemsCounter()([1, 2]) is None


# ---- the path found on the first batch ------------------------------------------------------

@pytest.mark.parametrize("first, later, n", [
    ((np.zeros((4, 3)), np.zeros(4)), (np.zeros((9, 3)), np.zeros(9)), 9),
    ({"text": ["a", "b"]}, {"text": ["c", "d", "e"]}, 3),
])
def test_later_batches_are_read_by_the_path_not_walked(monkeypatch, first, later, n):
    count = ItemsCounter()
    count(first)
    assert count.path is not None and not count.first

    def walked(*a):
        raise AssertionError("walked again")

    monkeypatch.setattr(items_module, "_find_tensor", walked)
    monkeypatch.setattr(items_module, "_records_at", walked)
    monkeypatch.setattr(items_other, "find", walked)
    assert count(later) == n


def test_a_batch_of_another_shape_is_walked_again():
    count = ItemsCounter()
    assert count((np.zeros((4, 3)), np.zeros(4))) == 4
    assert count((torch.zeros(6, 3), torch.zeros(6))) == 6  # tensors, at the same path
    assert count(["a", "b", "c"]) == 3
    assert count({"x": np.zeros((2, 1))}) == 2
    assert count((np.zeros((5, 3)),)) == 5
    assert count(np.zeros((4, 3))) == 4  # not its row 0's 3, at the path [0] of the last one
    assert count(None) is None


def test_numpy_is_never_imported_for_a_count(monkeypatch):
    monkeypatch.delitem(sys.modules, "numpy")
    count = ItemsCounter()
    assert count(["a", "b"]) == 2 and count((object(), [3])) is None
    assert "numpy" not in sys.modules


# ---- empty batches --------------------------------------------------------------------------

@both_writers
def test_an_empty_batch_is_0_items_for_its_step(tmp_path, monkeypatch, use_c):
    monkeypatch.setattr(recorder, "_fast", recorder._fast if use_c else None)
    batches = [(torch.zeros(4, 8),), (torch.zeros(0, 8),), (torch.zeros(3, 8),),
               {"x": torch.zeros(0, 2)}, [torch.zeros(0, 3, dtype=torch.long)] * 2]
    assert items_per_step(tmp_path, batches) == {1: 4, 2: 0, 3: 3, 4: 0, 5: 0}
    got = dict(scalars(tmp_path)["trainkit/samples_per_s"])
    assert got[2] == got[4] == got[5] == 0.0


@both_writers
def test_an_empty_batch_in_training_is_a_step_of_0_samples_per_s(tmp_path, monkeypatch, use_c):
    monkeypatch.setattr(recorder, "_fast", recorder._fast if use_c else None)
    model = torch.nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.zeros(b, 8) for b in (4, 0, 4, 0, 2)]
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        with tk.accumulate(2, opt):  # windows of 4 + 0, 4 + 0, 2
            for x in tk.patch(batches):
                model(x).sum().backward()
                time.sleep(0.002)
                opt.step()
                opt.zero_grad()
        for x in tk.patch(batches):
            model(x).sum().backward()
            time.sleep(0.002)
            opt.step()
            opt.zero_grad()
    assert _items(tmp_path) == {1: 4, 2: 4, 3: 2, 4: 4, 5: 0, 6: 4, 7: 0, 8: 2}


@both_writers
def test_0_items_over_a_step_of_no_time_is_no_point_and_no_error(tmp_path, monkeypatch, use_c):
    script = [("rec", (BATCH_REC, 1, 0.0, 0.001, 0)), ("rec", (STEP_REC, 1, 0.002, 0.003, None)),
              ("done", None),
              ("rec", (BATCH_REC, 2, 0.003, 0.003, 0)), ("rec", (STEP_REC, 2, 0.003, 0.003, 0.003)),
              ("done", None),
              ("rec", (BATCH_REC, 3, 0.003, 0.004, 0)), ("rec", (STEP_REC, 3, 0.004, 0.005, 0.003)),
              ("done", None), ("flush", (True, 0))]
    run_script(str(tmp_path), script, use_c, monkeypatch)
    got = scalars(str(tmp_path))
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [2, 3]  # step 2's is 0 ms
    assert got["trainkit/samples_per_s"] == [(3, 0.0)]
