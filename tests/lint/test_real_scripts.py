"""Regressions from linting real, widely copied training scripts.

Each snippet is a minimal rewrite (in our own words) of the shape found in the cited
script; the comment says where, what the linter said, and what it should say.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


def _pairs(source: str, **kwargs: object) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), **kwargs)]  # type: ignore[arg-type]


# --------------------------------------------------------------------------- TK107

# huggingface/transformers examples/run_glue.py (pytorch-transformers era, 2019): the loss is divided
# by gradient_accumulation_steps, but clip_grad_norm_ runs right after every backward, outside the
# `if (step + 1) % gradient_accumulation_steps == 0:` that steps. It clipped each partial running sum
# (later versions moved the clip under that `if`). Nothing was reported.
RUN_GLUE_2019 = """
import torch
def train(args, model, loader, optimizer, scheduler, amp):
    for step, batch in enumerate(loader):
        loss = model(**batch)[0]
        if args.gradient_accumulation_steps > 1:
            loss = loss / args.gradient_accumulation_steps
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_grad_norm)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            scheduler.step()
            model.zero_grad()
"""


def test_clip_on_every_micro_batch_of_a_hand_written_accumulation_is_reported() -> None:
    assert _pairs(RUN_GLUE_2019) == [("TK107", 11), ("TK107", 14)]


def test_clip_under_the_steps_if_is_not_reported() -> None:
    # the later run_glue.py, and torch's AMP recipe: unscale_ and clip right before the step
    src = """
    import torch
    from torch.nn.utils import clip_grad_norm_ as clip
    def train(model, loader, optimizer, scaler, n, max_norm):
        for i, (x, y) in enumerate(loader):
            loss = model(x, y) / n
            scaler.scale(loss).backward()
            if (i + 1) % n == 0:
                scaler.unscale_(optimizer)
                clip(model.parameters(), max_norm)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_clip_in_a_loop_that_steps_every_batch_is_not_reported() -> None:
    src = """
    import torch
    def train(model, loader, optimizer):
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            model(x, y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    """
    assert _pairs(src) == []
