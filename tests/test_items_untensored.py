"""Items of empty batches: an empty batch (first tensor of size 0) counts 0 items, and its step's
samples/s is 0, not a point left out."""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from trainkit import recorder
from trainkit.recorder import BATCH_REC, STEP_REC
from tests.conftest import scalars
from tests.helpers import items_per_step
from tests.test_speedups import needs_c, run_script

both_writers = pytest.mark.parametrize("use_c", [pytest.param(True, marks=needs_c), False],
                                       ids=["C", "Python"])


def _items(logdir) -> dict:
    got = scalars(logdir)
    steps = dict(got["trainkit/step_time_ms"])
    return {st: round(v * steps[st] / 1e3) for st, v in got.get("trainkit/samples_per_s", [])}


# ---- empty batches --------------------------------------------------------------------------

@both_writers
def test_an_empty_batch_is_0_items_for_its_step(tmp_path, monkeypatch, use_c):
    monkeypatch.setattr(recorder, "_fast", recorder._fast if use_c else None)
    batches = [(torch.zeros(4, 8),), (torch.zeros(0, 8),), (torch.zeros(3, 8),),
               {"x": torch.zeros(0, 2)}, [torch.zeros(0, 3, dtype=torch.long)] * 2]
    assert items_per_step(tmp_path, batches) == {1: 4, 2: 0, 3: 3, 4: 0, 5: 0}
    got = dict(scalars(tmp_path)["trainkit/samples_per_s"])
    assert got[2] == got[4] == got[5] == 0.0


@both_writers
def test_an_empty_batch_in_training_is_a_step_of_0_samples_per_s(tmp_path, monkeypatch, use_c):
    monkeypatch.setattr(recorder, "_fast", recorder._fast if use_c else None)
    model = torch.nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.zeros(b, 8) for b in (4, 0, 4, 0, 2)]
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        with tk.accumulate(2, opt):  # windows of 4 + 0, 4 + 0, 2
            for x in tk.patch(batches):
                model(x).sum().backward()
                time.sleep(0.002)
                opt.step()
                opt.zero_grad()
        for x in tk.patch(batches):
            model(x).sum().backward()
            time.sleep(0.002)
            opt.step()
            opt.zero_grad()
    assert _items(tmp_path) == {1: 4, 2: 4, 3: 2, 4: 4, 5: 0, 6: 4, 7: 0, 8: 2}


@both_writers
def test_0_items_over_a_step_of_no_time_is_no_point_and_no_error(tmp_path, monkeypatch, use_c):
    script = [("rec", (BATCH_REC, 1, 0.0, 0.001, 0)), ("rec", (STEP_REC, 1, 0.002, 0.003, None)),
              ("done", None),
              ("rec", (BATCH_REC, 2, 0.003, 0.003, 0)), ("rec", (STEP_REC, 2, 0.003, 0.003, 0.003)),
              ("done", None),
              ("rec", (BATCH_REC, 3, 0.003, 0.004, 0)), ("rec", (STEP_REC, 3, 0.004, 0.005, 0.003)),
              ("done", None), ("flush", (True, 0))]
    run_script(str(tmp_path), script, use_c, monkeypatch)
    got = scalars(str(tmp_path))
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [2, 3]  # step 2's is 0 ms
    assert got["trainkit/samples_per_s"] == [(3, 0.0)]
