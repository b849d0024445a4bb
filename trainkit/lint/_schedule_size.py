"""In which unit an LR schedule was sized: optimizer updates, or micro-batches (for TK109).

A schedule built with ``num_training_steps = epochs * len(loader)`` (or
``len(dataset) // batch_size``) counts micro-batches: stepping it at every micro-batch of an
accumulation walks it at the pace it was planned for, its warm-up and decay ending where
intended (the LR only matters at the updates, which sample that curve every ``n`` points). Only
a schedule sized in updates (``len(loader) // n * epochs``, ``args.max_train_steps`` computed
from ``num_update_steps_per_epoch``), or of unknown size, runs ``n`` times too fast.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional

from trainkit.lint._core import FileContext
from trainkit.lint._nodes import dotted

# A name that says "accumulation": gradient_accumulation_steps, accum_iter, grad_accum.
_ACCUM_NAME = re.compile(r"accum", re.IGNORECASE)
# Constructor arguments that are not sizes.
_NOT_SIZES = frozenset({"optimizer", "last_epoch", "verbose", "anneal_strategy", "max_lr", "eta_min", "lr_lambda"})


def _constructors(ctx: FileContext, name: str) -> List[ast.Call]:
    """The calls assigned to ``name`` in the file: ``scheduler = get_linear_schedule_with_warmup(...)``
    (also ``scheduler: LRScheduler = ...``)."""
    return [value for value in ctx.assignments.get(name, ()) if isinstance(value, ast.Call)]


def _expanded(expr: ast.expr, values: Dict[str, List[ast.expr]], depth: int = 0) -> List[ast.AST]:
    """The nodes of ``expr`` and, through the names it reads, of the values they were assigned."""
    nodes: List[ast.AST] = list(ast.walk(expr))
    if depth >= 4:
        return nodes
    for node in list(nodes):
        name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        for value in values.get(name or "", ()):
            if value is not expr:
                nodes.extend(_expanded(value, values, depth + 1))
    return nodes


def sized_in_micro_batches(ctx: FileContext, scheduler: str, every: str) -> bool:
    """Whether the schedule ``scheduler`` was built with a size counted in micro-batches.

    True when the sizes passed to its constructor (through the names they read) take a
    ``len(...)`` and nowhere mention the accumulation's ``every`` (as written in its ``%``)
    nor a name about accumulation. False when unknown.
    """
    calls = _constructors(ctx, scheduler)
    if len(calls) != 1:
        return False
    call = calls[0]
    sizes: List[ast.expr] = list(call.args[1:]) + [k.value for k in call.keywords if k.arg not in _NOT_SIZES]
    if not sizes:
        return False
    values = ctx.assignments
    nodes = [n for size in sizes for n in _expanded(size, values)]
    for node in nodes:
        if isinstance(node, ast.expr) and ast.unparse(node) == every:
            return False
        name: Optional[str] = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if name is not None and _ACCUM_NAME.search(name):
            return False
    return any(isinstance(n, ast.Call) and dotted(n.func) == "len" for n in nodes)
