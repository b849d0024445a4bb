import pytest
import torch

import trainkit as tk
from trainkit.patch import optimizer_patch


def _setup():
    m = torch.nn.Linear(2, 2)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


@pytest.mark.parametrize("n", [0, -1, 2.5, "4", True, None])
def test_bad_n_repeats_value_and_changes_nothing(n):
    m, opt = _setup()
    hooks = dict(m._forward_pre_hooks)
    with pytest.raises(ValueError) as e:
        with tk.accumulate(n, opt, model=m):
            pass
    msg = str(e.value)
    assert f"n={n!r}" in msg and "accumulate(4, optimizer)" in msg
    assert optimizer_patch(opt) is None and "step" not in opt.__dict__
    assert dict(m._forward_pre_hooks) == hooks


def test_as_a_decorator_it_is_refused_before_anything_changes():
    # Each call of a decorated step function was a block of its own: a window of one
    # micro-batch, stepped at once (the weights moved on every call, nothing accumulated).
    m, opt = _setup()
    with pytest.raises(TypeError, match=r"tk\.accumulate\(4, optimizer\) goes around the loop"):
        @tk.accumulate(4, opt)
        def train_step(x):
            m(x).sum().backward()
            opt.step()
            opt.zero_grad()
    assert optimizer_patch(opt) is None and "step" not in opt.__dict__
    with tk.accumulate(4, opt) as acc:  # the block as before
        for _ in range(4):
            m(torch.ones(1, 2)).sum().backward()
            opt.step()
            opt.zero_grad()
        assert acc.stepped


@pytest.mark.parametrize("bad", [torch.nn.Linear(2, 2), "sgd", None])
def test_non_optimizer(bad):
    with pytest.raises(TypeError) as e:
        with tk.accumulate(4, bad):
            pass
    assert type(bad).__name__ in str(e.value) and "torch.optim.Optimizer" in str(e.value)


def test_bad_normalize_and_model():
    m, opt = _setup()
    with pytest.raises(ValueError) as e:
        with tk.accumulate(4, opt, normalize="tokens"):
            pass
    assert "'tokens'" in str(e.value) and "'mean'" in str(e.value) and "'items'" in str(e.value)
    with pytest.raises(TypeError, match="model='m'"):
        with tk.accumulate(4, opt, model="m"):
            pass
    assert optimizer_patch(opt) is None


def test_nested_accumulate_on_same_optimizer_is_refused():
    m, opt = _setup()
    with tk.accumulate(2, opt):
        with pytest.raises(ValueError, match="already inside accumulate"):
            with tk.accumulate(4, opt):
                pass
    tk.unpatch(opt)


def test_items_mode_without_add_items_says_how():
    m, opt = _setup()
    with pytest.raises(ValueError, match="add_items"):
        with tk.accumulate(1, opt, normalize="items") as acc:
            m(torch.ones(1, 2)).sum().backward()
            opt.step()
    with pytest.raises(TypeError, match="'x'"):
        acc.add_items("x")
    tk.unpatch(opt)


@pytest.mark.parametrize("bad, err", [("3", TypeError), (True, TypeError), (-5, ValueError),
                                      (float("nan"), ValueError), (float("inf"), ValueError),
                                      (torch.ones(2), TypeError)])
def test_add_items_refuses_what_is_no_count_and_keeps_the_window(bad, err):
    m, opt = _setup()
    with tk.accumulate(2, opt, normalize="items") as acc:
        acc.add_items(4)
        acc.add_items(torch.tensor(3))  # a 0-d tensor (a mask's sum) is a count
        with pytest.raises(err) as e:
            acc.add_items(bad)
        assert "add_items(" in str(e.value) and "acc.add_items(len(y))" in str(e.value)
        assert acc.items == 7.0
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.step()
    tk.unpatch(opt)


def test_fsdp2_model_on_a_torch_without_its_end_of_backward_step_is_refused_up_front():
    """A module with FSDP2's set_requires_gradient_sync but no FSDP state to sync a partial
    window with (as on a torch whose FSDP2 lacks it): refused at entry, nothing patched."""

    class NoState(torch.nn.Linear):
        def set_requires_gradient_sync(self, sync, *, recurse=True):
            raise AssertionError("must not be reached")

    m = NoState(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(RuntimeError) as e:
        with tk.accumulate(4, opt, model=m):
            pass
    msg = str(e.value)
    assert "FSDP2" in msg and torch.__version__ in msg and "_root_post_backward_final_callback" in msg
    assert optimizer_patch(opt) is None and not m._forward_pre_hooks


def test_swapped_arguments_and_lbfgs_are_refused_and_numpy_counts_taken():
    import numpy as np

    m = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"accumulate\(SGD\(\.\.\.\), 4\): the arguments are swapped"):
        with tk.accumulate(opt, 4):
            pass
    lbfgs = torch.optim.LBFGS(m.parameters())
    with pytest.raises(TypeError, match="LBFGS evaluates its closure several times"):
        with tk.accumulate(2, lbfgs):
            pass
    assert optimizer_patch(lbfgs) is None  # refused before anything changed
    with tk.accumulate(np.int64(3), opt) as acc:
        assert acc.n == 3 and type(acc.n) is int


def test_add_items_where_windows_are_divided_by_micro_batches_is_refused():
    # normalize="items" forgotten: the items were dropped without a word, and the losses summed
    # for them (reduction="sum") divided by 2 micro-batches alone: a 5x larger update.
    m, opt = _setup()
    with tk.accumulate(2, opt) as acc:
        m(torch.ones(5, 2)).sum().backward()
        with pytest.raises(ValueError, match=r"add_items\(5\).*normalize='items'"):
            acc.add_items(5)
        assert acc.items == 0.0 and acc._adds == 0
        opt.step()
        opt.zero_grad()
    tk.unpatch(opt)


def test_add_items_after_the_step_warns_once_at_the_window_it_left_short():
    # Called after optimizer.step(), a window's last micro-batch's items count in the next
    # window: the first window was divided by 5 items for its 10 (a 2x update), said nowhere.
    m, opt = _setup()
    with pytest.warns(RuntimeWarning, match=r"called 1 time\(s\) in a window of 2") as caught:
        with tk.accumulate(2, opt, normalize="items") as acc:
            for _ in range(6):
                m(torch.ones(5, 2)).sum().backward()
                opt.step()  # the window's end: the warning points here
                opt.zero_grad()
                acc.add_items(5)
    (w,) = [w for w in caught if "add_items was called" in str(w.message)]
    assert w.filename == __file__
    tk.unpatch(opt)


def test_add_items_once_per_micro_batch_warns_nothing():
    import warnings

    m, opt = _setup()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tk.accumulate(2, opt, normalize="items") as acc:
            for _ in range(5):  # the last window short: one micro-batch, one call
                m(torch.ones(5, 2)).sum().backward()
                acc.add_items(5)
                opt.step()
                opt.zero_grad()
    assert acc.steps == 3
    tk.unpatch(opt)


def test_a_plain_step_after_a_scaled_backward_warns_at_the_step():
    # amp.backward(loss) with a GradScaler, then optimizer.step() (amp.step forgotten): the
    # window stepped on gradients scaled by the scale, without a word. (A warning, not an error:
    # with one block open, the scaled loss may still have trained another optimizer.)
    m, opt = _setup()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with pytest.warns(RuntimeWarning, match=r"Use amp\.step\(optimizer\)") as caught:
        with tk.accumulate(2, opt):
            for _ in range(4):
                with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                    loss = m(torch.ones(1, 2)).float().sum()
                amp.backward(loss)
                opt.step()  # the line the warning names
                opt.zero_grad()
    (w,) = [w for w in caught if "amp.backward" in str(w.message)]  # once a block
    assert w.filename == __file__
    tk.unpatch(opt)


def test_amp_step_at_every_micro_batch_does_not_warn():
    import warnings

    m, opt = _setup()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tk.accumulate(2, opt):
            for _ in range(3):  # a partial last window, stepped on exit through amp.step
                with tk.autocast_scaled(scaler, dtype="fp16") as amp:
                    loss = m(torch.ones(1, 2)).float().sum()
                amp.backward(loss)
                amp.step(opt)
                opt.zero_grad()
    tk.unpatch(opt)
