"""tk.to_device: nested structures moved with their types kept (named tuples, mappings that are no
dict and the items a patched loader counts in them, a PackedSequence, list subclasses), the copy's
time and bytes recorded (nothing for a batch already on the device), bad arguments, pinned copies
and host-to-device counts on a GPU, and compiled code (the copies alone, inside the graph)."""
from __future__ import annotations

import collections
import collections.abc
import time
import types

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import DictStore


Pair = collections.namedtuple("Pair", "x y")


def test_to_device_nested_structures_and_bytes(tmp_path):
    batch = {"a": (torch.ones(2, 3), [torch.zeros(4, dtype=torch.float64), "text", 7]),
             "b": Pair(torch.ones(5, dtype=torch.int8), None)}
    with tk.session(logdir=tmp_path):
        out = tk.to_device(batch, "meta")
    assert out["a"][0].device.type == "meta" and out["a"][1][0].device.type == "meta"
    assert out["a"][1][1:] == ["text", 7]
    assert isinstance(out["b"], Pair) and out["b"].x.device.type == "meta" and out["b"].y is None
    got = scalars(tmp_path)
    nbytes = 2 * 3 * 4 + 4 * 8 + 5
    ms = got["trainkit/h2d_ms"][0][1]
    assert got["trainkit/h2d_GBps"][0][1] == pytest.approx(nbytes / (ms / 1e3) / 1e9, rel=1e-3)
    assert got["trainkit/h2d_pinned_pct"] == [(1, 0.0)]  # nothing was pinned


class _Batch(collections.UserDict):
    """A mapping that is no dict, with state of its own (as a tokenizer's BatchEncoding)."""

    def __init__(self, data=None, note="n"):
        super().__init__(data)
        self.note = note


def test_to_device_keeps_mapping_types_and_what_they_carry(tmp_path):
    dd = collections.defaultdict(list, {"x": torch.ones(2)})
    od = collections.OrderedDict([("b", torch.ones(1)), ("a", torch.ones(3))])
    ud = _Batch({"ids": torch.ones(4, 2)}, note="kept")
    proxy = types.MappingProxyType({"p": torch.ones(1)})
    store = DictStore({"s": torch.ones(2)})
    with tk.session(logdir=tmp_path, system_metrics=False):
        out = tk.to_device({"dd": dd, "od": od, "ud": ud, "proxy": proxy, "store": store}, "meta")
    assert type(out["store"]) is DictStore and out["store"]["s"].device.type == "meta"
    assert store["s"].device.type == "cpu"  # the source keeps its tensors
    assert type(out) is dict
    assert type(out["dd"]) is collections.defaultdict and out["dd"].default_factory is list
    assert out["dd"]["x"].device.type == "meta" and out["dd"]["missing"] == []
    assert type(out["od"]) is collections.OrderedDict and list(out["od"]) == ["b", "a"]
    assert out["od"]["a"].device.type == "meta"
    assert type(out["ud"]) is _Batch and out["ud"].note == "kept"
    assert out["ud"]["ids"].device.type == "meta"
    assert ud["ids"].device.type == "cpu" and dd["x"].device.type == "cpu"  # sources untouched
    assert out["proxy"] == {"p": out["proxy"]["p"]} and out["proxy"]["p"].device.type == "meta"
    nbytes = (2 + 1 + 3 + 8 + 1 + 2) * 4
    ms = scalars(tmp_path)["trainkit/h2d_ms"][0][1]
    assert scalars(tmp_path)["trainkit/h2d_GBps"][0][1] == pytest.approx(nbytes / (ms / 1e3) / 1e9, rel=1e-3)


def test_items_from_a_mapping_that_is_no_dict(tmp_path):
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in tk.patch([_Batch({"ids": torch.zeros(6, 3)}), _Batch({"ids": torch.zeros(2, 3)})]):
            time.sleep(0.002)
    got = scalars(tmp_path)
    steps = dict(got["trainkit/step_time_ms"])
    for st, v in got["trainkit/samples_per_s"]:
        assert v == pytest.approx({1: 6, 2: 2}[st] / (steps[st] / 1e3), rel=1e-4)


def test_to_device_a_packed_sequence_and_a_list_subclass(tmp_path):
    # A PackedSequence moves as its own .to() does (batch_sizes stay on the CPU: an RNN refuses
    # them elsewhere); a list subclass keeps its type, as tuples and dicts do.
    class Batch(list):
        pass

    seqs = [torch.ones(3, 2), torch.ones(2, 2)]
    packed = torch.nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False)
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = tk.to_device(Batch([packed, torch.zeros(4)]), "meta")
        nbytes = [v for tag, _, v in list(s._buf) if tag == "\0h2d_bytes"]
    assert type(out) is Batch
    p = out[0]
    assert isinstance(p, torch.nn.utils.rnn.PackedSequence)
    assert p.data.device.type == "meta" and p.sorted_indices.device.type == "meta"
    assert p.batch_sizes.device.type == "cpu" and torch.equal(p.batch_sizes, packed.batch_sizes)
    assert nbytes == [5 * 2 * 4 + 2 * 8 + 2 * 8 + 4 * 4]  # data, both indices, the other tensor


def test_to_device_tuple_subclasses_keep_their_type_or_else_are_tuples():
    """A tuple subclass keeps its type, as a list subclass does; one whose constructor takes its
    items otherwise (its own __new__) comes back as a tuple of them: it raised TypeError."""
    class Items(tuple):
        pass

    class Pair2(tuple):
        def __new__(cls, a, b):
            return super().__new__(cls, (a, b))

    out = tk.to_device(Items((torch.ones(1), 2)), "meta")
    assert type(out) is Items and out[0].device.type == "meta" and out[1] == 2
    out = tk.to_device(Pair2(torch.ones(1), torch.zeros(2)), "meta")
    assert type(out) is tuple and [t.device.type for t in out] == ["meta", "meta"]
    out = tk.to_device(Pair(torch.ones(1), "y"), "meta")
    assert type(out) is Pair and out.x.device.type == "meta" and out.y == "y"


def test_to_device_same_device_is_free_and_records_nothing(tmp_path):
    x = torch.ones(3)
    with tk.session(logdir=tmp_path, system_metrics=False):
        assert tk.to_device(x, "cpu") is x
    assert "trainkit/h2d_ms" not in scalars(tmp_path)


@pytest.mark.parametrize("device, exc, text", [
    ("gpu", ValueError, "'gpu'"), (1.5, TypeError, "1.5"), (True, TypeError, "True")])
def test_to_device_bad_device(device, exc, text):
    with pytest.raises(exc, match=text):
        tk.to_device(torch.ones(1), device)


def test_to_device_bad_non_blocking():
    with pytest.raises(TypeError, match="non_blocking='yes'"):
        tk.to_device(torch.ones(1), "cpu", non_blocking="yes")


@pytest.mark.cuda
def test_to_device_pinned_copies_are_async_and_timed_on_gpu(tmp_path):
    x = torch.ones(1024, 1024).pin_memory()
    y = torch.ones(1024, 1024)
    with tk.session(logdir=tmp_path):
        torch.zeros(1, device="cuda")
        out = tk.to_device((x, y), "cuda")
        torch.cuda.synchronize()
    assert out[0].is_cuda and out[1].is_cuda
    got = scalars(tmp_path)
    assert got["trainkit/h2d_pinned_pct"][0][1] == pytest.approx(50.0)
    assert got["trainkit/h2d_GBps"][0][1] > 0.1


@pytest.mark.cuda
def test_to_device_counts_host_to_device_copies_only_on_gpu(tmp_path):
    # "cuda" is the current device: a batch already there is no copy; device to host is no h2d.
    x = torch.ones(256, device="cuda")
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        assert tk.to_device(x, "cuda") is x
        back = tk.to_device(x, "cpu")
        assert [tag for tag, _, _ in list(s._buf) if tag.startswith("trainkit/h2d")] == []
    assert back.device.type == "cpu"


def _dynamo_traces_copy_copy():
    """Whether this torch's dynamo traces copy.copy of a dataclass (2.14's does, 2.11's not)."""
    import copy
    import dataclasses

    import torch._dynamo

    @dataclasses.dataclass
    class Probe:
        x: torch.Tensor

    torch._dynamo.reset()
    try:
        torch.compile(lambda p: copy.copy(p), backend="eager", fullgraph=True)(Probe(torch.ones(1)))
    except Exception:  # torch._dynamo.exc.Unsupported
        return False
    finally:
        torch._dynamo.reset()
    return True


def test_to_device_inside_compiled_code_copies_within_the_graph(tmp_path):
    # tk.to_device in a compiled train step: a copy to another device (meta stands in for a GPU)
    # recorded its time and bytes from inside the graph, which crashed dynamo ("deque mutated
    # during iteration", the buffer the writer thread empties); on the way, perf_counter broke
    # the graph three times, and the id() of each tensor was a guard that recompiled every batch.
    # Traced, to_device is now the copies alone, the structure and aliasing kept.
    import dataclasses

    import torch._dynamo
    from torch._dynamo.utils import counters, guard_failures

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        n: int = 3

    # A dataclass is moved in a copy.copy of it, which torch 2.11's dynamo does not trace (it
    # skips the copy module): there a dataclass in the batch is a graph break, as copy.copy in
    # the user's own code would be, and an error under fullgraph=True. Checked where it traces.
    with_dataclass = _dynamo_traces_copy_copy()

    def step(x, y):
        batch = {"pair": (x, y), "same": (x, x), "k": [1, "s"]}
        if with_dataclass:
            batch["b"] = Batch(y)
        out = tk.to_device(batch, "meta")
        return out

    for fullgraph in (False, True):
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(step, backend="eager", fullgraph=fullgraph)
        with tk.session(logdir=tmp_path / str(fullgraph), system_metrics=False):
            for _ in range(3):
                out = compiled(torch.randn(4, 8), torch.randn(4))
        assert dict(counters["graph_break"]) == {} and dict(guard_failures) == {}
        assert out["pair"][0].device.type == "meta" and out["pair"][0].shape == (4, 8)
        assert out["same"][0] is out["same"][1]
        if with_dataclass:
            assert type(out["b"]) is Batch and out["b"].x.device.type == "meta" and out["b"].n == 3
        assert out["k"] == [1, "s"]
        assert not [t for t in scalars(tmp_path / str(fullgraph)) if "h2d" in t]
