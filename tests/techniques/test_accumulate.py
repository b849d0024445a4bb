import copy

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from trainkit.patch import optimizer_patch

from ._oracle import batches, big_batch_oracle, max_rel_err, model64, windows_oracle

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


def _norm(grads):
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()


@pytest.mark.parametrize("name", sorted(OPTS))
def test_clip_grad_norm_clips_each_window_as_the_big_batch(name):
    # The clip is active at every step (max norm below every window's norm), the last window
    # is partial (4, 4, 2): each window's divided gradient is clipped once, as after a big batch.
    base = model64()
    data = batches([5] * 10)
    oracle = big_batch_oracle(base, OPTS[name], data, 4, clip=0.05)
    unclipped = big_batch_oracle(base, OPTS[name], data, 4)
    m = copy.deepcopy(base)
    opt = OPTS[name](m.parameters())
    norms = []
    with tk.accumulate(4, opt, clip_grad_norm=0.05) as acc:
        # Each real step sees the window's gradient clipped (the exit's step of the partial
        # window too, after which the held zero_grad() clears it).
        opt.register_step_pre_hook(lambda *_: norms.append(
            (acc.grad_norm.item(), _norm([p.grad for p in m.parameters()]))))
        for x, y in data:
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert acc.steps == 3 and len(norms) == 3
    assert max_rel_err(m, oracle) < 1e-10
    assert max_rel_err(m, unclipped) > 1e-3  # the clip was not a no-op
    assert all(before > 0.05 and abs(after - 0.05) < 1e-6 for before, after in norms), norms


def test_clipping_by_hand_inside_the_window_differs_from_the_big_batch():
    # What clip_grad_norm= exists for: a clip_grad_norm_ before optimizer.step() clips the
    # running undivided sum at every micro-batch, which is not the big batch's clip.
    base = model64()
    data = batches([5] * 8)
    oracle = big_batch_oracle(base, OPTS["sgd"], data, 4, clip=0.05)
    m = copy.deepcopy(base)
    opt = OPTS["sgd"](m.parameters())
    with tk.accumulate(4, opt):
        for x, y in data:
            torch.nn.functional.mse_loss(m(x), y).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
            opt.step()
            opt.zero_grad()
    assert max_rel_err(m, oracle) > 1e-3


def test_clip_grad_norm_under_a_grad_scaler_sees_the_unscaled_gradient():
    # fp16 autocast on the CPU leaves float64 ops alone, so the GradScaler (scale 1024) is the one
    # difference from the oracle: each window (4, 4, 2) is unscaled, divided, then clipped.
    base = model64()
    data = batches([5] * 10)
    oracle = big_batch_oracle(base, OPTS["sgd"], data, 4, clip=0.05)
    m = copy.deepcopy(base)
    opt = OPTS["sgd"](m.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    norms = []
    with tk.accumulate(4, opt, clip_grad_norm=0.05) as acc:
        for x, y in data:
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                loss = torch.nn.functional.mse_loss(m(x), y)
            assert amp._scaling()
            amp.backward(loss)
            amp.step(opt)
            if acc.micro_batches == 0:
                norms.append(acc.grad_norm.item())
            opt.zero_grad()
    norms.append(acc.grad_norm.item())
    assert acc.steps == 3 and amp.skipped == 0
    assert max_rel_err(m, oracle) < 1e-10
    assert all(0.05 < n < 10 for n in norms), norms  # the true norms, not 1024x them


def test_users_scaler_step_at_window_ends_is_refused():
    # Stepping the user's GradScaler only at a window's end still breaks: a skipped step never
    # closes the window, and the exit's step of a partial window would use scaled gradients.
    m = model64()
    opt = OPTS["sgd"](m.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = batches([5])[0]
    with pytest.raises(RuntimeError, match=r"even at a window's end.*amp\.step"):
        with tk.accumulate(2, opt) as acc:
            for _ in range(3):
                scaler.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
                if acc.boundary:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                opt.zero_grad()
    assert acc.steps == 0
    tk.unpatch(opt)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1.0", 2 ** 1024,
                                 torch.tensor([1.0, 2.0]), torch.tensor(1), None.__class__])
def test_clip_grad_norm_must_be_a_positive_number(bad):
    m = model64()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"clip_grad_norm=.*e\.g\. clip_grad_norm=1\.0"):
        with tk.accumulate(2, opt, clip_grad_norm=bad):
            pass
    assert optimizer_patch(opt) is None  # refused before anything changed
    with tk.autocast_scaled(dtype="fp32") as amp:
        loss = m(torch.ones(1, 6, dtype=torch.float64)).sum()
    amp.backward(loss)
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(ValueError, match=r"amp\.step\(optimizer, \.\.\.\): clip_grad_norm="):
        amp.step(opt, clip_grad_norm=bad)
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))


def test_clip_grad_norm_takes_numpy_numbers_and_a_tensor():
    import numpy as np

    for max_norm in (np.float32(0.25), np.int64(1), torch.tensor(0.25)):
        opt = OPTS["sgd"](model64().parameters())
        with tk.accumulate(2, opt, clip_grad_norm=max_norm) as acc:
            assert acc.clip_grad_norm == float(max_norm) and type(acc.clip_grad_norm) is float
        tk.unpatch(opt)


def test_clip_in_both_accumulate_and_amp_step_is_refused():
    m = model64()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with tk.accumulate(2, opt, clip_grad_norm=1.0) as acc:
        with tk.autocast_scaled(dtype="fp32") as amp:
            loss = m(torch.ones(1, 6, dtype=torch.float64)).sum()
        amp.backward(loss)
        with pytest.raises(ValueError, match="clip once"):
            amp.step(opt, clip_grad_norm=1.0)
        assert acc.micro_batches == 0
        opt.zero_grad()
    tk.unpatch(opt)


def test_items_forgotten_is_refused_before_the_window_changes():
    # The window's end finds no items: refused with nothing divided, so counting them and
    # stepping again gives the oracle's step.
    base = model64()
    data = batches([3, 7])
    oracle = big_batch_oracle(base, OPTS["sgd"], data, 2, reduction="items")
    m = copy.deepcopy(base)
    opt = OPTS["sgd"](m.parameters())
    with tk.accumulate(2, opt, normalize="items") as acc:
        for x, y in data:
            torch.nn.functional.mse_loss(m(x), y, reduction="sum").backward()
            if acc.boundary:
                with pytest.raises(ValueError, match="no items were counted"):
                    opt.step()
                acc.add_items(3)  # each micro-batch's (one call for the window warns)
                acc.add_items(7)
            opt.step()
            opt.zero_grad()
    assert acc.steps == 1
    assert max_rel_err(m, oracle) < 1e-10


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


@pytest.mark.parametrize("name", sorted(OPTS))
@pytest.mark.parametrize("zero_first", [False, True], ids=["zero_grad_last", "zero_grad_first"])
def test_a_block_per_epoch_with_a_partial_last_window_equals_the_big_batches(name, zero_first):
    # The exit's step of a partial window does the zero_grad() the loop asked for after its
    # last micro-batch (held while the window was open): the next block starts clean. Before,
    # that window's gradient was added into the next epoch's first window.
    base = model64()
    data = batches([5] * 5)
    oracle = windows_oracle(base, OPTS[name], [data[0:2], data[2:4], data[4:5]] * 2)
    m = copy.deepcopy(base)
    opt = OPTS[name](m.parameters())
    for _epoch in range(2):
        with tk.accumulate(2, opt) as acc:
            for x, y in data:
                if zero_first:
                    opt.zero_grad()
                torch.nn.functional.mse_loss(m(x), y).backward()
                opt.step()
                if not zero_first:
                    opt.zero_grad()
        assert acc.steps == 3
        if not zero_first:
            assert all(p.grad is None for p in m.parameters())
    assert max_rel_err(m, oracle) < 1e-10


def test_the_exits_step_keeps_the_held_zero_grads_arguments():
    m = model64()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x, y = batches([4])[0]
    with tk.accumulate(2, opt):
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in m.parameters())


def test_closure_steps_accumulate_as_the_big_batch(tmp_path):
    # Each step(closure) call is a micro-batch: the closure runs at every call (before, it was
    # skipped between window ends, while the divisor still counted it), and returns its loss.
    base = model64()
    data = batches([5] * 6)
    oracle = big_batch_oracle(base, OPTS["sgd"], data, 4, clip=0.05)
    m = copy.deepcopy(base)
    opt = OPTS["sgd"](m.parameters())
    calls, losses = [], []
    with tk.session(logdir=tmp_path, system_metrics=False):
        with tk.accumulate(4, opt, clip_grad_norm=0.05) as acc:
            for x, y in data:
                def closure(x=x, y=y):
                    opt.zero_grad()
                    loss = torch.nn.functional.mse_loss(m(x), y)
                    loss.backward()
                    calls.append(1)
                    return loss
                losses.append(opt.step(closure))
    assert len(calls) == 6 and acc.steps == 2
    assert all(isinstance(v, torch.Tensor) for v in losses)
    assert max_rel_err(m, oracle) < 1e-10
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/closure_ms"]] == [1, 2]


def test_exception_after_a_windows_first_backward_discards_its_gradient():
    m = model64()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    data = batches([4] * 3)
    with pytest.raises(KeyError):
        with tk.accumulate(2, opt):
            for i, (x, y) in enumerate(data):
                torch.nn.functional.mse_loss(m(x), y).backward()
                if i == 2:  # the first micro-batch of the second window: no step() call yet
                    raise KeyError("boom")
                opt.step()
                opt.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_model_zero_grad_is_held_too_when_the_model_is_named():
    # model.zero_grad() is a common spelling; inside a window it would wipe the running sum.
    base = model64()
    data = batches([5] * 5)
    oracle = big_batch_oracle(base, OPTS["adam"], data, 2)
    m = copy.deepcopy(base)
    opt = OPTS["adam"](m.parameters())
    with tk.accumulate(2, opt, model=m) as acc:
        for x, y in data:
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            m.zero_grad()
    assert acc.steps == 3 and max_rel_err(m, oracle) < 1e-10
    assert all(p.grad is None for p in m.parameters())  # the partial window's, after its step
    assert "zero_grad" not in m.__dict__  # the model's own method again
    x, y = data[0]
    torch.nn.functional.mse_loss(m(x), y).backward()
    m.zero_grad()
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
    optimizer_patch(opt).gate = None  # the outer context's end (unpatch is refused under a gate)
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


@pytest.mark.parametrize("loss_of", [
    lambda out, y: torch.nn.functional.mse_loss(out, y, reduction="sum") / out.shape[0],
    lambda out, y: (out - y).pow(2).sum() / len(out),
])
def test_a_sum_over_a_micro_batch_of_n_items_divided_by_them_does_not_warn(loss_of):
    # A per-sample mean written by hand, on micro-batches of exactly n items: it looks like
    # "loss / n", and the warning told the user to drop the division (a 4x too large update).
    import warnings

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tk.accumulate(4, opt):
            for _ in range(8):
                with tk.autocast_scaled(dtype="fp32") as amp:
                    loss = loss_of(model(torch.ones(4, 3)), torch.zeros(4, 1))
                amp.backward(loss)
                amp.step(opt)
                opt.zero_grad()
    tk.unpatch(opt)


def _two_losses_loop(weight_ce, weight_aux):
    """Two losses, two amp.backward calls a micro-batch (retain_graph), under accumulate(2)."""
    import warnings

    body, head, aux = torch.nn.Linear(3, 4), torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    opt = torch.optim.SGD([*body.parameters(), *head.parameters(), *aux.parameters()], lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tk.accumulate(2, opt):
            for _ in range(4):
                with tk.autocast_scaled(dtype="fp32") as amp:
                    h = body(torch.ones(2, 3))
                    ce, extra = head(h).mean(), aux(h).pow(2).mean()
                amp.backward(weight_ce(ce), retain_graph=True)
                amp.backward(weight_aux(extra))
                amp.step(opt)
                opt.zero_grad()
    return [w for w in caught if "divided by 2" in str(w.message)]


def test_a_second_loss_weighted_by_1_over_n_is_no_loss_divided_by_n():
    # amp.backward(0.5 * aux) under accumulate(2): the aux loss's weight, not a division by the
    # window. It warned "the update is 2x too small" about a correct loop.
    assert _two_losses_loop(lambda l: l, lambda l: 0.5 * l) == []
    assert _two_losses_loop(lambda l: l / 2, lambda l: l) == []
    both = _two_losses_loop(lambda l: l / 2, lambda l: l * 0.5)  # every loss divided: the mistake
    assert len(both) == 1 and both[0].filename == __file__  # said at the user's step() call


def test_acc_stepped_steps_a_scheduler_once_per_window_as_the_big_batch_does():
    """``if acc.stepped: scheduler.step()``: the LR moves once per real step (windows 4, 4, 2),
    as in the big-batch loop; at every micro-batch it would fall 4x too fast."""
    base = model64()
    data = batches([5] * 10)
    ref = copy.deepcopy(base)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    for i in range(0, len(data), 4):
        window = data[i:i + 4]
        ref_opt.zero_grad()
        x, y = torch.cat([w[0] for w in window]), torch.cat([w[1] for w in window])
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_sched.step()

    m = copy.deepcopy(base)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    seen = []
    with tk.accumulate(4, opt) as acc:
        assert acc.stepped is False
        for x, y in data:
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
            seen.append(acc.stepped)
            if acc.stepped:
                sched.step()
    assert seen == [False, False, False, True] * 2 + [False, False]
    assert acc.steps == 3 and sched.last_epoch == 2  # the exit's step of the partial window: after the loop
    assert max_rel_err(m, ref) < 1e-10


def test_acc_stepped_after_a_window_whose_amp_step_was_skipped():
    m = model64().float()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    x, y = (t.float() for t in batches([4])[0])
    seen = []
    with tk.accumulate(2, opt) as acc:
        for i in range(4):
            with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                loss = torch.nn.functional.mse_loss(m(x), y)
            if i == 1:
                loss = loss * float("inf")
            amp.backward(loss)
            seen.append((amp.step(opt), acc.stepped))
            opt.zero_grad()
    # the skipped window ended all the same: a scheduler steps there, as in a plain AMP loop
    assert seen == [(True, False), (False, True), (True, False), (True, True)]
    assert acc.steps == 1 and amp.skipped == 1


@pytest.mark.parametrize("n_batches", [9, 10])
def test_acc_stepped_after_the_block_says_whether_its_exit_stepped_a_short_last_window(n_batches):
    """A block per epoch (as accelerate syncs at the end of each pass): after the block,
    ``if acc.stepped: scheduler.step()`` steps the scheduler for the exit's step of a short last
    window, and only then. Before, ``acc.stepped`` kept the last call's answer, True also when the
    last window was full and the exit did not step: the scheduler stepped twice for one update."""
    data = batches([5] * n_batches)
    windows = [data[i:i + 3] for i in range(0, len(data), 3)] * 2  # two epochs
    ref = model64()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    base = copy.deepcopy(ref)
    for window in windows:
        ref_opt.zero_grad()
        for x, y in window:
            torch.nn.functional.mse_loss(ref(x), y).backward()
        for p in ref.parameters():
            p.grad /= len(window)
        ref_opt.step()
        ref_sched.step()

    m = base
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    after = []
    for epoch in range(2):
        with tk.accumulate(3, opt) as acc:
            for x, y in data:
                torch.nn.functional.mse_loss(m(x), y).backward()
                opt.step()
                opt.zero_grad()
                if acc.stepped:
                    sched.step()
        after.append(acc.stepped)
        if acc.stepped:  # the exit stepped a short last window
            sched.step()
    assert after == [n_batches % 3 != 0] * 2
    assert sched.last_epoch == ref_sched.last_epoch == len(windows)
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    assert max_rel_err(m, ref) < 1e-10


def test_unpatch_inside_the_block_is_refused_and_the_windows_still_equal_the_big_batch():
    # Unpatched mid-block, the optimizer stepped at every micro-batch on undivided sums (6 steps
    # where 2), and the block's exit stepped again: nothing said.
    base = model64()
    data = batches([5] * 8)
    oracle = big_batch_oracle(base, OPTS["sgd"], data, 4)
    m = copy.deepcopy(base)
    opt = OPTS["sgd"](m.parameters())
    with tk.accumulate(4, opt) as acc:
        for i, (x, y) in enumerate(data):
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
            if i == 1:
                with pytest.raises(ValueError, match=r"unpatch\(.*\) inside tk.accumulate.*"
                                                     r"unpatch after the block"):
                    tk.unpatch(opt)
    assert acc.steps == 2 and max_rel_err(m, oracle) < 1e-10
    assert optimizer_patch(opt) is not None
    tk.unpatch(opt)  # after the block
    assert optimizer_patch(opt) is None
