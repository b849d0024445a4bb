"""A tiny model and a few plain steps, shared by the tests of the fused technique's switch."""
from __future__ import annotations

from typing import Any, Iterator, List

import pytest
import torch

from trainkit.techniques import fused


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


def fused_float64() -> Iterator[None]:
    """The default dtype float64 for a test (the for-loop update then keeps its steps in float64,
    the fused one in float32: the place tells them apart); skipped where the CPU has no fused
    kernels. Each test module makes it a fixture of its own kind (autouse or asked for)."""
    if "cpu" not in fused._supported_devices():
        pytest.skip("fused optimizer kernels on the CPU need torch >= 2.4")
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
