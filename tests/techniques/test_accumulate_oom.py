"""Skipping a batch on out-of-memory inside ``tk.accumulate``, as the README says.

The usual pattern, ``except torch.cuda.OutOfMemoryError: optimizer.zero_grad(); continue``
(``torch.OutOfMemoryError``, the same class, is not in torch 2.3), cannot drop a micro-batch
whose backward ran out of memory halfway: inside a window ``zero_grad()`` is held, so the
gradients that backward already added stay in the window's sum. An OOM in the
forward touched no gradient: skipping it there is right. One in the backward leaves the block,
which drops the window in progress with its gradients; a new block goes on with the next batch.
The OOM is raised here by a backward of the test's own (real torch, no GPU), after the last
layer's gradients were added, as a real one can be.
"""
from __future__ import annotations

from typing import List

import torch

import trainkit as tk

BAD = 2  # the micro-batch that runs out of memory (window 0 is batches 0..3)


class _Oom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bad):  # type: ignore[override]
        ctx.bad = bad
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if ctx.bad:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by the test)")
        return g, None


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))


def _loss(model: torch.nn.Module, x: torch.Tensor, bad: bool) -> torch.Tensor:
    return model[1](_Oom.apply(model[0](x), bad)).pow(2).mean()


XS = [torch.randn(2, 3, generator=torch.Generator().manual_seed(i)) for i in range(8)]


def _oracle(skip: List[int]) -> List[torch.Tensor]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.accumulate(4, opt):
        for i, x in enumerate(XS):
            if i not in skip:
                _loss(model, x, False).backward()
                opt.step()
                opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _same(a: List[torch.Tensor], b: List[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y) for x, y in zip(a, b))


def test_zero_grad_after_a_backward_oom_keeps_its_half_in_the_window(recwarn) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.accumulate(4, opt):
        for i, x in enumerate(XS):
            try:
                _loss(model, x, i == BAD).backward()
            except torch.cuda.OutOfMemoryError:
                opt.zero_grad()  # held: clears nothing
                continue
            opt.step()
            opt.zero_grad()
    got = [p.detach().clone() for p in model.parameters()]
    assert not _same(got, _oracle(skip=[BAD]))
    # ...and the held zero_grad() says so, with the fix for this case (not only a GAN's)
    said = [str(w.message) for w in recwarn.list if "gradients were added" in str(w.message)]
    assert len(said) == 1 and "out of memory" in said[0] and "leave the tk.accumulate block" \
        in said[0], said


def test_a_forward_oom_is_skipped_inside_the_block() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.accumulate(4, opt):
        for i, x in enumerate(XS):
            try:
                if i == BAD:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by the test)")
                loss = _loss(model, x, False)
            except torch.cuda.OutOfMemoryError:
                continue  # no gradient touched: the window goes on without it
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert _same([p.detach() for p in model.parameters()], _oracle(skip=[BAD]))


def test_a_backward_oom_leaves_the_block_which_drops_its_window() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(enumerate(XS))
    while True:
        try:
            with tk.accumulate(4, opt):
                for i, x in batches:
                    _loss(model, x, i == BAD).backward()
                    opt.step()
                    opt.zero_grad()
            break
        except torch.cuda.OutOfMemoryError:
            continue  # the window in progress (batches 0..2) went with its gradients
    assert _same([p.detach() for p in model.parameters()], _oracle(skip=[0, 1, 2]))
