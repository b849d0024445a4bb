"""A model named with ``tk.accumulate(n, optimizer, model=model)`` copies and pickles as the
model it is, inside the block: a best-so-far snapshot (``copy.deepcopy(model)``), an EMA made in
the loop, ``torch.save(model, path)`` mid-run. The block's held ``zero_grad`` and its forward
pre-hook (what it adds to the model's ``__dict__``) stay with the model they were put on."""
from __future__ import annotations

import copy
import io

import torch

import trainkit as tk

from ._oracle import batches, big_batch_oracle, max_rel_err, model64

F = torch.nn.functional


def _sgd(ps):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9)


def test_torch_save_of_the_model_inside_the_block():
    # It raised "Can't pickle local object '_held_zero_grad.<locals>.held'".
    m = model64()
    opt = _sgd(m.parameters())
    x, y = batches([4])[0]
    with tk.accumulate(4, opt, model=m):
        F.mse_loss(m(x), y).backward()
        opt.step()
        f = io.BytesIO()
        torch.save(m, f)
        f.seek(0)
        loaded = torch.load(f, weights_only=False)
        assert all(torch.equal(a, b) for a, b in zip(loaded.parameters(), m.parameters()))
    assert "zero_grad" not in loaded.__dict__ and "__getstate__" not in loaded.__dict__
    assert len(loaded._forward_pre_hooks) == 0


def test_a_deepcopy_made_in_the_block_is_a_model_of_its_own():
    # The copy's zero_grad was the block's, bound to the ORIGINAL model: after the block,
    # copy.zero_grad() cleared the trained model's gradients and left the copy's; its forward ran
    # a copy of the block's hook, which deep-copied the optimizer (its state) with the model.
    base = model64()
    data = batches([5] * 6)
    oracle = big_batch_oracle(base, _sgd, data, 4)
    m = copy.deepcopy(base)
    opt = _sgd(m.parameters())
    with tk.accumulate(4, opt, model=m) as acc:
        for i, (x, y) in enumerate(data):
            F.mse_loss(m(x), y).backward()
            opt.step()
            m.zero_grad()
            if i == 1:
                snapshot = copy.deepcopy(m)  # mid-window: the running sum must stay
    assert acc.steps == 2 and max_rel_err(m, oracle) < 1e-10
    assert "zero_grad" not in snapshot.__dict__ and "__getstate__" not in snapshot.__dict__
    assert len(snapshot._forward_pre_hooks) == 0
    assert "__getstate__" not in m.__dict__  # the model's own state again after the block
    x, y = data[0]
    F.mse_loss(m(x), y).backward()
    F.mse_loss(snapshot(x), y).backward()
    snapshot.zero_grad()
    assert all(p.grad is None for p in snapshot.parameters())
    assert all(p.grad is not None for p in m.parameters())  # the trained model's, untouched
