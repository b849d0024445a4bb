"""tk.to_device on dataclass batches and aliased tensors, and ItemsCounter's items per batch."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, List, Optional

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import items_per_step
from trainkit.recorder import H2D_BYTES
from trainkit._items import ItemsCounter


def _moved_bytes(s: Any) -> List[float]:
    return [v for tag, _, v in list(s._buf) if tag == H2D_BYTES]


@dataclasses.dataclass
class Inner:
    ids: torch.Tensor
    note: str = "n"


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    inner: Inner
    extra: List[torch.Tensor]
    label: Optional[torch.Tensor] = None
    derived: Any = dataclasses.field(init=False, default=None)
    never_set: torch.Tensor = dataclasses.field(init=False)
    post_inits: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.post_inits += 1
        self.derived = self.x[:1]  # a view of x: another tensor, moved on its own


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    y: int


@dataclasses.dataclass(frozen=True)
class FrozenSlots:  # what dataclass(slots=True) makes (Python 3.10+), written so 3.9 reads it
    __slots__ = ("x",)
    x: torch.Tensor


@dataclasses.dataclass(frozen=True)
class SlotsMore(FrozenSlots):  # slots of its own beside its base's: one private, one never set
    __slots__ = ("y", "__tag", "unset")
    y: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "_SlotsMore__tag", "t")


@dataclasses.dataclass
class WithOwnTo:
    x: torch.Tensor

    def to(self, device: Any) -> "WithOwnTo":
        return self


def test_to_device_moves_dataclass_fields_keeping_the_type(tmp_path):
    b = Batch(torch.ones(2, 3), Inner(torch.ones(4, dtype=torch.int64)), [torch.ones(5)])
    b.note_attr = "kept"  # an attribute that is no field rides along in the copy
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = tk.to_device({"b": b, "f": Frozen(torch.ones(3), 7), "s": FrozenSlots(torch.ones(1))},
                           "meta")
        nbytes = _moved_bytes(s)
    o = out["b"]
    assert type(o) is Batch and o is not b
    assert o.x.device.type == "meta" and o.extra[0].device.type == "meta" and o.label is None
    assert type(o.inner) is Inner and o.inner.ids.device.type == "meta" and o.inner.note == "n"
    assert o.derived.device.type == "meta"  # an init=False field moves too
    assert o.post_inits == 1 and o.note_attr == "kept"  # copied, not built again
    assert not hasattr(o, "never_set")
    assert b.x.device.type == "cpu" and b.inner.ids.device.type == "cpu"  # the source untouched
    assert b.derived.device.type == "cpu"
    f = out["f"]
    assert type(f) is Frozen and f.x.device.type == "meta" and f.y == 7
    assert type(out["s"]) is FrozenSlots and out["s"].x.device.type == "meta"
    # x, ids, extra, derived (a view: its own bytes), the frozen ones' x.
    assert nbytes == [2 * 3 * 4 + 4 * 8 + 5 * 4 + 1 * 3 * 4 + 3 * 4 + 1 * 4]


def test_to_device_copies_a_frozen_dataclass_whose_slots_are_written_by_hand():
    """copy.copy sets such slots with the setattr frozen refuses: trainkit copies them itself,
    the base's and the class's own, a private one too; one never set stays unset."""
    src = SlotsMore(torch.ones(2), 3)
    out = tk.to_device(src, "meta")
    assert type(out) is SlotsMore and out is not src and out.x.device.type == "meta"
    assert out.y == 3 and out._SlotsMore__tag == "t" and not hasattr(out, "unset")
    assert src.x.device.type == "cpu"


def test_to_device_leaves_dataclasses_without_tensors_or_with_their_own_to_as_they_are():
    plain = Inner(torch.ones(1, device="meta"))  # already there: nothing to copy
    own = WithOwnTo(torch.ones(1))
    out = tk.to_device((plain, own), "meta")
    assert out[0] is plain and out[1] is own and own.x.device.type == "cpu"
    assert tk.to_device(Inner, "meta") is Inner  # a dataclass itself is no batch


def test_to_device_moves_a_tensor_met_twice_once(tmp_path):
    x, y = torch.ones(4, 2), torch.zeros(3)
    view = x[:2]  # shares x's storage but is another tensor: moved on its own
    batch = {"a": x, "b": x, "pair": (x, y, y), "list": [view], "dc": Inner(y)}
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = tk.to_device(batch, "meta")
        again = tk.to_device((x, x), "meta")  # a new call moves it again
        nbytes = _moved_bytes(s)
    assert out["a"] is out["b"] is out["pair"][0] and out["a"].device.type == "meta"
    assert out["pair"][1] is out["pair"][2] is out["dc"].ids and out["dc"].ids.device.type == "meta"
    assert out["list"][0] is not out["a"] and out["list"][0].device.type == "meta"
    assert again[0] is again[1] and again[0] is not out["a"]
    assert nbytes == [4 * 2 * 4 + 3 * 4 + 2 * 2 * 4, 4 * 2 * 4]
    got = scalars(tmp_path)  # both calls fall in one step: their bytes and times add up
    ms = got["trainkit/h2d_ms"][0][1]
    assert got["trainkit/h2d_GBps"][0][1] == pytest.approx(sum(nbytes) / (ms / 1e3) / 1e9, rel=1e-3)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_to_device_counts_the_bytes_a_sparse_tensor_copies_not_its_dense_size(tmp_path):
    """A sparse batch (a bag of words over a vocabulary) copies its indices and values: counted
    by its dense numel(), 2 non-zeros of a 10**6-long vector were 4 MB (1e5x its bytes)."""
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 5000]]), torch.tensor([1.0, 2.0]), (10**6,),
                                  check_invariants=True)
    csr = torch.eye(100).to_sparse_csr()
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = tk.to_device((coo, csr, torch.ones(3)), "meta")
        nbytes = _moved_bytes(s)
    assert out[0].layout is torch.sparse_coo and out[0].device.type == "meta"
    assert out[1].layout is torch.sparse_csr and out[1].device.type == "meta"
    # coo: 1x2 int64 indices, 2 float32 values; csr: 101 + 100 int64 indices, 100 values.
    assert nbytes == [2 * 8 + 2 * 4 + (101 + 100) * 8 + 100 * 4 + 3 * 4]


def test_to_device_without_a_session_moves_a_tensor_met_twice_once():
    x = torch.ones(2)
    out = tk.to_device([x, {"k": x}], "meta")
    assert out[0] is out[1]["k"] and out[0].device.type == "meta"


def test_items_pass_over_a_leading_0d_tensor():
    x = torch.zeros(6, 3)
    count = ItemsCounter()
    assert count((torch.tensor(12), x, torch.zeros(6))) == 6
    assert count.path == [1] and not count.first  # batch[0] is no count: not read inline
    assert count((torch.tensor(13), torch.zeros(2, 3), torch.zeros(2))) == 2
    assert count({"step": torch.tensor(1), "x": [torch.tensor(2.0), x]}) == 6
    assert count((torch.tensor(1), torch.tensor(2))) == 1  # only 0-d tensors: 1, as before
    assert not count.first
    assert count((torch.tensor(1), x)) == 6  # the 0-d path cached above is no answer now
    assert count(("no tensor", 3)) is None
    fresh = ItemsCounter()
    assert fresh((x, torch.tensor(1))) == 6 and fresh.first and fresh.path == [0]
    assert fresh([torch.zeros(4)]) == 4
    zero = ItemsCounter()
    assert zero((torch.tensor(1.0),)) == 1 and not zero.first  # [0], yet 0-d: not inline


def test_patched_loader_counts_items_past_a_leading_0d_tensor(tmp_path):
    # The step index first (0-d), then the data: items are the data's first dimension, both on
    # the first batch (walked) and the next ones (by the learned path); a batch whose first
    # tensor has a dimension again is read inline.
    batches = [(torch.tensor(0), torch.zeros(5, 2), torch.zeros(5)),
               (torch.tensor(1), torch.zeros(3, 2), torch.zeros(3)),
               (torch.zeros(7, 2), torch.tensor(2)),
               (torch.tensor(3), torch.zeros(4, 2)),
               (torch.tensor(4.0),)]
    assert items_per_step(tmp_path, batches) == {1: 5, 2: 3, 3: 7, 4: 4, 5: 1}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without a GPU")
def test_to_device_to_cuda_without_a_gpu_keeps_torchs_error_and_leaves_tensorless_batches_be(tmp_path):
    # to_device starts CUDA before timing the first copy to a GPU; on a machine without one that
    # start fails: a batch with no tensor is returned as it is (as before), and a tensor's copy
    # raises a ValueError that repeats the device and shows the fix, caused by torch's own error
    # from the copy, not one from the start-up.
    batch = {"ids": [1, 2], "name": "x"}
    with tk.session(logdir=tmp_path, system_metrics=False):
        assert tk.to_device(batch, "cuda") == batch
        with pytest.raises(ValueError, match=r"device='cuda'\): this machine has no CUDA GPU"
                           r".*else 'cpu'") as raised:
            tk.to_device(torch.zeros(2), "cuda")
    try:
        torch.zeros(2).to("cuda")
    except (RuntimeError, AssertionError) as exc:
        cause = raised.value.__cause__
        assert type(cause) is type(exc) and str(cause) == str(exc)


def test_items_of_a_dataclass_batch_are_counted(tmp_path):
    """to_device moves dataclass batches; their items were None (no samples_per_s at all)."""
    count = ItemsCounter()
    assert count(Inner(torch.zeros(5))) == 5 and count.path == ["ids"] and not count.first
    assert count(Inner(torch.zeros(3))) == 3  # by the learned path
    assert count({"ids": torch.zeros(4)}) == 4  # a dict's key of that name: walked afresh
    assert count(Inner(torch.zeros(6))) == 6
    assert count({"b": Batch(torch.zeros(2, 3), Inner(torch.zeros(2)), [])}) == 2
    assert ItemsCounter()(Inner("no tensor")) is None
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in tk.patch([Inner(torch.zeros(4)), Inner(torch.zeros(7))]):
            time.sleep(0.002)
    got = scalars(tmp_path)
    steps = dict(got["trainkit/step_time_ms"])
    assert {st: round(v * steps[st] / 1e3) for st, v in got["trainkit/samples_per_s"]} == \
        {1: 4, 2: 7}


def test_items_of_a_batch_whose_structure_changed_are_not_read_inside_a_tensor():
    """The path learned from one batch leads through containers; applied to a bare tensor (a
    loader that yields tensors after tuples) it indexed the tensor and counted a sample's rows."""
    count = ItemsCounter()
    assert count((torch.zeros(5, 3), torch.zeros(5))) == 5
    assert count(torch.zeros(7, 3)) == 7
    keyed = ItemsCounter()
    assert keyed({"x": torch.zeros(4, 2)}) == 4
    assert keyed(torch.zeros(9, 2)) == 9
    assert keyed({"x": torch.zeros(6, 2)}) == 6


def test_items_of_the_other_containers_to_device_moves_are_counted():
    """to_device moves deques, UserLists and SimpleNamespaces; their items were None (no
    samples_per_s), or, for a namespace beside a tensor, the count of another tensor."""
    import collections
    import types

    for make in (collections.deque, collections.UserList):
        count = ItemsCounter()
        assert count(make([torch.zeros(5, 2), torch.zeros(5)])) == 5
        assert count(make([torch.zeros(3, 2), torch.zeros(3)])) == 3  # by the learned path
    count = ItemsCounter()
    assert count(types.SimpleNamespace(name="b", x=torch.zeros(6, 2))) == 6
    assert count(types.SimpleNamespace(name="b", x=torch.zeros(2, 2))) == 2
    assert count({"x": torch.zeros(4)}) == 4  # a dict with that key: walked afresh
    assert ItemsCounter()(types.SimpleNamespace(name="none")) is None
