"""tk.analyze on a run whose every step the GradScaler skipped (inf/nan gradients): the optimizer
was patched and called; TA110 must say what happened, not ask whether it was patched."""
from __future__ import annotations

import torch

import trainkit as tk
from tests.helpers import loader, mlp


def test_a_run_whose_steps_were_all_skipped_is_told_so(tmp_path):
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler = torch.amp.GradScaler("cpu", init_scale=1e30)  # fp16 gradients overflow at every step
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x, y in tk.patch(loader(n=32, batch_size=8)):
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                loss = torch.nn.functional.cross_entropy(model(x), y)
            amp.backward(loss)
            amp.step(opt)
            opt.zero_grad()
    assert amp.skipped == 4
    (finding,) = [f for f in tk.analyze(tmp_path) if f.code == "TA110"]
    assert "skipped" in finding.evidence and "4" in finding.evidence, finding.evidence
    assert "is the optimizer patched" not in finding.evidence
    assert "GradScaler" in finding.fix
