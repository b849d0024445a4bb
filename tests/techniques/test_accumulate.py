import copy

import pytest
import torch

import trainkit as tk
from trainkit.patch import optimizer_patch

from ._oracle import batches, big_batch_oracle, max_rel_err, model64

OPTS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTS))
def test_accumulate_equals_big_batch_with_partial_last_window(name):
    base = model64()
    data = batches([5] * 10)
    oracle = big_batch_oracle(base, OPTS[name], data, 4)
    m = copy.deepcopy(base)
    opt = OPTS[name](m.parameters())
    with tk.accumulate(4, opt) as acc:
        for x, y in data:
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert acc.steps == 3  # windows 4, 4, 2
    assert max_rel_err(m, oracle) < 1e-10
    assert optimizer_patch(opt).gate is None


def test_items_normalisation_with_uneven_micro_batches():
    base = model64()
    data = batches([3, 7, 1, 5, 4, 2, 6])
    oracle = big_batch_oracle(base, OPTS["sgd"], data, 3, reduction="items")
    m = copy.deepcopy(base)
    opt = OPTS["sgd"](m.parameters())
    with tk.accumulate(3, opt, normalize="items") as acc:
        for x, y in data:
            torch.nn.functional.mse_loss(m(x), y, reduction="sum").backward()
            acc.add_items(len(x))
            opt.step()
            opt.zero_grad()
    assert max_rel_err(m, oracle) < 1e-10


def test_zero_grad_held_inside_window_and_step_only_at_boundaries():
    m = model64()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x, y = batches([4])[0]
    with tk.accumulate(3, opt) as acc:
        before = [p.detach().clone() for p in m.parameters()]
        for i in range(2):
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
            assert acc.micro_batches == i + 1 and acc.steps == 0
            assert all(p.grad is not None for p in m.parameters())
            assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
        assert acc.boundary
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        assert acc.steps == 1 and acc.micro_batches == 0
        opt.zero_grad()
        assert all(p.grad is None for p in m.parameters())


def test_exception_discards_partial_window():
    m = model64()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    before = [p.detach().clone() for p in m.parameters()]
    x, y = batches([4])[0]
    with pytest.raises(KeyError):
        with tk.accumulate(4, opt):
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            raise KeyError("boom")
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
    assert all(p.grad is None for p in m.parameters())


def test_no_final_step_without_gradients_and_previous_gate_restored():
    m = model64()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    tk.patch(opt)
    class Outer:  # another gate (e.g. a user's): restored on exit
        def should_step(self):
            return True

        def hold_zero_grad(self):
            return False

    outer = Outer()
    optimizer_patch(opt).gate = outer
    with tk.accumulate(2, opt) as acc:
        pass
    assert acc.steps == 0
    assert optimizer_patch(opt).gate is outer
    tk.unpatch(opt)


def test_step_time_counts_only_real_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = model64()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    data = batches([4] * 10)
    with tk.session(logdir=str(tmp_path), system_metrics=False):
        tk.patch(opt)
        with tk.accumulate(4, opt):
            for x, y in tk.patch(data):
                torch.nn.functional.mse_loss(m(x), y).backward()
                opt.step()
                opt.zero_grad()
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    # 3 real steps (4, 4, 2); the first has no previous end but starts at the first batch.
    points = ea.Scalars("trainkit/step_time_ms")
    assert len(points) == 3
    assert [p.step for p in points] == [1, 2, 3]
    tk.unpatch(opt)


def _amp_window_loop(divide_by):
    """Four micro-batches under accumulate(4) + autocast_scaled(fp32); the loss divided or not."""
    import warnings

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tk.accumulate(4, opt):
            for _ in range(8):
                with tk.autocast_scaled(dtype="fp32") as amp:
                    loss = model(torch.ones(2, 3)).mean()
                if divide_by is not None:
                    loss = divide_by(loss)
                amp.backward(loss)
                amp.step(opt)
                opt.zero_grad()
    return [w for w in caught if "divided by 4" in str(w.message)]


@pytest.mark.parametrize("divide", [lambda l: l / 4, lambda l: l * 0.25, lambda l: 0.25 * l])
def test_loss_divided_by_n_again_warns_once(divide):
    found = _amp_window_loop(divide)
    assert len(found) == 1
    assert "update is 4x too small" in str(found[0].message)


@pytest.mark.parametrize("divide", [None, lambda l: l / 2, lambda l: l * 3])
def test_other_losses_do_not_warn(divide):
    assert _amp_window_loop(divide) == []
