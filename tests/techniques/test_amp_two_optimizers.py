"""amp.step on two optimizers of one backward: one GradScaler update per backward, as torch's."""
from __future__ import annotations

import copy

import torch

import trainkit as tk


def _pair() -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    ref = copy.deepcopy(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model[0], model[1])]
    refs = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref[0], ref[1])]
    return model, ref, opts, refs


def test_two_optimizers_on_one_backward_are_unscaled_by_the_scale_it_used() -> None:
    model, ref, opts, refs = _pair()
    # growth_interval=1: every update doubles the scale (a default one does every 2000 steps)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
    x = torch.randn(10, 6)
    for _ in range(3):
        with tk.autocast_scaled(scaler, dtype="fp16") as amp:
            loss = model(x).pow(2).mean()
        amp.backward(loss)
        assert amp.step(opts[0]) and amp.step(opts[1])
        for o in opts:
            o.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):  # torch's recipe: one update
            ref_loss = ref(x).pow(2).mean()
        ref_scaler.scale(ref_loss).backward()
        for o in refs:
            ref_scaler.step(o)
        ref_scaler.update()
        for o in refs:
            o.zero_grad()
        assert scaler.get_scale() == ref_scaler.get_scale()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)  # the second one's update was halved


def test_a_backward_per_optimizer_still_updates_after_each() -> None:
    """A GAN's loop: backward, step; backward, step; each backward used the scale in force."""
    model, ref, opts, refs = _pair()
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
    x = torch.randn(10, 6)
    for _ in range(2):
        for o in opts:
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                loss = model(x).pow(2).mean()
            amp.backward(loss)
            amp.step(o)
            model.zero_grad()
    assert scaler.get_scale() == 256.0 * 2 ** 4
