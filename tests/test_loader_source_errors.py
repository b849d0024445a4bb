"""A patched loader: a source that raises mid-pass, nested-tensor batches, attributes set on it."""
from __future__ import annotations

import time
import warnings

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import mlp
from tests.test_gpu_logic import cuda  # noqa: F401 (a fixture)
from trainkit._items import ItemsCounter


class _Broken(Exception):
    pass


def _batches(n, fail_at=None):
    for i in range(n):
        if i == fail_at:
            raise _Broken("a corrupt record")
        yield torch.randn(4, 8), torch.randint(0, 3, (4,))


def test_a_source_that_raises_mid_pass_ends_the_step_in_progress_and_the_error_goes_on(tmp_path):
    # An evaluation (its batches are the steps) whose source fails at its 4th batch: the error
    # reaches the loop unchanged, and the 3rd batch's step ends where the failing wait began, as
    # at a pass's end. It stayed open: the handler's pause and the next pass's first batch were
    # in it (one step of 2 batches, ~300 ms long).
    model = mlp()
    raised = _Broken("a corrupt record")
    with tk.session(logdir=tmp_path, system_metrics=False):
        with torch.no_grad():
            with pytest.raises(_Broken) as info:
                for x, _ in tk.patch(_batches(5, fail_at=3)):
                    model(x)
            assert info.value.args == raised.args
            time.sleep(0.3)  # the handler's work (a log line, a retry's set-up)
            for x, _ in tk.patch(_batches(2)):
                model(x)
    got = scalars(tmp_path)
    times = dict(got["trainkit/step_time_ms"])
    assert sorted(times) == [1, 2, 3, 4, 5]
    assert times[3] < 150
    items = [round(v * times[st] / 1e3, 2) for st, v in got["trainkit/samples_per_s"]]
    assert items == [4.0] * 5



def test_on_a_gpu_a_source_raising_over_a_sticky_cuda_error_ends_the_step_at_its_wait(
        tmp_path, cuda):
    # The same on a GPU (CUDA stand-ins): the step ends at the event recorded as the failing wait
    # began, none recorded after it (a CUDA error that sticks would raise again over the user's).
    model = mlp()

    def failing():
        yield from _batches(3)
        cuda.fail = True
        raise _Broken("collate failed on the device")

    with torch.no_grad(), tk.session(logdir=tmp_path, system_metrics=False):
        with pytest.raises(_Broken, match="collate failed"):
            for x, _ in tk.patch(failing()):
                model(x)
        time.sleep(0.3)  # the handler's work: no step's
    times = dict(scalars(tmp_path)["trainkit/step_time_ms"])
    assert sorted(times) == [1, 2, 3] and times[3] < 150


def test_a_value_logged_after_the_source_raised_goes_under_the_step_in_progress(tmp_path):
    # As after a loop that ran out: not under the last batch's step, which has ended.
    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        try:
            for x, y in tk.patch(_batches(5, fail_at=3)):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
        except _Broken:
            s.log("failed", 1.0)
        for x, y in tk.patch(_batches(1)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    assert [st for st, _ in got["failed"]] == [4]


def test_a_batch_of_strided_nested_tensors_counts_its_items(tmp_path):
    # A strided nested tensor has no .shape (torch raises "NestedTensorImpl doesn't support
    # sizes"): the loop died on its first batch. Its size(0) is the batch's items.
    warnings.filterwarnings("ignore", "The PyTorch API of nested tensors", UserWarning)

    def batches():
        for _ in range(3):
            x = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(4, 8), torch.randn(1, 8)])
            yield x, torch.randint(0, 3, (3,))

    model = mlp()
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x, y in tk.patch(batches()):
            out = torch.stack([model(t).mean(0) for t in x.unbind()])
            torch.nn.functional.cross_entropy(out, y).backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    times = dict(got["trainkit/step_time_ms"])
    items = [round(v * times[st] / 1e3, 2) for st, v in got["trainkit/samples_per_s"]]
    assert items == [3.0] * 3
    count = ItemsCounter()
    nested = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(1, 8)])
    assert [count(nested), count(nested), count({"x": nested}), count({"x": nested})] == [2] * 4


class _EpochLoader:
    """Shuffles with its ``epoch`` as the seed, which the loop sets (as with set_epoch)."""

    def __init__(self) -> None:
        self.epoch = 0

    def __iter__(self):
        return iter(torch.randperm(6, generator=torch.Generator().manual_seed(self.epoch)).tolist())


def test_an_attribute_set_on_a_patched_loader_is_set_on_its_source():
    # It was set on the wrapper: the source never saw the new epoch, and every epoch had the
    # first one's order, silently.
    plain, source = _EpochLoader(), _EpochLoader()
    patched = tk.patch(source)
    for epoch in range(3):
        plain.epoch = patched.epoch = epoch
        assert list(patched) == list(plain)
    assert source.epoch == 2 and "epoch" not in vars(patched)
    del patched.epoch
    assert not hasattr(source, "epoch")
    assert tk.unpatch(patched) is source
