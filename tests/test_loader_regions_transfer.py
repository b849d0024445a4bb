"""tk.patch(loader), tk.profile_region and tk.to_device."""
from __future__ import annotations

import collections
import collections.abc
import time
import types

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import SlowSGD, loader, mlp, train


class SlowDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return torch.full((4,), float(i)), i % 2


def test_patched_loader_keeps_len_attributes_and_epochs():
    dl = loader(n=40, batch_size=8)
    p = tk.patch(dl)
    assert len(p) == 5 and p.dataset is dl.dataset and p.batch_size == 8
    first = [x.clone() for x, _ in p]
    second = [x.clone() for x, _ in p]
    assert len(first) == len(second) == 5
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert tk.patch(p) is p and tk.unpatch(p) is dl


def test_a_patched_source_without_len_has_none_and_is_true():
    import collections.abc

    gen = (torch.zeros(2) for _ in range(3))
    p = tk.patch(gen)
    assert bool(p) and not hasattr(p, "__len__") and not isinstance(p, collections.abc.Sized)
    sized = tk.patch([])
    assert len(sized) == 0 and not sized and isinstance(sized, collections.abc.Sized)
    assert isinstance(sized, type(p))  # both are patched loaders: tk.unpatch takes either


def test_generator_source_without_len():
    p = tk.patch(x for x in range(3))
    with pytest.raises(TypeError):
        len(p)
    assert list(p) == [0, 1, 2]


def test_data_wait_reflects_a_slow_dataset(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1)
    ds = SlowDataset(12, delay=0.01)
    with tk.session(logdir=tmp_path):
        tk.patch(opt)
        for x, y in tk.patch(torch.utils.data.DataLoader(ds, batch_size=4)):
            opt.step()
    got = scalars(tmp_path)
    waits = [v for _, v in got["trainkit/data_wait_ms"]]
    assert len(waits) == 3 and all(v >= 40 for v in waits)  # 4 items x 10 ms each
    assert [v for _, v in got["trainkit/samples_per_s"]] == pytest.approx(
        [4 / (ms / 1e3) for _, ms in got["trainkit/step_time_ms"]], rel=1e-4)
    del model


def test_items_from_dicts_and_nested_batches(tmp_path):
    batches = [{"ids": torch.zeros(5, 3), "mask": torch.zeros(7)}, ([torch.zeros(2, 1)], 0)]
    with tk.session(logdir=tmp_path):
        for _ in tk.patch(batches):
            time.sleep(0.002)
    got = scalars(tmp_path)
    # No optimizer patched: each batch is a step, and items come from the first tensor.
    sps = dict(got["trainkit/samples_per_s"])
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2]
    assert set(sps) <= {1, 2}
    steps = dict(got["trainkit/step_time_ms"])
    for st, v in sps.items():
        assert v == pytest.approx({1: 5, 2: 2}[st] / (steps[st] / 1e3), rel=1e-4)


class DetectionDataset(torch.utils.data.Dataset):
    """torchvision's detection samples: an image and a dict of its boxes and labels."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        return torch.zeros(3, 16, 16), {"boxes": torch.rand(i % 3 + 1, 4), "labels": torch.ones(i % 3 + 1)}


@pytest.mark.parametrize("collate, per_step", [
    (lambda b: tuple(zip(*b)), [4, 4, 4]),  # torchvision's detection reference: (images, targets)
    (lambda b: [t for _, t in b], [4, 4, 4]),  # a list of per-sample dicts
    (lambda b: [b[0][1]], [1, 2, 3]),  # one dict: may be a collated batch, so its first tensor
])
def test_items_of_a_batch_of_per_sample_records(tmp_path, collate, per_step):
    # An image's first dimension is its 3 channels: samples_per_s said 3 per batch of 4 images.
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    dl = torch.utils.data.DataLoader(DetectionDataset(), batch_size=4, collate_fn=collate)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        for batch in tk.patch(dl):
            time.sleep(0.002)
            opt.step()
    got = scalars(tmp_path)
    steps = dict(got["trainkit/step_time_ms"])
    items = [round(v * steps[st] / 1e3) for st, v in got["trainkit/samples_per_s"]]
    assert items == per_step


def test_items_when_batches_change_shape_mid_pass(tmp_path):
    """The loader counts (tensor, ...) batches inline once it knows the layout; batches that
    leave that layout (an empty tuple, a non-tensor first) are counted the general way."""
    batches = [(torch.zeros(3, 2), 1), (torch.zeros(6, 2), 1), (), ([torch.zeros(4, 1)], 0),
               (torch.zeros((), dtype=torch.float32),), [torch.zeros(2, 9)]]
    with tk.session(logdir=tmp_path):
        for _ in tk.patch(batches):
            time.sleep(0.002)
    got = scalars(tmp_path)
    steps = dict(got["trainkit/step_time_ms"])
    items = {st: round(v * steps[st] / 1e3) for st, v in got["trainkit/samples_per_s"]}
    assert items == {1: 3, 2: 6, 4: 4, 5: 1, 6: 2}  # step 3, the empty tuple, has no items


def test_accumulated_batches_add_up_within_a_step(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path):
        tk.patch(opt)
        for i, (x, y) in enumerate(tk.patch(loader(n=64, batch_size=8))):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if i % 4 == 3:
                opt.step()
                opt.zero_grad()
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2]
    for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], got["trainkit/step_time_ms"]):
        assert sps == pytest.approx(32 / (ms / 1e3), rel=1e-4)


def test_region_context_manager_and_decorator(tmp_path):
    calls = []

    @tk.profile_region("helper")
    def helper(v):
        """Doc kept."""
        calls.append(v)
        time.sleep(0.005)
        return v * 2

    assert helper.__doc__ == "Doc kept." and helper.__name__ == "helper"
    with tk.session(logdir=tmp_path):
        with tk.profile_region("outer"):
            assert helper(2) == 4
            assert helper(3) == 6
    got = scalars(tmp_path)
    assert got["trainkit/region/helper_ms"][0][1] >= 10  # two calls in one step add up
    assert got["trainkit/region/outer_ms"][0][1] >= got["trainkit/region/helper_ms"][0][1]
    assert calls == [2, 3]


def test_region_exception_still_records_and_propagates(tmp_path):
    with tk.session(logdir=tmp_path):
        with pytest.raises(KeyError):
            with tk.profile_region("fails"):
                raise KeyError("x")
    assert len(scalars(tmp_path)["trainkit/region/fails_ms"]) == 1


def test_region_appears_in_profiler_trace_only_while_profiling():
    from torch.profiler import ProfilerActivity, profile

    with tk.profile_region("not_traced"):
        torch.ones(3).sum()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with tk.profile_region("traced_block"):
            torch.ones(3).sum()
    names = {e.name for e in prof.events()}
    assert "traced_block" in names and "not_traced" not in names


def test_region_made_before_a_profiler_is_traced_while_it_records(tmp_path):
    """A name first used outside any profiler gets the fast (C-entry) region; once a profiler
    records, the same name opens ranges, and both kinds time the block."""
    from torch.profiler import ProfilerActivity, profile

    with tk.session(logdir=tmp_path):
        with tk.profile_region("early"):
            pass
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with tk.profile_region("early"):
                torch.ones(3).sum()
        with tk.profile_region("early"):
            pass
    assert [e.name for e in prof.events()].count("early") == 1
    assert len(scalars(tmp_path)["trainkit/region/early_ms"]) == 1  # one step: the three add up


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


def test_region_nested_in_itself_times_each_entry(tmp_path):
    @tk.profile_region("recurse")
    def recurse(n):
        time.sleep(0.01)
        return recurse(n - 1) if n else 0

    with tk.session(logdir=tmp_path) as s:
        recurse(2)
        records = [v for tag, _, v in list(s._buf) if tag == "trainkit/region/recurse_ms"]
    # innermost first: 10, 20 and 30 ms, each entry against its own start
    assert len(records) == 3 and records[0] < records[1] < records[2]
    assert records[2] >= 30 and records[1] >= 20 and records[0] >= 10
    assert scalars(tmp_path)["trainkit/region/recurse_ms"][0][1] == pytest.approx(sum(records), rel=1e-6)


@pytest.mark.parametrize("bad", ["", "a b", 3, None, "x//y", "/x", ["forward"], {"a": 1}])
def test_region_name_validation(bad):
    with pytest.raises(ValueError, match="profile_region"):
        tk.profile_region(bad)


def test_region_used_bare_as_a_decorator_says_to_name_it():
    def forward(x):
        return x

    with pytest.raises(ValueError, match=r"used bare as a decorator.*@tk\.profile_region\('forward'\)"):
        tk.profile_region(forward)


def test_region_decorates_only_callables():
    with pytest.raises(TypeError, match="decorates a function"):
        tk.profile_region("x")(42)


def test_region_refuses_a_class_and_async_functions_before_anything_changes():
    class Net(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(TypeError, match="got the class .*Net.*decorate the method"):
        tk.profile_region("net")(Net)
    assert isinstance(Net(), Net)  # still the class

    async def fetch():
        return 1

    async def stream():
        yield 1

    for fn in (fetch, stream):
        with pytest.raises(TypeError, match="async function.*with tk.profile_region"):
            tk.profile_region("io")(fn)


def test_region_on_a_generator_function_times_each_item_not_the_consumer(tmp_path):
    @tk.profile_region("make")
    def batches(n):
        for i in range(n):
            time.sleep(0.02)  # the generator's own work
            got = yield i
            assert got is None
        return "done"

    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        out = []
        for b in batches(3):
            time.sleep(0.05)  # the consumer's work: not the region's
            out.append(b)
        records = [v for tag, _, v in list(s._buf) if tag == "trainkit/region/make_ms"]
    assert out == [0, 1, 2]
    assert len(records) == 4  # three items and the resumption that ended it
    assert 60 <= sum(records) < 150  # 3 x 20 ms, without the 3 x 50 ms of the loop
    assert batches.__name__ == "batches"

    def result():
        return (yield from batches(1))

    assert list(result()) == [0]
    g = result()
    next(g)
    with pytest.raises(StopIteration) as stop:
        next(g)
    assert stop.value.value == "done"


def test_region_on_a_generator_passes_send_throw_and_close():
    closed = []

    @tk.profile_region("gen")
    def echo():
        try:
            got = None
            while True:
                try:
                    got = yield got
                except KeyError:
                    got = "caught"
        finally:
            closed.append(True)

    g = echo()
    assert next(g) is None and g.send(5) == 5 and g.throw(KeyError("k")) == "caught"
    with pytest.raises(ValueError):
        g.throw(ValueError("v"))
    assert closed == [True]
    g = echo()
    next(g)
    g.close()
    assert closed == [True, True]


def test_region_written_above_staticmethod_and_classmethod():
    class C:
        @tk.profile_region("st")
        @staticmethod
        def twice(a):
            return 2 * a

        @tk.profile_region("cm")
        @classmethod
        def name(cls):
            return cls.__name__

    assert C().twice(3) == 6 and C.twice(4) == 8 and C().name() == "C" and C.name() == "C"


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


class _Store(collections.abc.MutableMapping):
    """A mapping over a dict of its own, which a shallow copy would share."""

    def __init__(self, data):
        self._store = dict(data)

    def __getitem__(self, k):
        return self._store[k]

    def __setitem__(self, k, v):
        self._store[k] = v

    def __delitem__(self, k):
        del self._store[k]

    def __iter__(self):
        return iter(self._store)

    def __len__(self):
        return len(self._store)


def test_to_device_keeps_mapping_types_and_what_they_carry(tmp_path):
    dd = collections.defaultdict(list, {"x": torch.ones(2)})
    od = collections.OrderedDict([("b", torch.ones(1)), ("a", torch.ones(3))])
    ud = _Batch({"ids": torch.ones(4, 2)}, note="kept")
    proxy = types.MappingProxyType({"p": torch.ones(1)})
    store = _Store({"s": torch.ones(2)})
    with tk.session(logdir=tmp_path, system_metrics=False):
        out = tk.to_device({"dd": dd, "od": od, "ud": ud, "proxy": proxy, "store": store}, "meta")
    assert type(out["store"]) is _Store and out["store"]["s"].device.type == "meta"
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


def _eval_pass(model, batches, s):
    with torch.no_grad():
        for x, y in tk.patch(batches):
            s.log("acc", float((model(x).argmax(1) == y).float().mean()))


def test_evaluation_session_after_training_counts_its_batches(tmp_path):
    # The training session's optimizer is still alive (and patched) when the evaluation session
    # runs: it stepped in another session, so here each batch is a step, as with no optimizer.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=32, batch_size=8))
    with tk.session(logdir=tmp_path / "train", system_metrics=False) as s:
        train(model, opt, tk.patch(batches), log=s.log)
    with tk.session(logdir=tmp_path / "eval", system_metrics=False) as s:
        _eval_pass(model, batches, s)
    got = scalars(tmp_path / "eval")
    assert [st for st, _ in got["acc"]] == [1, 2, 3, 4]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3, 4]
    assert [st for st, _ in scalars(tmp_path / "train")["loss"]] == [1, 2, 3, 4]


def test_training_resumed_in_a_new_session_counts_optimizer_steps(tmp_path):
    # The same optimizer in a second session (training goes on after an evaluation session):
    # from its first step there, steps are optimizer steps again, each batch's records with it.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=32, batch_size=8))
    with tk.session(logdir=tmp_path / "a", system_metrics=False) as s:
        train(model, opt, tk.patch(batches), log=s.log)
    with tk.session(logdir=tmp_path / "b", system_metrics=False) as s:
        _eval_pass(model, batches[:2], s)
        train(model, opt, tk.patch(batches), log=s.log)
        train(model, opt, tk.patch(batches), log=s.log)
    got = scalars(tmp_path / "b")
    assert [st for st, _ in got["acc"]] == [1, 2]
    assert [st for st, _ in got["loss"]] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert [st for st, _ in got["trainkit/update_ms"]] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == list(range(1, 11))
    with tk.session(logdir=tmp_path / "c", system_metrics=False) as s:  # training right away
        train(model, opt, tk.patch(batches), log=s.log)
    got = scalars(tmp_path / "c")
    assert [st for st, _ in got["loss"]] == [st for st, _ in got["trainkit/update_ms"]] == [1, 2, 3, 4]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3, 4]


def test_evaluation_under_no_grad_counts_batches_beside_an_optimizer_not_stepped_yet(tmp_path):
    # A patched optimizer that never stepped may be about to train; under no_grad it cannot.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=24, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        _eval_pass(model, batches, s)  # under torch.no_grad()
        train(model, opt, tk.patch(batches), log=s.log)
    got = scalars(tmp_path)
    assert [st for st, _ in got["acc"]] == [1, 2, 3]
    assert [st for st, _ in got["loss"]] == [st for st, _ in got["trainkit/update_ms"]] == [4, 5, 6]


def test_training_with_a_plain_loader_after_a_patched_evaluation(tmp_path):
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=32, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        _eval_pass(model, batches[:2], s)
        for x, y in batches:  # not patched: values go under the step in progress
            loss = torch.nn.functional.cross_entropy(model(x), y)
            s.log("loss", loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    assert [st for st, _ in got["acc"]] == [1, 2]
    assert [st for st, _ in got["loss"]] == [st for st, _ in got["trainkit/update_ms"]] == [3, 4, 5, 6]


def test_accumulating_training_after_an_evaluation_steps_once_per_window(tmp_path):
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = list(loader(n=32, batch_size=8))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        train(model, opt, tk.patch(batches[:1]), log=s.log)
    with tk.session(logdir=tmp_path / "b", system_metrics=False) as s:
        _eval_pass(model, batches[:2], s)
        with tk.accumulate(2, opt):
            train(model, opt, tk.patch(batches), log=s.log)
    got = scalars(tmp_path / "b")
    assert [st for st, _ in got["acc"]] == [1, 2]
    assert [st for st, _ in got["loss"]] == [st for st, _ in got["trainkit/update_ms"]] == [3, 4]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3, 4]
    assert [v for _, v in got["trainkit/samples_per_s"]][-1] > 0  # two batches of 8 in step 4


def test_a_batch_step_holds_its_wait_and_its_body_the_last_and_a_left_one_too(tmp_path):
    # Batches as steps: a step runs from its batch's wait to the next batch's (the loop's end,
    # or where the loop was left), so the body's time is its own batch's, not the next one's.
    batches = [torch.zeros(4, 2)] * 3
    with tk.session(logdir=tmp_path / "full", system_metrics=False):
        for _ in tk.patch(batches):
            time.sleep(0.03)
    with tk.session(logdir=tmp_path / "left", system_metrics=False):
        for i, _ in enumerate(tk.patch(batches)):
            time.sleep(0.03)
            if i == 1:
                break
    for run, steps in (("full", [1, 2, 3]), ("left", [1, 2])):
        got = scalars(tmp_path / run)
        step_ms = got["trainkit/step_time_ms"]
        assert [st for st, _ in step_ms] == steps, run
        assert all(30.0 <= ms < 1000 for _, ms in step_ms), (run, step_ms)
        for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], step_ms):
            assert sps == pytest.approx(4 / (ms / 1e3), rel=1e-4)


def test_zipped_and_nested_patched_loaders_count_one_step_per_iteration_when_batches_are_steps(
        tmp_path):
    # Two patched loaders zipped (paired evaluation sets): a step per pair, holding both waits
    # and both batches' items. Nested: the inner loop's batches are the steps (the outer
    # batch's wait joins the first of them), and the inner loop's end does not end a step
    # twice. Before, every batch of either loader was a step of its own.
    a = [torch.zeros(4, 2)] * 3
    b = [torch.zeros(6, 2)] * 3
    with tk.session(logdir=tmp_path / "zip", system_metrics=False) as s:
        for i, (x, y) in enumerate(zip(tk.patch(a), tk.patch(b))):
            time.sleep(0.01)
            s.log("i", float(i))
    got = scalars(tmp_path / "zip")
    assert got["i"] == [(1, 0.0), (2, 1.0), (3, 2.0)]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2, 3]
    for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], got["trainkit/step_time_ms"]):
        assert sps == pytest.approx(10 / (ms / 1e3), rel=1e-4)  # 4 + 6 items a step
    with tk.session(logdir=tmp_path / "zip_short", system_metrics=False):
        for _ in zip(tk.patch(a), tk.patch(b[:2])):  # the second one ends the pairs
            time.sleep(0.01)
    got = scalars(tmp_path / "zip_short")
    # two pairs, two steps; a's unpaired third batch is no step (its wait: a point of its own)
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3]
    with tk.session(logdir=tmp_path / "nested", system_metrics=False) as s:
        for i, _ in enumerate(tk.patch(a[:2])):
            for j, _ in enumerate(tk.patch(b)):
                time.sleep(0.01)
                s.log("ij", float(10 * i + j))
    got = scalars(tmp_path / "nested")
    assert got["ij"] == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 10.0), (5, 11.0), (6, 12.0)]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2, 3, 4, 5, 6]
    assert all(10.0 <= ms < 1000 for _, ms in got["trainkit/step_time_ms"])


def test_zipped_patched_loaders_feeding_training_add_up_in_the_step(tmp_path):
    # Two sources per step (domain adaptation): both waits and both batches' items in the step
    # the optimizer ends, and the loss logged after the step under it.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    src, tgt = list(loader(n=24, batch_size=8)), list(loader(n=12, batch_size=4, seed=2))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for (x, y), (xt, _) in zip(tk.patch(src), tk.patch(tgt)):
            loss = torch.nn.functional.cross_entropy(model(x), y) + model(xt).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.log("loss", loss)
    got = scalars(tmp_path)
    assert [st for st, _ in got["loss"]] == [1, 2, 3]
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2, 3]
    for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], got["trainkit/step_time_ms"]):
        assert sps == pytest.approx(12 / (ms / 1e3), rel=1e-4)  # 8 + 4 items a step


def test_a_batch_left_untrained_by_a_break_or_a_zip_brings_no_items_to_the_next_step(tmp_path):
    # A break at the top of the loop (steps per epoch capped), and the unpaired batch of
    # zip(long, short): the loader handed out a batch that no step trained on. Its items left
    # in the step in progress made the next epoch's first step count two batches (samples/s
    # doubled at every epoch boundary); its wait stays there, inside that step's wall time.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    data = list(loader(n=80, batch_size=8))
    with tk.session(logdir=tmp_path / "break", system_metrics=False):
        batches = tk.patch(data)
        for epoch in range(3):
            for i, (x, y) in enumerate(batches):
                if i == 3:
                    break
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    with tk.session(logdir=tmp_path / "zip", system_metrics=False):
        for epoch in range(2):
            for (x, y), _ in zip(tk.patch(data[:3]), tk.patch([None] * 2)):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    for run, steps in (("break", 9), ("zip", 4)):
        got = scalars(tmp_path / run)
        step_ms = got["trainkit/step_time_ms"]
        assert [st for st, _ in step_ms] == list(range(1, steps + 1)), run
        for (st, sps), (_, ms) in zip(got["trainkit/samples_per_s"], step_ms):
            assert sps == pytest.approx(8 / (ms / 1e3), rel=1e-4), (run, st)
        # the last untrained batch's wait: a step of its own, with no items (nothing follows)
        assert [st for st, _ in got["trainkit/data_wait_ms"]][-1] == steps + 1, run
        assert len(got["trainkit/samples_per_s"]) == steps, run


def test_an_optimizer_patched_inside_the_loop_takes_the_batch_in_progress(tmp_path):
    # No optimizer was patched at the first batch, so it was counted as a step; the optimizer
    # patched (lazily) in that iteration makes it a training step: no phantom step.
    model = mlp()
    opt = None
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        for i, (x, y) in enumerate(tk.patch(list(loader(n=32, batch_size=8)))):
            if opt is None:
                opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            s.log("loss", float(i))
    got = scalars(tmp_path)
    assert got["loss"] == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)]
    assert [st for st, _ in got["trainkit/update_ms"]] == [1, 2, 3, 4]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2, 3, 4]


@pytest.mark.cuda
def test_to_device_counts_host_to_device_copies_only_on_gpu(tmp_path):
    # "cuda" is the current device: a batch already there is no copy; device to host is no h2d.
    x = torch.ones(256, device="cuda")
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        assert tk.to_device(x, "cuda") is x
        back = tk.to_device(x, "cpu")
        assert [tag for tag, _, _ in list(s._buf) if tag.startswith("trainkit/h2d")] == []
    assert back.device.type == "cpu"


def test_a_region_inside_compiled_code_leaves_the_graph_whole(tmp_path):
    # A region in a compiled model's forward: torch.compile traced into it and broke the graph
    # in two on every call (with a warning about type()). Inside a traced graph a region is now
    # nothing; the same region outside compiled code still records.
    import torch._dynamo
    from torch._dynamo.utils import counters

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)

        def forward(self, x):
            with tk.profile_region("inside"):
                h = self.a(x).relu()
            return self.b(h)

    torch.manual_seed(0)
    net = Net()
    compiled = torch.compile(net, backend="eager")
    x = torch.randn(4, 8)
    expected = net(x)  # eager, before the session
    torch._dynamo.reset()
    counters.clear()
    with tk.session(logdir=tmp_path, system_metrics=False):
        for _ in range(3):
            out = compiled(x)
            torch.testing.assert_close(out, expected)
        with tk.profile_region("outside"):
            time.sleep(0.001)
    assert dict(counters["graph_break"]) == {}
    got = scalars(tmp_path)
    assert "trainkit/region/inside_ms" not in got
    assert [st for st, _ in got["trainkit/region/outside_ms"]] == [1]


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


def test_a_first_region_inside_compiled_code_recompiles_nothing(monkeypatch):
    # The first region of a process met inside compiled code bound trainkit's flags there: a
    # global rebound while dynamo traces, so the next call failed its guard and recompiled.
    import torch._dynamo
    from torch._dynamo.utils import guard_failures

    from trainkit.profiling import regions

    # As in a process where no region ran yet, and torch came after trainkit.
    monkeypatch.setattr(regions, "_compiling", regions._compiling_first)
    monkeypatch.setattr(regions, "_TC", types.SimpleNamespace(_initialized=False))
    monkeypatch.setattr(regions, "_TAP", types.SimpleNamespace(_is_profiler_enabled=False))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 3)

        def forward(self, x):
            with tk.profile_region("fwd"):
                return self.a(x).relu()

    torch._dynamo.reset()
    compiled = torch.compile(Net(), backend="eager")
    for _ in range(3):
        compiled(torch.randn(4, 8))
    assert dict(guard_failures) == {}
