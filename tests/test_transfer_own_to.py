"""tk.to_device on objects that move themselves, with a ``.to()`` of their own (a PyTorch
Geometric ``Data``, a DGL graph, a TensorDict): moved through it, where before they came back
where they were, without a word, and the model then met a batch on the wrong device. Their host
bytes are counted as a tensor's would be, so h2d_ms and h2d_GBps cover them. And the standard
library's other containers (deque, UserList, SimpleNamespace), which were returned unmoved too."""
from __future__ import annotations

import sys

import pytest
import torch

import trainkit as tk
from tests.helpers import DictStore
from trainkit.recorder import H2D_BYTES



class Graph:
    """A PyG-like graph: tensors in a storage, a .to() that returns a moved copy."""

    def __init__(self, store, name="g"):
        self._store = store
        self.name = name
        self.calls = []

    def to(self, device, non_blocking=False):
        self.calls.append(non_blocking)
        moved = {k: v.to(device, non_blocking=non_blocking) for k, v in self._store.items()}
        return Graph(DictStore(moved), self.name)


class Plain:
    """An object whose .to(device) takes no non_blocking."""

    def __init__(self, t):
        self.t = t

    def to(self, device):
        return Plain(self.t.to(device))


def _graph():
    return Graph(DictStore(x=torch.ones(10, 4), edge_index=torch.zeros(2, 30, dtype=torch.int64)))


def _bytes(s):
    return [v for tag, _, v in list(s._buf) if tag == H2D_BYTES]


def test_an_object_with_its_own_to_is_moved_through_it_and_its_bytes_counted(tmp_path):
    g = _graph()
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = tk.to_device({"graph": g, "y": torch.ones(10)}, "meta")
        nbytes = _bytes(s)
    moved = out["graph"]
    assert type(moved) is Graph and moved.name == "g"
    assert moved._store["x"].device.type == "meta"
    assert moved._store["edge_index"].device.type == "meta"
    assert g._store["x"].device.type == "cpu"  # the source untouched
    assert g.calls == [False]  # its own default: where its tensors are pinned is its to know
    assert out["y"].device.type == "meta"
    assert nbytes == [10 * 4 * 4 + 2 * 30 * 8 + 10 * 4]


class InPlaceGraph(Graph):
    """PyG's real Data: its .to() moves the tensors in place (``self.apply``) and returns self."""

    def to(self, device, non_blocking=False):
        self.calls.append(non_blocking)
        for k, v in list(self._store.items()):
            self._store[k] = v.to(device, non_blocking=non_blocking)
        return self


def test_an_object_moved_in_place_by_its_own_to_has_its_bytes_counted(tmp_path):
    # The tensors before were read after the call, from the object it had moved: nothing was
    # left on the host to count, and h2d_ms / h2d_GBps had no point for such a batch
    g = InPlaceGraph(DictStore(x=torch.ones(10, 4), edge_index=torch.zeros(2, 30,
                                                                       dtype=torch.int64)))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = tk.to_device((g, torch.ones(10)), "meta")
        nbytes = _bytes(s)
    assert out[0] is g and g._store["x"].device.type == "meta"
    assert nbytes == [10 * 4 * 4 + 2 * 30 * 8 + 10 * 4]


def test_non_blocking_is_passed_when_given_and_left_out_where_to_takes_none(tmp_path):
    g = _graph()
    out = tk.to_device(g, "meta", non_blocking=True)
    assert g.calls == [True] and out._store["x"].device.type == "meta"
    g2 = _graph()
    tk.to_device(g2, "meta")  # None: its own default
    assert g2.calls == [False]
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        p = tk.to_device([Plain(torch.ones(3))], "meta", non_blocking=True)
        nbytes = _bytes(s)
    assert p[0].t.device.type == "meta" and nbytes == [12]


def test_one_object_twice_moves_once():
    g = _graph()
    a, b = tk.to_device((g, g), "meta")
    assert a is b and len(g.calls) == 1


def test_an_error_of_its_own_to_is_its_own():
    class Broken:
        def to(self, device, non_blocking=False):
            raise TypeError("cannot move a Broken")

    with pytest.raises(TypeError, match="cannot move a Broken"):
        tk.to_device(Broken(), "meta", non_blocking=True)


class Quantity:
    """A value with units (pint's, astropy's): its .to() converts units, and refuses a device."""

    def __init__(self, magnitude, unit):
        self.magnitude, self.unit = magnitude, unit

    def to(self, unit):
        if not isinstance(unit, str):
            raise TypeError(f"to() takes a unit name, not {type(unit).__name__}")
        return Quantity(self.magnitude, unit)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python >= 3.11")
def test_a_to_that_is_no_device_move_fails_with_its_own_error_and_a_note_on_the_fix():
    batch = {"x": torch.ones(2), "speed": Quantity(3.0, "m/s")}
    with pytest.raises(TypeError, match="takes a unit name") as raised:
        tk.to_device(batch, "meta")
    notes = getattr(raised.value, "__notes__", [])
    assert len(notes) == 1 and "Quantity by its own .to('meta')" in notes[0]
    assert "keep the object out of what to_device is given" in notes[0]


def test_a_torch_error_of_a_move_gets_no_note():
    class OutOfMemory:
        def to(self, device, non_blocking=False):
            raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="out of memory") as raised:
        tk.to_device(OutOfMemory(), "meta")
    assert not getattr(raised.value, "__notes__", [])


def test_a_model_inside_a_batch_is_not_moved_as_a_side_effect():
    model = torch.nn.Linear(2, 2)
    out = tk.to_device({"m": model, "x": torch.ones(2)}, "meta")
    assert out["m"] is model and model.weight.device.type == "cpu"
    assert out["x"].device.type == "meta"


class TensorMap(DictStore):
    """A mapping that cannot be built from a dict alone (as a TensorDict needs its batch_size),
    with a .to() of its own: it moves through that, keeping its type, not as a plain dict."""

    def __init__(self, batch_size, **kw):
        super().__init__(**kw)
        self.batch_size = batch_size

    def to(self, device, non_blocking=False):
        return TensorMap(self.batch_size, **{k: v.to(device) for k, v in self.items()})


def test_a_mapping_with_its_own_to_keeps_its_type(tmp_path):
    tm = TensorMap(4, obs=torch.ones(4, 3), act=torch.zeros(4, dtype=torch.int64))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = tk.to_device(tm, "meta")
        nbytes = _bytes(s)
    assert type(out) is TensorMap and out.batch_size == 4
    assert out["obs"].device.type == "meta" and out["act"].device.type == "meta"
    assert nbytes == [4 * 3 * 4 + 4 * 8]


def test_deques_userlists_and_namespaces_are_moved_keeping_their_type(tmp_path):
    # Returned where they were before, their tensors on the host.
    import collections
    import types

    class Tagged(collections.UserList):
        pass

    dq = collections.deque([torch.ones(2), torch.ones(3)], maxlen=5)
    ul = Tagged([torch.ones(4)])
    ul.note = "kept"
    ns = types.SimpleNamespace(x=torch.ones(5), name="n", inner=[torch.ones(1)])
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = tk.to_device((dq, ul, ns), "meta")
        nbytes = _bytes(s)
    d, u, n = out
    assert type(d) is collections.deque and d.maxlen == 5
    assert [t.device.type for t in d] == ["meta"] * 2
    assert type(u) is Tagged and u.note == "kept" and u[0].device.type == "meta"
    assert type(n) is types.SimpleNamespace and n.x.device.type == "meta" and n.name == "n"
    assert n.inner[0].device.type == "meta"
    assert dq[0].device.type == "cpu" and ul[0].device.type == "cpu" and ns.x.device.type == "cpu"
    assert nbytes == [(2 + 3 + 4 + 5 + 1) * 4]


def test_sets_of_tensors_are_moved_keeping_their_type(tmp_path):
    # A set or frozenset (tensors hash by identity) came back as it was, its tensors on the host.
    class Tags(frozenset):
        pass

    a, b, c = torch.ones(2), torch.ones(3), torch.ones(4)
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        got, frozen, tagged = tk.to_device(({a, b}, frozenset([c]), Tags([a, "x"])), "meta")
        nbytes = _bytes(s)
    assert type(got) is set and sorted(t.numel() for t in got) == [2, 3]
    assert {t.device.type for t in got} == {"meta"}
    assert type(frozen) is frozenset and next(iter(frozen)).device.type == "meta"
    assert type(tagged) is Tags and "x" in tagged
    assert [t.device.type for t in tagged if isinstance(t, torch.Tensor)] == ["meta"]
    assert nbytes == [(2 + 3 + 4) * 4]  # a met twice: copied once

def test_what_a_batch_holds_besides_its_fields_is_not_walked_on_every_copy(tmp_path):
    # A batch object holding its dataset (a list of 200,000 tensors) and its model: the walk
    # that finds the bytes its .to() moved went through all of them, ~1 s a call.
    from trainkit.techniques import _transfer_own

    class Batch:
        def __init__(self, x, dataset, model):
            self.x, self.dataset, self.model = x, dataset, model

        def to(self, device, non_blocking=False):
            return Batch(self.x.to(device), self.dataset, self.model)

    dataset = [torch.ones(2) for _ in range(_transfer_own._WIDE + 1)]
    b = Batch(torch.ones(8), dataset, torch.nn.Linear(4, 4))
    assert set(_transfer_own._leaves(b)) == {("x",)}  # neither the long list nor the model
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = tk.to_device(b, "meta")
        nbytes = _bytes(s)
    assert out.x.device.type == "meta" and out.dataset is dataset
    assert nbytes == [8 * 4]
    # However an object is built, the walk looks at a bounded number of objects: here 2,700
    # small dicts of a tensor each, in three lists each short enough to be looked into.
    import types

    many = types.SimpleNamespace(**{k: [{"t": torch.ones(1)} for _ in range(900)] for k in "abc"})
    found = _transfer_own._leaves(many)
    assert len(found) < 2_700  # stopped after _VISITS objects, not every one walked
