"""tk.profile_region as a context manager and as a decorator: the time it records (an exception
still records and propagates, a region nested in itself records its outermost entry), the names and targets it
refuses (a bare decorator, a class, async functions), generator functions (each item timed, send,
throw and close passed on), staticmethod and classmethod, a profiler's trace, and compiled code
(the graph left whole, nothing recompiled)."""
from __future__ import annotations

import time
import types

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars


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


@pytest.mark.parametrize("use_c", [True, False])
def test_a_region_kept_from_before_a_profiler_is_traced_while_it_records(tmp_path, use_c,
                                                                        monkeypatch):
    """``fwd = tk.profile_region("x")`` before the loop, ``with fwd:`` in it: the object made
    while no profiler recorded opened no range once one did (its scalar was kept, the trace and
    the user's own profiler had no "kept_<c>" in them); it is the region's fast entry that asks."""
    from torch.profiler import ProfilerActivity, profile

    from trainkit import recorder
    from trainkit.profiling import regions

    if use_c and recorder._fast is None:
        pytest.skip("trainkit._speedups not built")
    monkeypatch.setattr(recorder, "_fast", recorder._fast if use_c else None)
    name = f"kept_{use_c}"
    with tk.session(logdir=tmp_path):
        fwd = tk.profile_region(name)  # the fast region: no profiler records now
        assert type(fwd) is not regions._Region
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                with fwd:
                    torch.ones(3).sum()
        with fwd:  # after the profiler: the fast entry again, nothing left open
            pass
        assert fwd._starts == []
    assert [e.name for e in prof.events()].count(name) == 2
    assert len(scalars(tmp_path)[f"trainkit/region/{name}_ms"]) == 1  # one step: they add up


def test_region_nested_in_itself_records_the_outermost_entry(tmp_path):
    @tk.profile_region("recurse")
    def recurse(n):
        time.sleep(0.01)
        return recurse(n - 1) if n else 0

    with tk.session(logdir=tmp_path) as s:
        recurse(2)
        records = [v for tag, _, v in list(s._buf) if tag == "trainkit/region/recurse_ms"]
    # the outermost entry's 30 ms: the inner entries are in it (adding them wrote 60 ms)
    assert len(records) == 1 and 30 <= records[0] < 45
    assert scalars(tmp_path)["trainkit/region/recurse_ms"][0][1] == pytest.approx(records[0], rel=1e-6)


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
