import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainkit as tk
from trainkit import switches
from trainkit.patch import optimizer_patch
from trainkit.techniques import fused


def _params():
    return [torch.nn.Parameter(torch.randn(3, 3))]


def test_fused_override_sets_and_unpatch_restores():
    if "cpu" not in fused._supported_devices():
        pytest.skip("fused optimizer kernels on the CPU need torch >= 2.4")
    opt = torch.optim.Adam(_params(), lr=0.1, foreach=True)
    with switches.overrides({"fused": True}):
        tk.patch(opt)
    assert opt.param_groups[0]["fused"] is True and opt.param_groups[0]["foreach"] is False
    assert opt.defaults["fused"] is True and opt._step_supports_amp_scaling is True
    opt.param_groups[0]["params"][0].grad = torch.ones(3, 3)
    opt.step()  # the fused CPU kernel runs
    tk.unpatch(opt)
    assert opt.param_groups[0]["fused"] is None and opt.param_groups[0]["foreach"] is True
    assert "_step_supports_amp_scaling" not in opt.__dict__


def test_fused_left_alone_without_override_or_where_invalid():
    opt = torch.optim.Adam(_params(), lr=0.1)
    tk.patch(opt)
    assert opt.param_groups[0]["fused"] is None
    tk.unpatch(opt)
    rms = torch.optim.RMSprop(_params(), lr=0.1)  # no fused option
    with switches.overrides({"fused": True}):
        tk.patch(rms)
    assert "fused" not in rms.param_groups[0]
    tk.unpatch(rms)


def test_set_to_none_technique_drives_zero_grad():
    opt = torch.optim.SGD(_params(), lr=0.1)
    p = opt.param_groups[0]["params"][0]
    with switches.overrides({"set_to_none": False}):
        tk.patch(opt)
    assert optimizer_patch(opt).set_to_none is False
    p.grad = torch.ones(3, 3)
    opt.zero_grad()
    assert p.grad is not None and p.grad.abs().sum() == 0
    tk.unpatch(opt)


def test_num_workers_override_rebuilds_an_equivalent_loader():
    ds = TensorDataset(torch.arange(10.0))
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(ds, batch_size=3, shuffle=True, drop_last=True, generator=g)
    plain = tk.patch(loader)
    assert plain.source is loader  # no override: the same loader
    with switches.overrides({"num_workers": 1}):
        patched = tk.patch(loader)
    assert patched.source is not loader and patched.num_workers == 1
    assert patched.batch_sampler is loader.batch_sampler  # drop_last lives in it
    # ...and the rebuilt loader reports the user's settings, not DataLoader's for a batch_sampler
    assert (patched.batch_size, patched.drop_last, len(patched)) == (3, True, 3)
    # ...and its sampler is the user's (a DistributedSampler's set_epoch must reach it)
    assert patched.sampler is loader.sampler
    assert tk.unpatch(patched) is loader  # the user's loader comes back, not the rebuilt one
    torch.manual_seed(0)
    got = [b[0].tolist() for b in patched]
    assert len(got) == 3 and sorted(sum(got, [])) != list(range(9))  # shuffled, 9 of 10 kept
    assert all(len(b) == 3 for b in got)


def test_backend_flags_set_by_override_and_restored_on_close(tmp_path):
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
              torch.backends.cudnn.benchmark)
    with switches.overrides({"tf32": not before[0], "cudnn_benchmark": not before[2]}):
        with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
            assert torch.backends.cuda.matmul.allow_tf32 is (not before[0])
            assert torch.backends.cudnn.benchmark is (not before[2])
            assert s.techniques["tf32"] is (not before[0])
    after = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.benchmark)
    assert after == before


def test_backend_flags_untouched_without_override(tmp_path):
    from trainkit.techniques import backends

    with tk.session(logdir=str(tmp_path), system_metrics=False) as s:
        assert backends.apply(s) == {}
        assert "tf32" not in s.techniques
        assert backends.apply(s, cudnn_benchmark=True) == {"cudnn_benchmark": True}
        assert torch.backends.cudnn.benchmark is True
    assert torch.backends.cudnn.benchmark is False


@pytest.mark.parametrize("given", ["none", "closed"])
def test_backend_flags_are_not_set_for_no_session_or_a_closed_one(tmp_path, given):
    # The flags are process-wide: apply(None, ...) set them, then failed (AttributeError), and
    # apply(closed_session, ...) set them for good (its close had run): both left them on.
    from trainkit.techniques import backends

    before = torch.backends.cudnn.benchmark
    session = None
    if given == "closed":
        with tk.session(logdir=tmp_path, system_metrics=False) as session:
            pass
    error = TypeError if given == "none" else ValueError
    with pytest.raises(error, match="tk.session" if given == "none" else "closed"):
        backends.apply(session, cudnn_benchmark=not before)
    assert torch.backends.cudnn.benchmark is before
    if given == "closed":
        with pytest.raises(ValueError, match="the session is closed"):
            session.on_close(lambda: None)


def test_channels_last_helper_and_switch():
    x = torch.randn(2, 3, 4, 5)
    assert tk.channels_last(x).is_contiguous(memory_format=torch.channels_last)
    with switches.overrides({"channels_last": False}):
        assert tk.channels_last(x) is x
    conv = torch.nn.Conv2d(3, 4, 3)
    assert tk.channels_last(conv).weight.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(TypeError, match="'nope'"):
        tk.channels_last("nope")
