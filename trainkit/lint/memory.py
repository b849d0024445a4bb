"""TK301: cache and garbage-collector flushes on every training step (slow)."""
from __future__ import annotations

import ast
from typing import Iterator, Set

from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._registry import Hit, rule
from trainkit.lint._step_bodies import called_every_step

_FLUSHES = {
    "torch.cuda.empty_cache": "returns cached blocks to the driver, so the next step pays cudaMalloc again and syncs",
    "torch.mps.empty_cache": "returns cached blocks to the driver, so the next step allocates again",
    "torch.xpu.empty_cache": "returns cached blocks to the driver, so the next step allocates again",
    "gc.collect": "walks every Python object each step (measured: a fine-tuning run went from 65 s to 108 s)",
}

_FIXES = {
    "cache": "remove it (PyTorch's caching allocator reuses the memory); if memory really "
             "fragments, call it under a condition, e.g. once per epoch or after an OOM",
    "gc": "remove it (Python's collector runs on its own, and tensors are freed as soon as their "
          "last reference goes); if reference cycles really pile up, collect under a condition, "
          "e.g. once per epoch",
}


def _flushes(ctx: FileContext, loop: TrainingLoop, where: str = "") -> Iterator[Hit]:
    """The unconditional flushes of ``loop``'s iteration (or of a function's body read as one)."""
    for call in loop.calls:
        qual = ctx.qualname(call.func)
        if qual in _FLUSHES and not loop.is_conditional(call):
            yield Hit(
                call,
                f"`{ast.unparse(call)}` on every training step{where} {_FLUSHES[qual]}",
                _FIXES["gc" if qual == "gc.collect" else "cache"],
            )


@rule(
    "TK301",
    name="flush-every-step",
    severity="warning",
    summary="torch.cuda.empty_cache() or gc.collect() on every iteration of a training loop",
)
def check_flush_every_step(ctx: FileContext) -> Iterator[Hit]:
    """Flag an unconditional ``empty_cache()`` / ``gc.collect()`` inside a training loop, or inside a
    function of the file that the loop calls on every iteration (the char-RNN tutorial's ``train()``,
    a Trainer's ``self.train_step(batch)``): reported once, in the function."""
    for loop in ctx.training_loops:
        if loop.per_epoch:
            continue  # a step once per epoch, after the batch loop (TK112's fix)
        yield from _flushes(ctx, loop)
    seen: Set[int] = set()
    for called in called_every_step(ctx):
        for hit in _flushes(ctx, called.body, f" ({called.where()})"):
            if id(hit.node) not in seen and not called.skips(hit.node):
                seen.add(id(hit.node))
                yield hit
