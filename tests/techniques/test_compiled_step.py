"""tk.compiled_step: no recompiles after warm-up under LR schedulers, results equal to eager.

torch.compile takes seconds per graph on a CPU: models are a single Linear(8, 4), and a handful of
steps; the per-scheduler runs are marked slow (CI runs them), one compile test stays fast.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List

import pytest
import torch

import trainkit as tk
from tests.helpers import fail_on_runtime_warnings
from trainkit.switches import overrides

STEPS = 6


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _setup(opt_name: str) -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    if opt_name == "sgd":
        opt: Any = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt


SCHEDULERS: Dict[str, Callable[[Any], Any]] = {
    "linear": lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=STEPS),
    "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=STEPS + 2),
    "warm_restarts": lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=2),
    "plateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=0),
    "lambda": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1.0 / (1 + e)),
}


def _train(opt_name: str, sched_name: str, how: str) -> tuple:
    """Run STEPS steps; how: 'eager', 'decorator' or 'patch'. Returns (params, lrs, betas)."""
    model, opt = _setup(opt_name)
    if how == "patch":  # before the scheduler: it then wraps the patched step
        tk.patch(opt, compile=True)
    sched = SCHEDULERS[sched_name](opt)
    if how == "patch":
        step: Callable[[], Any] = opt.step
    elif how == "decorator":
        @tk.compiled_step
        def step() -> None:
            opt.step()
    else:
        step = opt.step
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    lrs, betas = [], []
    for i in range(STEPS):
        loss = model(x).pow(2).mean()
        loss.backward()
        step()
        opt.zero_grad()
        if sched_name == "plateau":
            sched.step(1.0)  # never improves: the LR halves every step (a Python float write)
        else:
            sched.step()
        lrs.append(opt.param_groups[0]["lr"])
        betas.append(opt.param_groups[0].get("betas"))
    if how == "patch":  # the scheduler's wrapper of the patched step: the compiled core is ours
        step = opt.__dict__["_trainkit_patch"].core
    return [p.detach().clone() for p in model.parameters()], lrs, betas, step


def _assert_equal_to_eager(opt_name: str, sched_name: str, how: str) -> Any:
    ref, ref_lrs, ref_betas, _ = _train(opt_name, sched_name, "eager")
    got, lrs, betas, step = _train(opt_name, sched_name, how)
    assert lrs == ref_lrs and len(set(lrs)) > 1  # the schedule really moved the LR
    assert betas == ref_betas
    assert all(type(v) is float for v in lrs)  # the user sees Python floats, as without us
    for a, b in zip(got, ref):
        rel = ((a - b).norm() / b.norm()).item()
        assert rel < 1e-5, rel
    return step


def _compiled_of(step: Any) -> Any:
    return step.trainkit_compiled


def _scalars(logdir: Any) -> Dict[str, List[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


# -- fast: validation, the switch, and one compile run --------------------------------------------
@pytest.mark.parametrize("call, err, text", [
    (lambda: tk.compiled_step(42), TypeError, "compiled_step(42)"),
    # a model is callable: it was taken for a step function, its forward compiled
    (lambda: tk.compiled_step(torch.nn.Linear(2, 2)), TypeError, "torch.compile(model)"),
    (lambda: tk.compiled_step(mode="fastest"), ValueError, "'fastest'"),
    (lambda: tk.compiled_step(fullgraph="yes"), TypeError, "'yes'"),
])
def test_bad_input_names_the_value(call: Any, err: type, text: str) -> None:
    with pytest.raises(err, match=None) as info:
        call()
    assert text in str(info.value)


def test_bad_mode_lists_modes_and_leaves_optimizer_unpatched() -> None:
    _, opt = _setup("adam")
    with pytest.raises(ValueError) as info:
        tk.compiled_step(opt, mode="fastest")
    assert "reduce-overhead" in str(info.value) and "max-autotune" in str(info.value)
    assert "_trainkit_patch" not in opt.__dict__ and "step" not in opt.__dict__


def test_switched_off_is_eager() -> None:
    with overrides({"compile": False}):
        def step() -> None:
            pass
        assert tk.compiled_step(step) is step
        _, opt = _setup("adam")
        tk.compiled_step(opt)
        assert opt.__dict__["_trainkit_patch"].core == opt.__dict__["_trainkit_patch"].orig_step


def test_decorator_linear_lr_no_recompiles_and_tags(tmp_path: Any) -> None:
    with warnings.catch_warnings():
        fail_on_runtime_warnings()  # a recompile warning fails the test
        with tk.session(logdir=tmp_path, system_metrics=False):
            step = _assert_equal_to_eager("adam", "linear", "decorator")
    c = _compiled_of(step)
    assert c.calls == STEPS and c.recompiles == 0 and c.compile_seconds > 0
    tags = _scalars(tmp_path)
    assert tags["trainkit/compile/recompiles"] and max(tags["trainkit/compile/recompiles"]) == 0
    assert sum(tags["trainkit/compile/seconds"]) > 0


def test_hyper_parameters_restored_after_a_failing_step() -> None:
    model, opt = _setup("adam")

    @tk.compiled_step
    def step() -> None:
        opt.step()
        raise KeyError("boom")  # the user's function fails after stepping

    model(torch.randn(2, 8)).sum().backward()
    with pytest.raises(KeyError):
        step()
    assert type(opt.param_groups[0]["lr"]) is float
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)


# -- slow: every scheduler, both forms, and the problem we fix ------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sched_name", sorted(SCHEDULERS))
def test_no_recompiles_under_scheduler_adam(sched_name: str, tmp_path: Any) -> None:
    if sched_name == "onecycle" and tuple(map(int, torch.__version__.split(".")[:2])) < (2, 5):
        pytest.skip("OneCycleLR moves Adam's betas: a compiled CPU step needs torch >= 2.5")
    with warnings.catch_warnings():
        fail_on_runtime_warnings()
        with tk.session(logdir=tmp_path, system_metrics=False):
            step = _assert_equal_to_eager("adam", sched_name, "patch")
    assert _compiled_of(step).recompiles == 0
    assert max(_scalars(tmp_path)["trainkit/compile/recompiles"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["patch", "decorator"])
def test_no_recompiles_sgd_momentum(how: str, tmp_path: Any) -> None:
    with warnings.catch_warnings():
        fail_on_runtime_warnings()
        with tk.session(logdir=tmp_path, system_metrics=False):
            step = _assert_equal_to_eager("sgd", "lambda", how)
    assert _compiled_of(step).recompiles == 0
    assert max(_scalars(tmp_path)["trainkit/compile/recompiles"]) == 0


@pytest.mark.slow
def test_compiled_step_of_optimizer_is_patch_compile_true() -> None:
    model, opt = _setup("adam")
    assert tk.compiled_step(opt) is opt
    p = opt.__dict__["_trainkit_patch"]
    assert p.compiled and tk.patch(opt, compile=True) is opt  # idempotent
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    assert opt.state_dict()["param_groups"][0]["lr"] == 0.01


@pytest.mark.slow
def test_raw_torch_compile_recompiles_under_onecycle() -> None:
    """The problem trainkit fixes: if torch stops recompiling here, this test says so."""
    from torch._dynamo.utils import counters

    model, opt = _setup("adam")
    sched = SCHEDULERS["onecycle"](opt)
    model(torch.randn(2, 8)).sum().backward()

    @torch.compile
    def step() -> None:
        opt.step()

    step()
    sched.step()
    step()
    graphs = counters["stats"]["unique_graphs"]
    for _ in range(2):
        sched.step()
        step()
    assert counters["stats"]["unique_graphs"] > graphs  # new graphs for new lr/betas values


@pytest.mark.slow
def test_recompile_after_warmup_warns_once_naming_the_guard() -> None:
    model, opt = _setup("sgd")
    model(torch.randn(2, 8)).sum().backward()

    @tk.compiled_step
    def step() -> None:
        opt.step()

    step(); step(); step()
    with pytest.warns(RuntimeWarning, match="momentum") as rec:
        for m in (0.8, 0.7):  # trainkit keeps SGD momentum a float: each value recompiles
            opt.param_groups[0]["momentum"] = m
            step()
    assert len([w for w in rec if "compiled_step" in str(w.message)]) == 1
    assert step.trainkit_compiled.recompiles >= 1  # dynamo may make the float dynamic after one


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (foreach + capturable path)")
def test_cuda_foreach_adam_onecycle_no_recompiles() -> None:
    """On CUDA, Adam defaults to foreach, which takes tensor lr/betas only with capturable=True;
    dynamo sets it for a fresh state, and trainkit's tensors live on the parameters' device."""
    torch.manual_seed(0)
    ref_model = torch.nn.Linear(8, 4).cuda()
    model = torch.nn.Linear(8, 4).cuda()
    model.load_state_dict(ref_model.state_dict())
    x = torch.randn(16, 8, device="cuda")
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=0.01)
    opt = tk.compiled_step(torch.optim.Adam(model.parameters(), lr=0.01))
    scheds = [SCHEDULERS["onecycle"](o) for o in (ref_opt, opt)]
    for _ in range(STEPS):
        for m, o, s in zip((ref_model, model), (ref_opt, opt), scheds):
            m(x).pow(2).mean().backward()
            o.step()
            o.zero_grad()
            s.step()
    for a, b in zip(model.parameters(), ref_model.parameters()):
        # fp32 kernels fused otherwise: 1.2e-5 apart on an H100 (torch 2.11), 5e-5 from a capturable
        # eager Adam; an lr or schedule not applied, or stale after a recompile, is 1e-2 and more
        assert ((a - b).norm() / b.norm()).item() < 1e-4
    assert opt.__dict__["_trainkit_patch"].core.trainkit_compiled.recompiles == 0


def test_the_lr_tensor_is_written_only_when_the_lr_changes() -> None:
    """On a GPU each fill_ is a kernel launch (tk.compiled_step was 0.85x of raw torch.compile on
    an H100, filling every call): an lr that holds is not written again; a new one always is."""
    from trainkit.techniques._hyper import HyperTensors

    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    hyper = HyperTensors(opt)

    def call(lr: float) -> int:
        opt.param_groups[0]["lr"] = lr
        saved = hyper.swap_in()
        t = opt.param_groups[0]["lr"]
        HyperTensors.restore(saved)
        assert opt.param_groups[0]["lr"] == lr and isinstance(t, torch.Tensor)
        assert float(t) == pytest.approx(lr, rel=1e-7)  # float32 on the CPU
        return t._version  # in-place writes so far

    versions = [call(lr) for lr in (0.1, 0.1, 0.1, 0.05, 0.05, 0.0, 0.0, 0.2, 0.1)]
    assert versions == [1, 1, 1, 2, 2, 3, 4, 5, 6]  # 0.0 always (-0.0 == 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("sched_name, moving", [("linear", False), ("onecycle", True)])
def test_betas_become_tensors_only_when_a_schedule_moves_them(sched_name: str, moving: bool) -> None:
    """Tensor betas cost Adam's compiled step ~17% on a CPU: only a moving schedule pays it."""
    if moving and tuple(map(int, torch.__version__.split(".")[:2])) < (2, 5):
        pytest.skip("OneCycleLR moves Adam's betas: a compiled CPU step needs torch >= 2.5")
    torch._dynamo.reset()
    with warnings.catch_warnings():
        fail_on_runtime_warnings()  # the switch is no "late recompile"
        step = _assert_equal_to_eager("adam", sched_name, "patch")
    compiled = _compiled_of(step)
    (hyper,) = compiled._hyper.values()
    assert bool(hyper._betas_moving.get(0)) is moving
    assert compiled.recompiles == 0


@pytest.mark.slow
def test_a_compiled_step_prints_no_dynamo_record_function_warning() -> None:
    """torch's own record_function around Optimizer.step makes dynamo log a warning once per
    process; a fresh process shows whether it reaches the user (raw torch.compile: it does)."""
    import os
    import subprocess
    import sys

    script = """
import sys, torch
import trainkit as tk
model = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
if sys.argv[1] == "trainkit":
    step = tk.patch(opt, compile=True).step
else:
    step = torch.compile(opt.step)
for _ in range(3):
    model(torch.ones(3, 4)).sum().backward()
    step()
    opt.zero_grad()
print("done")
"""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = {}
    for how in ("raw", "trainkit"):
        proc = subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-3000:]
        out[how] = proc.stderr
    said = "Profiler record function" if "Profiler record" in out["raw"] else "Profiler function"
    assert said in out["raw"]  # else torch stopped warning: drop the filter (torch <= 2.6: 2nd)
    assert said not in out["trainkit"], out["trainkit"][-2000:]


def test_float64_parameters_step_as_eager_to_the_last_bits() -> None:
    # lr is handed to the compiled step as a tensor: float64 for float64 parameters (a float32
    # one was ~1e-8 off eager's Python double).
    def run(compile: bool) -> List[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if compile:
            tk.patch(opt, compile=True)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.3, total_iters=3)
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        for _ in range(4):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(True), run(False)):
        assert ((a - b).norm() / b.norm()).item() < 1e-14


@pytest.mark.parametrize("body", ["full", "step_only"])
def test_a_decorated_function_inside_accumulate_runs_every_micro_batch(body: str) -> None:
    # A function doing forward, backward and step: before, its whole call went through the
    # gate, so between window ends it never ran (its micro-batches still counted in the divisor).
    from ._oracle import batches, max_rel_err, model64, windows_oracle

    data = batches([4] * 7)
    make = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
    base = model64()
    oracle = windows_oracle(base, make, [data[0:3], data[3:6], data[6:7]])
    import copy

    m = copy.deepcopy(base)
    opt = make(m.parameters())

    if body == "full":
        @tk.compiled_step
        def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            return loss
    else:
        @tk.compiled_step
        def step() -> None:
            opt.step()

        def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            step()
            return loss

    tk.patch(opt)
    losses = []
    with tk.accumulate(3, opt) as acc:
        for x, y in data:
            losses.append(train_step(x, y))
            opt.zero_grad()
    assert len(losses) == 7 and all(v is not None for v in losses)
    assert acc.steps == 3
    assert max_rel_err(m, oracle) < 1e-12
    assert opt.__dict__["_trainkit_patch"].core == opt.__dict__["_trainkit_patch"].orig_step
