"""trainkit._speedups.FastStep, a patched optimizer's step with its per-step fast path in C
(trainkit/_speedups_step.h), against the Python closure it stands for: the same records on a fake
clock, through closures, accumulation gates, profilers, LR schedulers made before and after the
patch, unpatch and patch again; and the same behaviour as a function (copies, pickling, freeing,
the errors it raises).
"""
from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import step_function
from trainkit import _optcalls, recorder

fast = recorder._fast
needs_c = pytest.mark.skipif(fast is None, reason="trainkit._speedups is not built here "
                                                  "(no C compiler at install)")


class _FakeProfiler:
    """A session's trace profiler (``s._profiler``): its ``step()`` calls, by session step."""

    def __init__(self, s: Any, calls: list) -> None:
        self.s, self.calls = s, calls

    def step(self) -> None:
        self.calls.append(self.s.step)

    def close(self) -> None:
        pass


def _step_run(tmp_path, use_c: bool, monkeypatch: pytest.MonkeyPatch, log_every: int,
              scheduler_first: bool) -> dict:
    """A scripted training run on a fake clock, with the C step or the Python one: steps outside
    a session, in one (plain, with a closure, under an accumulation gate, with a trace profiler
    and with torch's profiler recording, with a core of its own, one that raises), LR schedulers
    made before and after the patch, unpatch and patch again, a second optimizer.

    With ``scheduler_first`` false, the scheduler made in the session wraps the patched step, and
    calls it still after the unpatch (a stale step: it falls through to the optimizer's own)."""
    import gc
    import warnings

    import torch

    import trainkit as tk
    from trainkit import timing
    from trainkit.patch import optimizer_patch

    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(timing, "now", lambda: next(ticks) * 0.25)  # before the patch binds it
    monkeypatch.setattr(recorder, "_fast", fast if use_c else None)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    head = torch.nn.Linear(2, 1)
    xs = [torch.randn(5, 4, generator=gen) for _ in range(7)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out: dict = {"kinds": [], "wakes": [], "traced": [], "cores": [], "results": []}
    i = [0]

    def backward() -> Any:
        i[0] += 1
        loss = model(xs[i[0] % len(xs)]).square().mean() + head(model(xs[0])).mean()
        loss.backward()
        return loss

    def plain(n: int = 1) -> None:
        for _ in range(n):
            opt.zero_grad()
            backward()
            out["results"].append(opt.step())
            out["kinds"].append(type(step_function(opt)).__name__)

    gc.collect()
    gc.disable()  # a collection is a record (trainkit/gc_ms) and two clock reads: none here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5) if scheduler_first else None
        tk.patch(opt)
        plain(2)  # no session
        with tk.session(logdir=str(tmp_path / str(use_c)), system_metrics=False,
                        log_every=log_every) as s:
            s._wake = lambda: out["wakes"].append(s.step)
            with s._recorder._lock:  # the writer waits: the records stay in the buffer
                plain(5)
                if before is not None:
                    before.step()
                after = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)  # wraps the patched step
                for _ in range(4):
                    plain()
                    after.step()
                opt.zero_grad()
                out["results"].append(opt.step(backward).item())  # a closure, positional
                opt.zero_grad()
                out["results"].append(opt.step(closure=backward).item())
                with tk.accumulate(2, opt):  # the gate: every second call steps
                    for _ in range(5):
                        plain()
                plain(2)
                s._profiler = _FakeProfiler(s, out["traced"])
                plain(3)
                s._profiler = None
                with torch.profiler.profile():
                    plain(2)
                p = optimizer_patch(opt)
                own = p.orig_step
                p._core = lambda: out["cores"].append(s.step) or own()
                plain(2)
                p._core = lambda: 1 / 0
                with pytest.raises(ZeroDivisionError):
                    opt.step()
                p._core = None
                plain(2)
                tk.unpatch(opt)  # the schedulers' wrappers stay: the old step falls through
                plain(2)
                tk.patch(opt)
                plain(3)
                opt2 = torch.optim.SGD(head.parameters(), lr=0.05)  # a GAN's second optimizer
                tk.patch(opt2)
                for _ in range(3):
                    plain()
                    opt2.step()
                plain(2)
                out["records"] = list(s._recorder.buf)
            after.step()
        plain(2)  # after the session
        tk.unpatch(opt)
        tk.unpatch(opt2)
    gc.enable()
    # torch's own once-a-process warnings (TORCH_WARN_ONCE: the profiler's "clears events")
    # come to whichever of the two runs met them first: not a difference between C and Python
    out["warnings"] = [str(w.message) for w in caught
                       if not str(w.message).startswith("Warning: Profiler clears events")]
    out["params"] = [t.detach().clone() for t in [*model.parameters(), *head.parameters()]]
    out["lr"] = [g["lr"] for g in opt.param_groups]
    out["step_count"] = opt.__dict__.get("_step_count")
    monkeypatch.undo()
    return out


@needs_c
@pytest.mark.parametrize("log_every, scheduler_first", [(1, True), (3, False), (1000, True),
                                                       (1, False)])
def test_c_steps_record_what_python_steps_do(tmp_path, monkeypatch, log_every, scheduler_first):
    from trainkit.recorder import STEP_REC

    py = _step_run(tmp_path / "py", False, monkeypatch, log_every, scheduler_first)
    c = _step_run(tmp_path / "c", True, monkeypatch, log_every, scheduler_first)
    assert "FastStep" in c["kinds"] and "FastStep" not in py["kinds"]
    steps = [r for r in c["records"] if r[0] == STEP_REC]
    assert len(steps) >= 20  # most steps took the fast path
    assert steps == [r for r in py["records"] if r[0] == STEP_REC]
    assert c["records"] == py["records"]  # every other record too, and in the same order
    for key in ("wakes", "traced", "cores", "results", "warnings", "lr", "step_count"):
        assert c[key] == py[key], key
    assert len(c["traced"]) == 3 and len(c["cores"]) == 2
    assert bool(c["wakes"]) == (log_every < 40)  # some steps woke the writer, not every one
    assert len(c["params"]) == len(py["params"])
    for a, b in zip(c["params"], py["params"]):
        assert a.numpy().tobytes() == b.numpy().tobytes()  # bit for bit


def _patched_sgd(use_c: bool, monkeypatch: pytest.MonkeyPatch, scheduler_first: bool = False):
    import torch

    import trainkit as tk

    monkeypatch.setattr(recorder, "_fast", fast if use_c else None)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1) if scheduler_first else None
    tk.patch(opt)
    return model, opt, sched


@needs_c
@pytest.mark.parametrize("scheduler_first", [False, True])
def test_the_c_step_carries_what_the_python_step_does(monkeypatch, scheduler_first):
    import copy
    import inspect
    import weakref

    _, opt_py, _ = _patched_sgd(False, monkeypatch, scheduler_first)
    _, opt_c, _ = _patched_sgd(True, monkeypatch, scheduler_first)
    fpy, fc = step_function(opt_py), step_function(opt_c)
    assert type(fc) is fast.FastStep and type(fpy) is not fast.FastStep
    assert fc.__wrapped_step__ is True
    assert fc.__dict__ == fpy.__dict__
    # the mark a scheduler made before the patch left on the step it wrapped: torch < 2.4's
    # with_counter marks it _with_counter, newer schedulers _wrapped_by_lr_sched
    mark = "_with_counter" if _optcalls._schedulers_count_steps() else "_wrapped_by_lr_sched"
    assert fc.__dict__.get(mark, False) is scheduler_first
    for attr in ("__name__", "__qualname__", "__module__", "__doc__", "__annotations__"):
        assert getattr(fc, attr) == getattr(fpy, attr), attr
    assert fc.__name__ == "step"
    assert inspect.signature(opt_c.step) == inspect.signature(opt_py.step)
    assert inspect.signature(fc) == inspect.signature(fpy)
    # the descriptor protocol, as a function's (torch's LR schedulers bind the step they wrap)
    assert fc.__get__(None, type(opt_c)) is fc
    bound = fc.__get__(opt_c, type(opt_c))
    assert bound.__func__ is fc and bound.__self__ is opt_c
    bound()
    assert weakref.ref(fc)() is fc
    assert copy.copy(fc) is fc and copy.deepcopy(fc) is fc  # as a function: itself
    assert copy.deepcopy(fpy) is fpy
    fc.__name__ = "renamed"
    assert fc.__name__ == "renamed"
    with pytest.raises(TypeError):
        fc.__qualname__ = 3


@needs_c
def test_a_c_step_wrapped_by_an_older_torchs_scheduler_counter(monkeypatch):
    """torch < 2.4: scheduler_marked wraps the step with functools.wraps to count _step_count."""
    from trainkit import _optcalls

    monkeypatch.setattr(_optcalls, "_schedulers_count_steps", lambda: True)
    _, opt, _ = _patched_sgd(True, monkeypatch)
    counted = opt.step.__func__
    assert type(counted) is not fast.FastStep and type(counted.__wrapped__) is fast.FastStep
    assert counted.__name__ == "step" and counted.__wrapped_step__ and counted._with_counter
    assert counted.__qualname__ == counted.__wrapped__.__qualname__
    opt.__dict__["_step_count"] = 0
    opt.step()
    assert opt._step_count == 1


@needs_c
def test_a_c_patched_optimizer_copies_pickles_and_saves_as_unpatched(monkeypatch):
    import copy
    import pickle

    import torch

    model, opt, _ = _patched_sgd(True, monkeypatch)
    assert type(step_function(opt)) is fast.FastStep
    plain_model = copy.deepcopy(model)
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.1)
    for m, o in ((model, opt), (plain_model, plain)):  # torch 2.3's step leaves some state
        m(torch.ones(1, 3)).sum().backward()
        o.step()
    assert opt.state_dict() == plain.state_dict()
    for other in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        assert "step" not in other.__dict__ and "_trainkit_patch" not in other.__dict__
        assert other.state_dict() == opt.state_dict()


@needs_c
def test_a_c_patched_optimizer_is_freed_at_once(monkeypatch):
    import weakref

    _, opt, _ = _patched_sgd(True, monkeypatch)
    step = weakref.ref(opt.step.__func__)
    gone = weakref.ref(opt)
    del opt
    assert gone() is None and step() is None  # no cycle: no collection needed


@needs_c
def test_the_c_step_refuses_what_the_python_step_refuses(monkeypatch):
    _, opt_py, _ = _patched_sgd(False, monkeypatch)
    _, opt_c, _ = _patched_sgd(True, monkeypatch)
    errors = []
    for f in (opt_py.step.__func__, opt_c.step.__func__):
        with pytest.raises(TypeError) as e:
            f()  # no self
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    with pytest.raises(TypeError):
        fast.FastStep(1, 2, 3)
