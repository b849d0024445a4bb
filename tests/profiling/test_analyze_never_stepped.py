"""TA110 on a run whose patched optimizer never stepped (an RL loop that learns only once its
replay buffer is warm, which a short run never reached): the session records at its close which
patched optimizers stepped, so the finding says the loop did not reach optimizer.step(), instead
of asking whether the optimizer is patched."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import trainkit as tk
from trainkit.profiling.runs import load_run
from trainkit.techniques import fused


def _rl_run(logdir, warm_after):
    model = torch.nn.Linear(4, 2)
    opt = tk.patch(torch.optim.Adam(model.parameters(), lr=1e-3))
    buffer = []
    # Never warm: no step, and the close says so (its rewards all went under step 1).
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with tk.session(logdir=logdir, system_metrics=False) as s:
            for t in range(1, 13):
                buffer.append(torch.randn(4))
                if len(buffer) >= warm_after and t % 4 == 0:  # learn every 4 env steps once warm
                    model(torch.stack(buffer[-4:])).sum().backward()
                    opt.step()
                    opt.zero_grad()
                s.log("reward", float(t))
    unstepped = ["counted no step" in str(w.message) for w in said]
    assert unstepped == ([True] if warm_after > 12 else []), [str(w.message) for w in said]
    return opt


def test_a_patched_optimizer_that_never_stepped_is_named(tmp_path):
    opt = _rl_run(tmp_path, warm_after=100)  # never warm: no step
    meta = json.loads(load_run(tmp_path, tmp_path).meta["trainkit/meta/optimizers"])
    assert meta == [{"stepped": False, "type": "Adam", "module": "torch.optim.adam",
                     "fused": None, "foreach": None,
                     "impl": ["for-loop"]}]  # (its implementation: for TA104)
    (f,) = [f for f in tk.analyze(tmp_path) if f.code == "TA110"]
    assert "the patched Adam never stepped" in f.evidence, f.evidence
    assert "is the optimizer patched" not in f.evidence
    assert "replay buffer" in f.fix
    tk.unpatch(opt)


def test_an_optimizer_that_stepped_is_recorded_so_and_no_ta110(tmp_path):
    opt = _rl_run(tmp_path, warm_after=1)  # steps at t = 4, 8, 12
    meta = json.loads(load_run(tmp_path, tmp_path).meta["trainkit/meta/optimizers"])
    assert meta == [{"stepped": True, "type": "Adam", "module": "torch.optim.adam",
                     "fused": None, "foreach": None, "impl": ["for-loop"],
                     "fused_ok": "cpu" in fused._supported_devices()}]  # (for TA104)
    assert "TA110" not in [f.code for f in tk.analyze(tmp_path)]
    tk.unpatch(opt)


def test_an_optimizer_that_stepped_in_an_earlier_session_is_not_this_ones(tmp_path):
    # A first phase's optimizer, still alive and patched, stepped in its own session: the second
    # session (its optimizer not patched) gets the general advice, not "the patched SGD never
    # stepped".
    model = torch.nn.Linear(4, 2)
    first = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path / "phase1", system_metrics=False):
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            first.step()
            first.zero_grad()
    second = torch.optim.SGD(model.parameters(), lr=0.01)  # not patched
    with pytest.warns(RuntimeWarning, match="counted no step"), \
            tk.session(logdir=tmp_path / "phase2", system_metrics=False) as s:
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            second.step()
            second.zero_grad()
            s.log("loss", 1.0)
    assert json.loads(load_run(tmp_path, str(tmp_path / "phase2")).meta["trainkit/meta/optimizers"]) == []
    (f,) = [f for f in tk.analyze(tmp_path / "phase2") if f.code == "TA110"]
    assert "is the optimizer patched?" in f.evidence and "never stepped" not in f.evidence
    tk.unpatch(first)
