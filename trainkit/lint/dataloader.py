"""TK5xx: DataLoader settings that starve a GPU (CUDA scripts only)."""
from __future__ import annotations

import ast
from typing import Iterator, List

from trainkit.lint._core import FileContext
from trainkit.lint._registry import Hit, rule

# Positional index of the argument in torch.utils.data.DataLoader's signature.
_NUM_WORKERS_POS = 5
_PIN_MEMORY_POS = 7


def _loaders(ctx: FileContext) -> List[ast.Call]:
    """``DataLoader(...)`` calls without ``**kwargs`` (which might set anything), in a CUDA script."""
    if not ctx.mentions_cuda:
        return []
    return [
        call
        for call in ctx.calls
        if (ctx.qualname(call.func) or "").split(".")[-1] == "DataLoader"
        and not any(k.arg is None for k in call.keywords)
    ]


def _missing(ctx: FileContext, keyword: str, position: int, why: str, fix: str) -> Iterator[Hit]:
    """A hit for each CUDA-script loader that sets ``keyword`` neither by name nor by position."""
    for call in _loaders(ctx):
        if len(call.args) <= position and not any(k.arg == keyword for k in call.keywords):
            yield Hit(call, f"`{ast.unparse(call.func)}(...)` without `{keyword}`: {why}", fix)


@rule(
    "TK501",
    name="dataloader-no-workers",
    severity="advice",
    summary="DataLoader without num_workers in a CUDA script: batches are loaded in the training process",
)
def check_num_workers(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``DataLoader(...)`` without ``num_workers`` in a file that uses CUDA."""
    return _missing(
        ctx,
        "num_workers",
        _NUM_WORKERS_POS,
        "loading and collating run in the training process, between GPU steps",
        "pass `num_workers=4` (about the CPU cores per GPU) and `persistent_workers=True`",
    )


@rule(
    "TK502",
    name="dataloader-no-pin-memory",
    severity="advice",
    summary="DataLoader without pin_memory in a CUDA script: host-to-device copies cannot be asynchronous",
)
def check_pin_memory(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``DataLoader(...)`` without ``pin_memory`` in a file that uses CUDA."""
    return _missing(
        ctx,
        "pin_memory",
        _PIN_MEMORY_POS,
        "batches come from pageable memory, so `.to(device, non_blocking=True)` still blocks",
        "pass `pin_memory=True` and copy with `.to(device, non_blocking=True)`",
    )
