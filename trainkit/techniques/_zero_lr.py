"""A compiled Adam/AdamW step at lr 0 leaves NaN where eager leaves the parameter as it is.

torch's compiled Adam step takes the capturable formula (dynamo sets ``capturable`` in the traced
``param_groups``, on the CPU too), which divides the square-rooted second moment by the step size
``-lr / (1 - beta1**t)``: at lr 0 an element whose gradient was always 0 (an embedding row not seen
yet, a ``padding_idx`` row, a parameter whose gradient is exactly 0) gets ``0 / -0.0``, NaN
(pytorch/pytorch#126514; raw ``torch.compile(opt.step)`` alike, torch 2.14). Every other element
is left as eager leaves it (its update is ``exp_avg / -inf``, a zero), and the moments are updated
before the division. A warm-up from lr 0 is transformers' default
(``get_linear_schedule_with_warmup``, ``get_scheduler("linear", num_warmup_steps>0)``): its first
step made such a model NaN for good.

So for a call where a group of an Adam/AdamW has lr 0, its parameters are copied before the call
and the elements the call made NaN are put back after it: what eager gives, at the price of one
copy of those parameters, on those calls only. Other torch optimizers do not divide by the lr
(NAdam, RAdam, Adamax, Adagrad, RMSprop, SGD, Adadelta and ASGD were checked: no NaN).
"""
from __future__ import annotations

import numbers
from typing import Any, List, Tuple

_ADAMS: Any = None


def _adams() -> Any:
    global _ADAMS
    if _ADAMS is None:
        import torch

        _ADAMS = (torch.optim.Adam, torch.optim.AdamW)
    return _ADAMS


def _zero(lr: Any) -> bool:
    if lr.__class__ is float or lr.__class__ is int:
        return lr == 0
    import torch

    if isinstance(lr, torch.Tensor):
        # a tensor lr of the user's own: read on the CPU only (on a GPU reading it would be a sync)
        return lr.device.type == "cpu" and lr.numel() == 1 and bool(lr == 0)
    # Another number: a numpy.float64 (a float subclass), which a LambdaLR whose lambda uses numpy
    # (np.minimum(1.0, step / warmup)) writes; its warm-up's first lr 0 left the model NaN.
    return isinstance(lr, numbers.Real) and lr == 0


def held_at_zero_lr(opt: Any) -> List[Tuple[Any, Any]]:
    """``(parameter, its copy)`` for each parameter in a group of ``opt`` (an Adam or AdamW) whose
    lr is 0 now, before the compiled call; else an empty list. Those without a gradient too: a
    decorated function may run the backward before its step."""
    if not isinstance(opt, _adams()):
        return []
    held: List[Tuple[Any, Any]] = []
    for group in opt.param_groups:
        if _zero(group.get("lr")):
            held.extend((p, p.detach().clone()) for p in group["params"])
    return held


def put_back(held: List[Tuple[Any, Any]]) -> None:
    """After the step: the elements it made NaN get their values from before it back."""
    if not held:
        return
    import torch

    with torch.no_grad():
        for p, before in held:
            p.copy_(torch.where(torch.isnan(p) & ~torch.isnan(before), before, p))
