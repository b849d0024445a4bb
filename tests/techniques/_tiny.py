"""A tiny model and a few plain steps, shared by the tests of the fused technique's switch."""
from __future__ import annotations

from typing import Any, List

import torch


def tiny_model(device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(device)


def train(opt: Any, model: torch.nn.Module, steps: int = 3) -> List[torch.Tensor]:
    """``steps`` steps of forward, backward, ``opt.step()``, ``zero_grad()``; the parameters after."""
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)).to(
        next(model.parameters()).device)
    for _ in range(steps):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]
