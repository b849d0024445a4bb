import copy
import warnings

import pytest
import torch

import trainkit as tk
from trainkit import switches

from ._oracle import batches, big_batch_oracle, max_rel_err, model64


def _cpu_autocast_on():
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch 2.3: no device argument yet
        return torch.is_autocast_cpu_enabled()


def _model32(seed=0):
    return model64(seed).float()


def test_fp16_scaler_under_accumulate_matches_fp32_oracle():
    base = model64()
    data = batches([8] * 10)
    oracle = big_batch_oracle(base, lambda ps: torch.optim.SGD(ps, lr=0.1), data, 4)
    m = copy.deepcopy(base).float()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    with tk.accumulate(4, opt) as acc:
        for x, y in data:
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                assert amp.dtype is torch.float16
                loss = torch.nn.functional.mse_loss(m(x.float()), y.float())
            amp.backward(loss)
            assert amp.step(opt)
            opt.zero_grad()
    assert acc.steps == 3 and amp.skipped == 0
    assert max_rel_err(m.double(), oracle) < 2e-3  # fp16 matmuls; an off-by-one window divisor gives ~7e-2


@pytest.mark.parametrize("fused", [False, True])
def test_inf_gradient_is_a_skipped_step(tmp_path, fused):
    # A fused optimizer takes the scaling into its kernel, so GradScaler calls it even for a
    # skipped step; trainkit does not, so that no one counts it as a real step.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = _model32()
    opt = tk.patch(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=fused))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    x, y = (t.float() for t in batches([4])[0])
    before = [p.detach().clone() for p in m.parameters()]
    with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
        with tk.accumulate(2, opt) as acc:
            for i in range(2):
                with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                    loss = torch.nn.functional.mse_loss(m(x), y)
                if i == 1:
                    loss = loss * float("inf")
                amp.backward(loss)
                stepped = amp.step(opt)
                opt.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()"
            sched.step()
    assert stepped is False and amp.skipped == 1
    assert scaler.get_scale() == 128.0
    assert acc.steps == 0 and acc.micro_batches == 0 and s.step == 1
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
    assert not opt.state or all("momentum_buffer" not in st or st["momentum_buffer"] is None
                                for st in opt.state.values())
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    assert [p.value for p in ea.Scalars("trainkit/amp/skipped_steps")] == [1.0]
    assert [p.value for p in ea.Scalars("trainkit/amp/scale")] == [128.0]
    tk.unpatch(opt)


def test_clip_grad_norm_applies_to_unscaled_window_gradient():
    m = _model32()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    x, y = (t.float() for t in batches([4])[0])
    with tk.accumulate(2, opt):
        for i in range(2):
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                loss = 10 * torch.nn.functional.mse_loss(m(x), y)
            amp.backward(loss)
            amp.step(opt, clip_grad_norm=0.5)
            if i == 1:
                norm = torch.nn.utils.get_total_norm([p.grad for p in m.parameters()]) \
                    if hasattr(torch.nn.utils, "get_total_norm") else \
                    torch.norm(torch.stack([p.grad.norm() for p in m.parameters()]))
            opt.zero_grad()
    assert amp.skipped == 0
    assert abs(float(norm) - 0.5) < 1e-3


def test_users_own_scaler_calls_work_inside_and_after_the_block():
    base = _model32()
    x, y = (t.float() for t in batches([4])[0])
    results = []
    for mode in ("amp", "inside", "after"):
        m = copy.deepcopy(base)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
        for _ in range(3):
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                loss = torch.nn.functional.mse_loss(m(x), y)
                if mode == "inside":
                    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
            if mode == "after":
                scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
            elif mode == "amp":
                amp.backward(loss); amp.step(opt)
            opt.zero_grad()
        results.append(m)
    assert max_rel_err(results[1], results[0]) == 0.0
    assert max_rel_err(results[2], results[0]) == 0.0


def test_users_scaler_step_inside_accumulate_raises_clear_error():
    m = _model32()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = (t.float() for t in batches([4])[0])
    with pytest.raises(RuntimeError, match="amp.step"):
        with tk.accumulate(4, opt):
            with tk.autocast_scaled(scaler, dtype="fp16"):
                loss = torch.nn.functional.mse_loss(m(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)


def test_users_scaler_with_accumulate_1_is_fine():
    m = _model32()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = (t.float() for t in batches([4])[0])
    with tk.accumulate(1, opt) as acc:
        for _ in range(2):
            loss = torch.nn.functional.mse_loss(m(x), y)
            scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); opt.zero_grad()
    assert acc.steps == 2


def test_amp_switched_off_is_a_no_op():
    m = _model32()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = (t.float() for t in batches([4])[0])
    with switches.overrides({"amp": False}):
        with tk.autocast_scaled(scaler, dtype="fp16") as amp:
            out = m(x)
            assert not _cpu_autocast_on()
        assert out.dtype is torch.float32 and amp.scaler is None
        loss = torch.nn.functional.mse_loss(out, y)
        amp.backward(loss)
        assert m[0].weight.grad is not None
        assert amp.step(opt) is True
    assert scaler.get_scale() == 65536.0  # untouched


def test_auto_is_bf16_on_cpu_and_fp32_disables_autocast():
    m = _model32()
    x = torch.randn(2, 6)
    with tk.autocast_scaled() as amp:
        assert m(x).dtype is torch.bfloat16 and amp.dtype is torch.bfloat16
    with tk.autocast_scaled(dtype="fp32") as amp:
        assert m(x).dtype is torch.float32 and amp.dtype is None


def test_fp32_inside_an_enabled_autocast_runs_in_fp32():
    """An fp32 region (a loss) inside an outer block, or the user's own torch.autocast: it ran in
    the outer dtype. Switched off, the technique does the same; with no autocast around, it
    enters none."""
    m = _model32()
    x = torch.randn(2, 6)
    with tk.autocast_scaled() as outer:
        with tk.autocast_scaled(dtype="fp32"):
            assert m(x).dtype is torch.float32 and not _cpu_autocast_on()
        assert m(x).dtype is torch.bfloat16 and outer.dtype is torch.bfloat16  # restored
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with switches.overrides({"amp": False}):
            with tk.autocast_scaled():
                assert m(x).dtype is torch.float32
        assert m(x).dtype is torch.bfloat16
    assert not _cpu_autocast_on()


@pytest.mark.parametrize("kwargs,needle", [
    (dict(dtype="fp8"), "'fp8'"),
    (dict(dtype="fp16"), "GradScaler('cpu')"),
    (dict(scaler=torch.amp.GradScaler("cpu", enabled=False), dtype="fp16"),
     "scaler=<a disabled GradScaler for 'cpu'>"),
    (dict(device_type="tpu"), "'tpu'"),
])
def test_bad_input(kwargs, needle):
    with pytest.raises((ValueError, TypeError)) as e:
        with tk.autocast_scaled(**kwargs):
            pass
    assert needle in str(e.value)
    assert not _cpu_autocast_on()


@pytest.mark.parametrize("what, needle", [
    ("model", "got a model (nn.Module)"), ("params", "got list"), ("scaler", "got GradScaler")])
def test_amp_step_of_what_is_no_optimizer_says_so_before_anything_is_unscaled(what, needle):
    # It failed inside GradScaler: "'Linear' object has no attribute 'param_groups'".
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)  # 65536 overflows fp16 here
    with tk.autocast_scaled(scaler, dtype="fp16") as amp:
        loss = m(torch.ones(1, 2)).float().sum()
    amp.backward(loss)
    grads = [p.grad.clone() for p in m.parameters()]
    bad = {"model": m, "params": list(m.parameters()), "scaler": scaler}[what]
    with pytest.raises(TypeError, match=r"amp\.step\(.*expected the torch\.optim\.Optimizer") as e:
        amp.step(bad)
    assert needle in str(e.value) and "amp.step(optimizer)" in str(e.value)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, m.parameters()))  # still scaled
    assert amp.step(opt)  # the right call works on the same backward


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("bad", [0.5, None, "loss"])
def test_amp_backward_of_what_is_no_tensor_says_so_before_anything_changes(dtype, bad):
    # It raised GradScaler's "outputs must be a Tensor or an iterable of Tensors" (or "'map'
    # object has no attribute 'backward'") with the scaler, "'float' object has no attribute
    # 'backward'" without: naming neither the value nor the fix (a loss.item() passed), and the
    # accumulate block's window was marked scaled already.
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with tk.accumulate(2, opt) as acc:
        with tk.autocast_scaled(scaler, dtype=dtype) as amp:
            loss = m(torch.ones(1, 2)).float().sum()
        with pytest.raises(TypeError, match=r"amp\.backward\(.*expected the loss tensor") as e:
            amp.backward(bad)
        assert repr(bad) in str(e.value) and "amp.backward(loss)" in str(e.value)
        assert not acc._scaled and amp._backward_at is None
        assert all(p.grad is None for p in m.parameters())
        amp.backward(loss)  # the right call works
        amp.step(opt)


def test_the_device_defaults_to_the_scalers_own(monkeypatch):
    """With CUDA in use in the process, a GradScaler('cpu') still means a loop on the CPU (it was
    autocast on 'cuda' for CPU tensors: nothing cast, nothing ever skipped); without a scaler, or
    with one for 'cuda' that turned itself off (no CUDA), the default stays "CUDA in use"."""
    from trainkit.techniques import amp as amp_mod

    monkeypatch.setattr(amp_mod.timing, "cuda_in_use", lambda: True)
    assert amp_mod._check(torch.amp.GradScaler("cpu"), "fp16", None) == "cpu"
    assert amp_mod._check(torch.amp.GradScaler("cpu", enabled=False), "bf16", None) == "cpu"
    assert amp_mod._check(None, "bf16", None) == "cuda"
    assert amp_mod._check(torch.amp.GradScaler("cpu"), "fp16", "cuda") == "cuda"  # asked for
    with warnings.catch_warnings():  # torch warns that it disables itself without CUDA
        warnings.simplefilter("ignore")
        off = torch.amp.GradScaler("cuda", enabled=False)
    assert amp_mod._check(off, "bf16", None) == "cuda"
    monkeypatch.setattr(amp_mod.timing, "cuda_in_use", lambda: False)
    assert amp_mod._check(off, "bf16", None) == "cpu"


def test_auto_on_cuda_is_fp16_only_on_a_gpu_without_bf16(monkeypatch):
    """'auto' on 'cuda' is fp16 (which needs a scaler) on a GPU before Ampere; without CUDA at
    all it was refused with "this GPU has no bf16", of a GPU that is not there: autocast then
    turns itself off with torch's warning, as with an explicit dtype."""
    from trainkit.techniques import amp as amp_mod

    assert not torch.cuda.is_available()
    with pytest.warns(UserWarning, match="CUDA is not available"):
        with tk.autocast_scaled(device_type="cuda") as amp:
            assert amp.dtype is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert amp_mod._resolve_dtype("auto", "cuda", None) is torch.float16
    assert amp_mod._resolve_dtype("auto", "cpu", None) is torch.bfloat16
    with pytest.raises(ValueError, match="this GPU has no bf16"):
        with tk.autocast_scaled(device_type="cuda"):
            pass


@pytest.mark.cuda
def test_cuda_fp16_scaler_step():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    m = _model32().cuda()
    opt = torch.optim.Adam(m.parameters(), lr=0.01, fused=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=256.0)
    x, y = (t.float().cuda() for t in batches([4])[0])
    with tk.accumulate(2, opt):
        for i in range(4):
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                loss = torch.nn.functional.mse_loss(m(x), y)
            if i == 3:
                loss = loss * float("inf")
            amp.backward(loss); amp.step(opt); opt.zero_grad()
    assert amp.skipped == 1 and scaler.get_scale() == 128.0


def test_skipped_steps_add_up_across_blocks_and_are_filed_under_their_step(tmp_path):
    """The usual loop enters autocast_scaled once per iteration: the count is the scaler's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = _model32()
    opt = tk.patch(torch.optim.SGD(m.parameters(), lr=0.1))
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    x, y = (t.float() for t in batches([4])[0])
    stepped = []
    with tk.session(logdir=str(tmp_path), system_metrics=False):
        for i in range(6):
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                loss = torch.nn.functional.mse_loss(m(x), y)
            if i in (1, 3):
                loss = loss * float("inf")
            amp.backward(loss)
            stepped.append(amp.step(opt))
            opt.zero_grad()
    assert stepped == [True, False, True, False, True, True] and amp.skipped == 2
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    # a skipped step is no step: iterations 1 and 2 are step 2, iterations 3 and 4 are step 3
    assert [(p.step, p.value) for p in ea.Scalars("trainkit/amp/skipped_steps")] == [
        (1, 0.0), (2, 1.0), (3, 2.0), (4, 2.0)]
    assert [(p.step, p.value) for p in ea.Scalars("trainkit/amp/scale")] == [
        (1, 256.0), (2, 128.0), (3, 64.0), (4, 64.0)]
    tk.unpatch(opt)


def test_a_second_optimizer_files_its_scale_and_skips_under_its_batch_step(tmp_path):
    """A GAN with one scaler: the discriminator steps first and counts the steps; the
    generator's amp.step goes under the step of the batch it trained on, as its update does,
    not under the next step (after the last batch, a step that never comes)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d, g = _model32(0), _model32(1)
    opt_d = tk.patch(torch.optim.SGD(d.parameters(), lr=0.1))
    opt_g = tk.patch(torch.optim.SGD(g.parameters(), lr=0.1))
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    data = [tuple(t.float() for t in b) for b in batches([4, 4, 4])]
    with tk.session(logdir=str(tmp_path), system_metrics=False):
        for i, (x, y) in enumerate(tk.patch(data)):
            for model, opt in ((d, opt_d), (g, opt_g)):
                with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                    loss = torch.nn.functional.mse_loss(model(x), y)
                if model is g and i == 1:
                    loss = loss * float("inf")  # the generator's step of batch 2 is skipped
                amp.backward(loss)
                amp.step(opt)
                opt.zero_grad()
    assert amp.skipped == 1
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    assert [p.step for p in ea.Scalars("trainkit/step_time_ms")] == [1, 2, 3]
    assert [(p.step, p.value) for p in ea.Scalars("trainkit/amp/skipped_steps")] == [
        (1, 0.0), (2, 1.0), (3, 1.0)]
    assert [(p.step, p.value) for p in ea.Scalars("trainkit/amp/scale")] == [
        (1, 256.0), (2, 128.0), (3, 128.0)]
    tk.unpatch(opt_d)
    tk.unpatch(opt_g)


def test_errors_show_a_model_or_optimizer_given_in_the_wrong_place_on_one_line():
    # A model's or optimizer's repr spans lines; the message keeps its first line, closed.
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError) as amp_err:
        with tk.autocast_scaled(scaler=opt):
            pass
    with pytest.raises(TypeError) as acc_err:
        tk.accumulate(2, model).__enter__()
    assert str(amp_err.value).startswith("autocast_scaled(scaler=SGD(...)): expected a GradScaler")
    assert str(acc_err.value).startswith("accumulate(2, optimizer=Sequential(...)): expected")
    assert "\n" not in str(amp_err.value) + str(acc_err.value)
    from trainkit._text import brief

    assert brief("x" * 200) == repr("x" * 200)[:77] + "..."
    assert brief(torch.ones(3)) == "tensor([1., 1., 1.])"

    class Broken:
        def __repr__(self):
            raise RuntimeError("no repr")

    assert brief(Broken()) == "<Broken>"
