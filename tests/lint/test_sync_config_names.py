"""TK302 and configuration attributes whose names look like a loss: ``float(args.aux_loss_weight)``
or ``print(cfg.loss_type)`` read a Python value of a config object, not a tensor, so nothing waits
for the GPU. TK302 reported them because the last name matched ``loss``."""
from __future__ import annotations

import textwrap

import pytest

from trainkit.lint import lint_source

LOOP = """
import torch
import torch.nn.functional as F

def train(args, cfg, model, loader, optimizer):
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        logits, aux = model(x)
        {line}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _codes(line: str) -> list:
    return [f.code for f in lint_source(textwrap.dedent(LOOP).replace("{line}", line))]


@pytest.mark.parametrize("line", [
    "loss = F.cross_entropy(logits, y) + float(args.aux_loss_weight) * F.cross_entropy(aux, y)",
    "loss = F.cross_entropy(logits, y) * int(cfg.loss_scale)",
    "loss = F.cross_entropy(logits, y) * float(self.hparams.loss_weight)",
    "loss = F.cross_entropy(logits, y) * float(cfg.train.loss_weight)",
    "loss = F.cross_entropy(logits, y) * float(model_config.loss_weight)",
    "loss = F.cross_entropy(logits, y); print(args.loss)",
    "loss = F.cross_entropy(logits, y); print(f'{config.loss_type}')",
])
def test_config_attributes_are_not_tensors(line: str) -> None:
    assert _codes(line) == []


@pytest.mark.parametrize("line", [
    "loss = F.cross_entropy(logits, y); total = float(loss)",
    "loss = F.cross_entropy(logits, y); print(self.loss)",
    "loss = F.cross_entropy(logits, y); print(outputs.logits)",
])
def test_tensor_names_are_still_reported(line: str) -> None:
    assert _codes(line) == ["TK302"]
