"""A patched loader's pass run inside the body of another's (a validation every N training
steps): what the body logs after it goes under the training batch's step, as it does when the
validation loader is not patched. It went under the next step, and the last validation's values
under a step the run never had."""
from __future__ import annotations

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars


def _run(logdir, patch_val, *, val_batches=4, break_after=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(8)]
    val = [(torch.randn(16, 4), torch.randn(16, 2)) for _ in range(val_batches)]
    with tk.session(logdir=logdir, system_metrics=False) as s:
        tk.patch(opt)
        for i, (x, y) in enumerate(tk.patch(train), start=1):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            s.log("lr", 0.1)
            if i % 4 == 0:
                with torch.no_grad():
                    for j, (vx, vy) in enumerate(tk.patch(val) if patch_val else val):
                        if j == break_after:
                            break
                        model(vx)
                s.log("val_at", float(i))
    return scalars(logdir)


@pytest.mark.parametrize("val_batches, break_after", [(4, None), (4, 1), (0, None)])
def test_values_logged_after_a_nested_validation_pass_go_with_the_training_batch(
        tmp_path, val_batches, break_after):
    plain = _run(tmp_path / "plain", False, val_batches=val_batches, break_after=break_after)
    got = _run(tmp_path / "patched", True, val_batches=val_batches, break_after=break_after)
    assert plain["val_at"] == [(4, 4.0), (8, 8.0)]
    assert got["val_at"] == plain["val_at"]
    steps = [st for st, _ in got["trainkit/step_time_ms"]]
    assert steps == list(range(1, 9))
    # the last validation's waits still go to the step in progress, as README says (a
    # data_wait_ms point with no step time when nothing follows); the values, not past step 8
    assert max(st for tag in ("lr", "val_at") for st, _ in got[tag]) == 8


def test_after_an_inner_loop_that_trained_values_go_under_the_step_in_progress(tmp_path):
    # Unchanged: an inner patched loop that steps the optimizer ends the outer batch's steps.
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outer = [torch.randn(8, 4) for _ in range(2)]
    inner = [torch.randn(8, 4) for _ in range(3)]
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        tk.patch(opt)
        for x in tk.patch(outer):
            for z in tk.patch(inner):
                model(z).sum().backward()
                opt.step()
                opt.zero_grad()
            s.log("after_inner", 1.0)
    assert [st for st, _ in scalars(tmp_path)["after_inner"]] == [4, 7]


def _slow(n, sleep_s=0.02):
    import time

    for _ in range(n):
        time.sleep(sleep_s)
        yield torch.randn(4, 2)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("wrap", [
    lambda g: tk.patch(iter(tk.patch(g))),
    lambda g: (x for _, x in tk.patch(enumerate(tk.patch(g)))),
    lambda g: tk.patch(map(torch.neg, tk.patch(g))),
])
def test_a_patched_loader_wrapped_in_another_is_recorded_once(tmp_path, wrap, training):
    # A patched loader inside another one (through enumerate, map, a generator of one's own):
    # the outer wait holds the inner one, and each counted the wait and the items, so the
    # data wait (~40 ms) came out longer than the step (~21 ms) and samples_per_s doubled.
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False), torch.set_grad_enabled(training):
        if training:
            tk.patch(opt)
        for x in wrap(_slow(5)):
            if training:
                (x @ p).sum().backward()
                opt.step()
                opt.zero_grad()
    got = scalars(tmp_path)
    waits, times = dict(got["trainkit/data_wait_ms"]), dict(got["trainkit/step_time_ms"])
    assert sorted(times) == [1, 2, 3, 4, 5]
    for step, t in times.items():
        assert 18 <= waits[step] <= t, (step, waits[step], t)
        rate = dict(got["trainkit/samples_per_s"])[step]
        assert rate == pytest.approx(4 / (t / 1e3), rel=1e-3)  # 4 items a step, not 8
