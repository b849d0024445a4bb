"""The GPU code paths' logic, run on the CPU: which device's stream each CUDA event goes on, which
events go back to the pool, and what happens when events of two devices meet.

No GPU here, so torch's three CUDA calls that trainkit's timing binds (the current device, a new
event, a device's current stream) are stand-ins that keep what a real event would: the device it
belongs to (recording it on another device's stream raises, as CUDA does), and when it was
recorded. Everything else (session, patched optimizer and loader, regions, the writer thread,
event files read back) is the real thing. The same paths on a real GPU: tests marked ``cuda``.
"""
from __future__ import annotations

import time
import warnings

import pytest
import torch

import trainkit as tk
from trainkit import timing
from trainkit.profiling import regions

from .helpers import mlp
from .conftest import scalars


class Stream:
    def __init__(self, device: int) -> None:
        self.device = torch.device("cuda", device)


class FakeCuda:
    """Stand-ins for torch's CUDA calls, with a current device that tests set."""

    def __init__(self) -> None:
        self.current = 0
        self.created = 0
        self.recorded = []  # the device index of every record() call, in order
        self.fail = False  # a CUDA error that sticks: every record() raises

    def event(self) -> "Event":
        self.created += 1
        return Event(self)


class Event:
    def __init__(self, cuda: FakeCuda) -> None:
        self._cuda = cuda
        self.device = None  # a new event belongs to no device until first recorded
        self.t = None

    def record(self, stream: Stream = None) -> None:
        if self._cuda.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        index = self._cuda.current if stream is None else stream.device.index
        if self.device is not None and self.device.index != index:
            raise RuntimeError(f"Event device {self.device.index} does not match recording "
                               f"stream's device {index}")
        self.device = torch.device("cuda", index)
        self.t = time.perf_counter()
        self._cuda.recorded.append(index)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "Event") -> float:
        if end.device != self.device:
            raise RuntimeError("Both events must be recorded on the same device")
        return (end.t - self.t) * 1e3


@pytest.fixture
def cuda(monkeypatch):
    if torch.cuda.is_available() and not torch.cuda.default_generators:
        # A GPU machine where this process has not used CUDA yet: initialise it for real, else
        # torch.manual_seed, seeing the flag faked below, seeds generators never made (IndexError)
        torch.cuda.init()
    fake = FakeCuda()
    monkeypatch.setattr(timing, "_current_device", lambda: fake.current)
    monkeypatch.setattr(timing, "_new_event", fake.event)
    monkeypatch.setattr(timing, "_stream_of", Stream)
    monkeypatch.setattr(timing, "_pools", {})
    monkeypatch.setattr(timing, "_rank_device", timing._UNSET)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    # "This process has initialised CUDA", as the hot paths read it (torch.cuda's own flag).
    regions.load_flags()
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    return fake


def on_device(opt, index: int) -> None:
    """Have the patch take ``opt``'s parameters for parameters on ``cuda:<index>``."""
    p = opt.__dict__["_trainkit_patch"]
    p._cuda, p._device = True, index


def train(model, opt, loader) -> None:
    for x, y in loader:
        with tk.profile_region("forward"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with tk.profile_region("backward"):
            loss.backward()
        opt.step()
        opt.zero_grad()


def batches(n: int = 12):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g))
            for _ in range(n)]


def test_events_go_on_the_stream_of_the_device_the_steps_run_on(tmp_path, cuda):
    # The model on cuda:1 while the current device stays 0 (no torch.cuda.set_device, as with
    # model.to(local_rank) under torchrun): the step's, the loader's and the regions' events go
    # on device 1's stream once the first step says where the steps run; before, every event
    # went on device 0 and timed its idle stream.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no value dropped (two devices' events compared)
        with tk.session(logdir=tmp_path, system_metrics=False) as s:
            tk.patch(opt)
            on_device(opt, 1)
            train(model, opt, tk.patch(batches()))
            assert s._cuda_device == 1
    # Only the first step's data wait and regions, before its optimizer step, are on device 0.
    first_step_end = cuda.recorded.index(1)
    assert set(cuda.recorded[first_step_end:]) == {1}, cuda.recorded
    assert 0 < first_step_end <= 5
    got = scalars(tmp_path)
    steps = [k for k, _ in got["trainkit/step_time_ms"]]
    assert steps == list(range(1, 13))  # the first, begun on device 0, timed on the host
    assert all(v > 0 for _, v in got["trainkit/step_time_ms"])
    assert [k for k, _ in got["trainkit/region/forward_ms"]] == list(range(1, 13))
    assert [k for k, _ in got["trainkit/update_ms"]] == list(range(1, 13))


def test_under_torchrun_without_set_device_no_event_goes_on_device_0(tmp_path, cuda, monkeypatch):
    # A torchrun rank whose model went to cuda:<LOCAL_RANK> (no set_device, as the DDP tutorial
    # has it): before its first step says where the steps run, the first wait's and the regions'
    # events go on the rank's device too. On device 0 they timed its idle stream, and made a
    # CUDA context there from every rank.
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        on_device(opt, 1)
        train(model, opt, tk.patch(batches(3)))
    assert cuda.recorded and set(cuda.recorded) == {1}, cuda.recorded
    assert [k for k, _ in scalars(tmp_path)["trainkit/step_time_ms"]] == [1, 2, 3]


def test_a_region_goes_on_the_current_device_once_it_is_set(tmp_path, cuda):
    # A pipeline stage under `with torch.cuda.device(2)`: its region times device 2's stream, not
    # the steps' device's; the other regions go on the steps' device (1) as the current device
    # stays torch's default, 0.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        on_device(opt, 1)
        for x, y in tk.patch(batches(3)):
            with tk.profile_region("stage0"):
                h = model[0](x)
            cuda.current = 2
            before = len(cuda.recorded)
            with tk.profile_region("stage1"):
                out = model[2](model[1](h))
            assert cuda.recorded[before:] == [2, 2]
            cuda.current = 0
            torch.nn.functional.cross_entropy(out, y).backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    assert [k for k, _ in got["trainkit/region/stage1_ms"]] == [1, 2, 3]
    assert [k for k, _ in got["trainkit/region/stage0_ms"]] == [1, 2, 3]


def test_finished_events_go_back_to_the_pool(tmp_path, cuda):
    # Regions' and steps' events, once read by the writer, are recorded again: a long run
    # creates a few dozen events, not several per step (before, every end event was new).
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False, log_every=5) as s:
        tk.patch(opt)
        on_device(opt, 0)
        for _ in range(10):
            train(model, opt, tk.patch(batches(20)))
            s.flush()
    recorded = len(cuda.recorded)
    assert recorded >= 200 * 6  # per step: 2 regions x 2, the update's 2 (the wait's: the first only)
    # At most a pass's events (20 steps x 6) are in flight at once: each pass ends with a flush
    # that reads them all. Without the ends given back, at least 3 a step are new (600).
    assert cuda.created < 200, (cuda.created, recorded)
    got = scalars(tmp_path)
    assert [k for k, _ in got["trainkit/step_time_ms"]] == list(range(1, 201))
    assert [k for k, _ in got["trainkit/update_ms"]] == list(range(1, 201))


def test_an_event_is_never_in_use_twice(tmp_path, cuda):
    # Each event handed out is recorded once, then read, then given back, before it is handed
    # out again: an event given back twice would be recorded by two intervals at once.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    given = []
    real = timing._give_back
    with tk.session(logdir=tmp_path, system_metrics=False, log_every=3) as s:
        tk.patch(opt)
        on_device(opt, 0)
        timing._give_back = lambda ev: (given.append(id(ev)), real(ev))
        try:
            for _ in range(5):
                train(model, opt, tk.patch(batches(10)))
                s.flush()
                pooled = [id(ev) for ev in timing._pools.get(0, [])]
                assert len(pooled) == len(set(pooled))
        finally:
            timing._give_back = real


def test_a_sticky_cuda_error_leaves_the_users_exception_as_it_is(tmp_path, cuda):
    # An evaluation (batches are steps) whose step fails with a CUDA error that sticks: ending
    # the last step (as the loop is left, or at close) records no event (it would raise again,
    # out of the generator's close or over the user's error), it ends on the host clock; the
    # user's own exception propagates unchanged, and every step is written, the failed one too.
    class Failed(Exception):
        pass

    with pytest.raises(Failed):
        with torch.no_grad(), tk.session(logdir=tmp_path, system_metrics=False):
            for i, (x, _) in enumerate(tk.patch(batches(6))):
                if i == 4:
                    cuda.fail = True
                    raise Failed("the user's own error")
    got = scalars(tmp_path)
    assert [k for k, _ in got["trainkit/step_time_ms"]] == [1, 2, 3, 4, 5]


def test_peak_memory_keeps_one_meaning_when_cuda_starts_after_the_session(tmp_path, monkeypatch,
                                                                         cuda):
    # The session starts (and the writer samples) before the model goes to its GPU: peak_MB is
    # left out until it can be told which peak it is, then it is the CUDA peak throughout.
    # Before, the first samples were the host's peak RSS (hundreds of MB) and the later ones the
    # CUDA allocator's: one chart, two meanings.
    from trainkit.sinks.system import PEAK_MB, RSS_MB

    monkeypatch.setattr(torch.cuda, "_initialized", False)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, flush_secs=0.05) as s:
        deadline = time.monotonic() + 20
        while RSS_MB not in scalars(tmp_path):  # the writer's first sample, CUDA not started
            assert time.monotonic() < deadline
            time.sleep(0.05)
        monkeypatch.setattr(torch.cuda, "_initialized", True)  # "model.cuda()"
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: (100 + 23 * i) * 2**20)
        tk.patch(opt)
        for x, y in tk.patch(batches(3)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        s.flush()
    got = scalars(tmp_path)
    assert got[PEAK_MB] and {v for _, v in got[PEAK_MB]} == {123.0}, got[PEAK_MB]


def test_a_sticky_cuda_error_inside_a_region_leaves_the_users_exception_as_it_is(tmp_path, cuda):
    # The user's step fails inside a region with a CUDA error that sticks: the region's end
    # records no event (it would raise again, out of the region's exit, over the user's
    # error); it is timed on the host, and the user's own exception propagates unchanged.
    class Failed(Exception):
        pass

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(Failed):
        with tk.session(logdir=tmp_path, system_metrics=False):
            tk.patch(opt)
            on_device(opt, 0)
            for i, (x, y) in enumerate(tk.patch(batches(6))):
                with tk.profile_region("forward"):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    if i == 2:
                        cuda.fail = True
                        raise Failed("the user's own error")
                loss.backward()
                opt.step()
                opt.zero_grad()
    got = scalars(tmp_path)
    assert [k for k, _ in got["trainkit/region/forward_ms"]] == [1, 2, 3]



def test_each_event_is_given_back_once_and_never_touched_after(tmp_path, cuda, monkeypatch):
    # Stricter than the pool check above: an event given back is never handed out again here,
    # so any use after its release (recorded, queried, read) by an interval not read yet, or as
    # the session's last step end, shows; and so does a second give-back. Covered: shared ends
    # (a step's update and step time; the next step's time starts there), a GAN's second
    # optimizer on another device, closures, an evaluation then training, takeovers between
    # optimizers, and writes that stop at a step the GPU has not passed yet.
    errors, late = [], set()
    monkeypatch.setattr(Event, "released", False, raising=False)
    for name in ("record", "query", "synchronize", "elapsed_time"):
        def checked(self, *args, _real=getattr(Event, name), _name=name):
            if self.released or any(getattr(a, "released", False) for a in args):
                errors.append(f"{_name} on an event given back")
            if _name == "query":
                return id(self) not in late
            return _real(self, *args)
        monkeypatch.setattr(Event, name, checked)

    def give_back(ev):
        if ev.released:
            errors.append("an event given back twice")
        ev.released = True

    monkeypatch.setattr(timing, "_give_back", give_back)

    def event():  # every third event is not passed until told: the writer stops there
        ev = cuda.event()
        if cuda.created % 3 == 0:
            late.add(id(ev))
        return ev

    monkeypatch.setattr(timing, "_new_event", event)

    def loop(opts, closure=False, n=7):
        for x, y in tk.patch(batches(n)):
            with tk.profile_region("forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            if opts:
                loss.backward()
            for opt in opts:
                if closure:
                    opt.step(lambda: loss)
                else:
                    opt.step()
                opt.zero_grad()

    model = mlp()
    g, d, h = (torch.optim.SGD(model.parameters(), lr=0.1) for _ in range(3))
    with tk.session(logdir=tmp_path, system_metrics=False, log_every=2, flush_secs=0.05) as s:
        with torch.no_grad():  # an evaluation first: batches are steps
            loop([])
        for opt, device in ((g, 1), (d, 0), (h, 1)):
            tk.patch(opt)
            on_device(opt, device)
        for _ in range(2):
            loop([g, d])  # d: a GAN's second optimizer, on another device
            s.flush()
            loop([g], closure=True)
        late.clear()
        loop([h])  # h takes the steps over (it steps twice with none of g's between)
        loop([g], n=3)  # and g takes them back
    assert not errors, errors[:3]
    assert len(scalars(tmp_path)["trainkit/step_time_ms"]) > 40


def test_a_sticky_cuda_error_stops_neither_the_writer_nor_the_steps_it_writes(tmp_path, cuda,
                                                                             monkeypatch):
    # The writer looks at the steps while the user's step fails with a CUDA error that sticks:
    # asked whether an event has passed, CUDA answers with that error. The values it cannot read
    # are left out (a warning names the error), the rest of every step is written. Before, the
    # error ended the writer thread ("writing the run failed ... free some space"), and nothing
    # more was written, at close neither.
    class Failed(Exception):
        pass

    real_query = Event.query

    def query(self):
        if cuda.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_query(self)

    monkeypatch.setattr(Event, "query", query)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Failed):
            with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=0.05) as s:
                tk.patch(opt)
                on_device(opt, 0)
                for i, (x, y) in enumerate(tk.patch(batches(6))):
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    if i == 4:
                        cuda.fail = True
                        time.sleep(0.3)  # the writer wakes meanwhile, steps 1-4 not all written
                        raise Failed("the user's own error")
                    opt.step()
                    opt.zero_grad()
    assert s._recorder.failed is None, s._recorder.failed
    assert [k for k, _ in scalars(tmp_path)["trainkit/data_wait_ms"]] == [1, 2, 3, 4, 5]
