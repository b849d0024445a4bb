"""README, resuming: an evaluation logged after the epoch's loop and before the checkpoint (the
HuggingFace "evaluate, then save" epoch end) goes under the step in progress, N + 1, which
``s.flush()`` does not write and the resumed run drops from view; ``step=s.steps_done`` keeps it
beside its checkpoint, written by the flush and shown after the resume."""
from __future__ import annotations

import torch

import trainkit as tk
from tests.conftest import scalars


def _epoch(s, model, opt, batches):
    for b in tk.patch(batches):  # dict batches, as a collate_fn for a HF model gives
        torch.nn.functional.mse_loss(model(b["x"]), b["y"]).backward()
        opt.step()
        opt.zero_grad()


def test_an_evaluation_before_the_checkpoint_filed_under_steps_done_survives_the_resume(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [{"x": torch.randn(8, 4), "y": torch.randn(8, 2)} for _ in range(4)]
    with tk.session(logdir=tmp_path, system_metrics=False, flush_secs=1000) as s:
        tk.patch(opt)
        _epoch(s, model, opt, batches)
        s.log("eval/in_progress", 1.0)
        s.log("eval/loss", 2.0, step=s.steps_done)
        s.flush()  # before torch.save
        done = s.steps_done
        flushed = scalars(tmp_path)  # what a SIGKILL right after the checkpoint would leave
        assert flushed["eval/loss"] == [(4, 2.0)] and "eval/in_progress" not in flushed
    assert done == 4
    assert scalars(tmp_path)["eval/in_progress"] == [(5, 1.0)]
    with tk.session(logdir=tmp_path, steps_done=done, system_metrics=False) as s:
        _epoch(s, model, opt, batches)
    got = scalars(tmp_path)
    assert got["eval/loss"] == [(4, 2.0)]
    assert got.get("eval/in_progress", []) == []  # step 5 of the first session: dropped
    assert [st for st, _ in got["trainkit/step_time_ms"]] == list(range(1, 9))
