"""A plain-PyTorch float64 oracle shared by the technique tests."""
from __future__ import annotations

import copy
from typing import Callable, List, Optional, Sequence, Tuple

import torch


def model64(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()


def batches(sizes: Sequence[int], seed: int = 1, dtype=torch.float64) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, 6, generator=g, dtype=dtype), torch.randn(b, 3, generator=g, dtype=dtype))
            for b in sizes]


def big_batch_oracle(model: torch.nn.Module, make_opt: Callable, data, n: int,
                     reduction: str = "mean", clip: Optional[float] = None) -> torch.nn.Module:
    """One optimizer step per window of ``n`` micro-batches on the concatenated batch (its
    gradient clipped to ``clip`` first, when given)."""
    return windows_oracle(model, make_opt, [data[i:i + n] for i in range(0, len(data), n)],
                          reduction=reduction, clip=clip)


def windows_oracle(model: torch.nn.Module, make_opt: Callable, windows, reduction: str = "mean",
                   clip: Optional[float] = None) -> torch.nn.Module:
    """One optimizer step per window (a list of micro-batches) on its concatenated batch."""
    m = copy.deepcopy(model)
    opt = make_opt(m.parameters())
    for window in windows:
        x = torch.cat([w[0] for w in window])
        y = torch.cat([w[1] for w in window])
        opt.zero_grad()
        if reduction == "mean":
            loss = torch.nn.functional.mse_loss(m(x), y)
        else:  # per item = per row: the sum over rows divided by the rows
            loss = torch.nn.functional.mse_loss(m(x), y, reduction="sum") / len(x)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
    return m


def max_rel_err(a: torch.nn.Module, b: torch.nn.Module) -> float:
    errs = [((p - q).abs().max() / q.abs().max()).item() for p, q in zip(a.parameters(), b.parameters())]
    return max(errs)
