"""tk.compiled_step on Adam/AdamW at a step whose lr is 0 (a warm-up from 0, as transformers'
``get_linear_schedule_with_warmup`` / ``get_scheduler("linear", num_warmup_steps>0)`` starts).

torch's compiled Adam step takes the capturable formula, which divides the square-rooted second
moment by the step size: at lr 0, an element whose gradient was always 0 (an embedding row not
seen yet, a ``padding_idx`` row) gets 0 / -0.0, NaN, where eager leaves it as it is
(pytorch/pytorch#126514; raw ``torch.compile(opt.step)`` alike). After that step the model is NaN
for good. trainkit puts back, for those steps only, the elements the step made NaN.
"""
from __future__ import annotations

from typing import Any, List

import pytest
import torch

import trainkit as tk


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _warmup_from_zero(opt: Any, warm: int = 2) -> Any:
    # transformers' get_linear_schedule_with_warmup(opt, warm, total), its first factor 0
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / warm))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 4, padding_idx=0), torch.nn.Linear(4, 2))


def _train(how: str, opt_cls: Any = torch.optim.AdamW) -> List[torch.Tensor]:
    model = _model()
    opt = opt_cls(model.parameters(), lr=1e-2, weight_decay=0.01)
    if how == "patch":
        tk.compiled_step(opt)
    sched = _warmup_from_zero(opt)
    ids = torch.tensor([[1, 2, 0], [3, 2, 0]])  # rows 4..9 never seen, row 0 the padding
    step: Any = opt.step
    if how == "decorator":
        @tk.compiled_step
        def step() -> None:
            opt.step()
    elif how == "decorated_train_step":  # the backward inside: no gradient when it is called
        @tk.compiled_step
        def train_step() -> None:
            model(ids).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    first = None
    for i in range(4):
        before = [p.detach().clone() for p in model.parameters()]
        if how == "decorated_train_step":
            train_step()
        else:
            model(ids).pow(2).mean().backward()
            step()
            opt.zero_grad()
        sched.step()
        if i == 0:  # lr 0: as eager, nothing moved
            first = [torch.equal(a, b.detach()) for a, b in zip(before, model.parameters())]
    assert first == [True, True, True], first
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("how", ["patch", "decorator", "decorated_train_step"])
def test_a_compiled_adamw_step_at_lr_0_leaves_no_nan_and_equals_eager(how: str) -> None:
    ref = _train("eager")
    got = _train(how)
    for a, b in zip(got, ref):
        assert not a.isnan().any()
        assert ((a - b).norm() / b.norm()).item() < 1e-5


def test_a_compiled_adam_step_at_lr_0_leaves_no_nan() -> None:
    got = _train("patch", torch.optim.Adam)
    assert not any(p.isnan().any() for p in got)


def test_a_numpy_lr_of_0_from_a_warmup_lambda_leaves_no_nan() -> None:
    """A LambdaLR whose lambda uses numpy writes numpy.float64 lrs (a float subclass): its
    warm-up's lr 0 was not seen as 0, and the first compiled step left the embedding NaN."""
    np = pytest.importorskip("numpy")
    model = _model()
    opt = tk.compiled_step(torch.optim.AdamW(model.parameters(), lr=1e-2))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: np.minimum(1.0, s / 2))
    assert type(opt.param_groups[0]["lr"]) is np.float64 and opt.param_groups[0]["lr"] == 0
    ids = torch.tensor([[1, 2, 0], [3, 2, 0]])
    before = [p.detach().clone() for p in model.parameters()]
    model(ids).pow(2).mean().backward()
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # as eager at lr 0
    sched.step()
    model(ids).pow(2).mean().backward()
    opt.step()
    assert not any(p.isnan().any() for p in model.parameters())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (foreach + capturable path)")
def test_a_compiled_adamw_step_at_lr_0_on_cuda_leaves_no_nan() -> None:
    """On CUDA the compiled step is the foreach capturable one (dynamo sets capturable for a fresh
    state): no NaN at the warm-up's lr 0, whether torch's kernels make one there or not."""
    model = _model().cuda()
    opt = tk.compiled_step(torch.optim.AdamW(model.parameters(), lr=1e-2))
    sched = _warmup_from_zero(opt)
    ids = torch.tensor([[1, 2, 0], [3, 2, 0]], device="cuda")
    for _ in range(3):
        model(ids).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    assert not any(p.isnan().any() for p in model.parameters())
