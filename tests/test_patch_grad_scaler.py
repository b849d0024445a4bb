"""A GradScaler of the user's own (``scaler.step(optimizer)``) on a patched optimizer: the same
parameters as unpatched, and its skipped steps counted as README's tags table says (no step for
a skip, except on a fused optimizer, whose step GradScaler calls anyway); only ``amp.step``
records the ``amp/*`` tags."""
from __future__ import annotations

import pytest
import torch

import trainkit as tk
from tests.conftest import cpu_fused_or_skip, scalars

SKIPPED = (1, 3)  # the iterations whose input holds an inf: GradScaler skips their step


def _run(fused, logdir=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    g = torch.Generator().manual_seed(1)
    steps = None
    session = tk.session(logdir=logdir, system_metrics=False) if logdir else None
    if session is not None:
        tk.patch(opt)
    for i in range(6):
        x = torch.randn(3, 4, generator=g)
        if i in SKIPPED:
            x[0, 0] = float("inf")
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    if session is not None:
        steps = session.step - 1
        session.close()
        tk.unpatch(opt)
    return [p.detach().clone() for p in model.parameters()], steps


@pytest.mark.parametrize("fused, counted", [(False, 6 - len(SKIPPED)), (True, 6)],
                         ids=["for-loop", "fused"])
def test_a_users_own_grad_scaler_steps_as_unpatched_and_counts_as_documented(
        tmp_path, fused, counted):
    if fused:
        cpu_fused_or_skip()
    params, steps = _run(fused, tmp_path)
    ref, _ = _run(fused)
    assert all(torch.equal(a, b) for a, b in zip(params, ref))
    assert steps == counted
    got = scalars(tmp_path)
    assert len(got["trainkit/update_ms"]) == counted
    assert not [tag for tag in got if tag.startswith("trainkit/amp/")]
