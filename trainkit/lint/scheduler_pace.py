"""TK111: an LR scheduler sized in micro-batches but stepped once per update.

Which ``.step()`` is a scheduler's, and what TK109 (the converse) flags:
:mod:`trainkit.lint.scheduler`.

TK111 is the inverse mistake: a schedule sized in micro-batches (``epochs * len(loader)``) and
stepped once per update (with the step under its ``%`` test, under ``if acc.stepped:`` inside
``tk.accumulate``, or as accelerate's prepared scheduler inside ``accelerator.accumulate``) runs
``n`` times too slow. Its size must be read in the file
(:func:`trainkit.lint._schedule_size.counted_in_batches`); anything unread stays silent.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from trainkit.lint._accumulating import Accumulation, accumulating_loops, runs_with, tk_accumulate_with
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, method_name, pos, receiver
from trainkit.lint._schedule_size import (BatchSized, bound_value, constructor_for, counted_in_batches, loop_loader,
                                          same_scope)
from trainkit.lint._registry import Hit, rule
from trainkit.lint.scheduler import (_LOOPS, _LR_SCHEDULER_CLASS, _about, _block_parts, _built_schedulers,
                                     _is_scheduler_step, _same_every_time)

_ACCELERATOR = re.compile(r"(^|\.)Accelerator$")


def _with_the_step(loop: TrainingLoop, call: ast.Call, acc: Accumulation) -> bool:
    """Whether scheduler step ``call`` runs exactly when the accumulation's step does: on the step's
    side of its ``%`` test (under its ``if``, below its early exit, or under an ``if`` with the same
    test), under no condition of its own (``if epoch_end:``, another ``%``) but those that take the
    same branch at every micro-batch."""
    if not runs_with(loop, call, acc.guard, acc.step):
        return False
    if any(isinstance(p, _LOOPS) for p in loop.ctx.ancestors(call, stop=loop.node)):
        return False  # `for _ in range(n): scheduler.step()` under the step: walked at another pace
    name = receiver(call) or ""
    mine = {id(g) for g in loop.guards(acc.step)}
    for guard in loop.guards(call):
        if id(guard) in mine or _same_every_time(guard, name):
            continue
        if not (isinstance(guard, ast.If) and isinstance(acc.guard, ast.If) and loop._same_test(guard, acc.guard) is not None):
            return False
    sides = {(id(owner), side) for owner, side in loop.branches(acc.step)}
    return all((id(owner), side) in sides for owner, side in loop.branches(call) if id(owner) in mine)


def _window_end(test: ast.expr, bound: str, name: str) -> bool:
    """``acc.stepped`` or ``acc.boundary`` of the block bound to ``bound``, alone or ``and``-ed with
    tests about the scheduler ``name`` itself."""
    if dotted(test) in (f"{bound}.stepped", f"{bound}.boundary"):
        return True
    return isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and any(
        _window_end(v, bound, name) for v in test.values) and all(
        _window_end(v, bound, name) or _about(v, name) for v in test.values)


def _once_per_window(ctx: FileContext, call: ast.Call) -> Optional[Tuple[TrainingLoop, ast.Call, str, ast.If]]:
    """For ``if acc.stepped: scheduler.step()`` in a loop inside ``with tk.accumulate(n, ...) as acc:``:
    the loop, the ``tk.accumulate(...)`` call, ``n`` and that ``if``."""
    found = tk_accumulate_with(ctx, call)
    if found is None:
        return None
    block, acc_call = found
    n, bound = _block_parts(block, acc_call)
    loops = [p for p in ctx.ancestors(call, stop=block) if isinstance(p, _LOOPS)]
    loop = next((x for x in ctx.training_loops if loops and x.node is loops[0]), None)
    if bound is None or loop is None or not any(c is call for c in loop.calls):
        return None
    name = receiver(call) or ""
    guards = [g for g in loop.guards(call) if not _same_every_time(g, name)]
    if len(guards) != 1 or not isinstance(guards[0], ast.If) or not _window_end(guards[0].test, bound, name):
        return None
    if loop.side_of(call, guards[0]) != "body":
        return None
    return loop, acc_call, n, guards[0]


def _too_slow(ctx: FileContext, scheduler: str, constructor: ast.Call, sized: BatchSized, loader: str, n: str,
              stepped: str) -> Hit:
    """The finding on the ``len(loader)`` that sizes schedule ``scheduler``, stepped once every ``n`` micro-batches."""
    k = n if n.isdigit() else f"`{n}`"
    counted = sized.counted
    statement = next((p for p in ctx.ancestors(counted) if isinstance(p, ast.stmt)), None)
    if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not constructor:
        shown = ast.unparse(statement)  # num_training_steps = epochs * len(train_loader)
    else:
        inner = next((p for p in ctx.ancestors(counted) if ctx.parents.get(p) is constructor), counted)
        keyword = inner.arg if isinstance(inner, ast.keyword) else None
        shown = ast.unparse(inner.value if isinstance(inner, ast.keyword) else inner)
        shown = f"{keyword}={shown}" if keyword else shown
    return Hit(
        counted,
        f"the LR schedule `{scheduler}` (line {constructor.lineno}) is sized in micro-batches: `{shown}` counts "
        f"the batches of `{loader}`, but {stepped}, once per update of {k} micro-batches, so it runs "
        f"{k} times too slow: " + (f"its warm-up lasts {k} times longer than planned and " if sized.warmup_too else "")
        + f"training ends 1/{k} of the way through it (a linear or cosine decay stays far from its end)",
        f"size it in updates: `math.ceil(len({loader}) / {n})` in place of `len({loader})` (the updates per "
        f"epoch, transformers' `num_update_steps_per_epoch`), or `len({loader}) // {n}` when the loop does not "
        "step a short last window",
    )


def _accelerate_guard(loop: TrainingLoop, call: ast.Call, guard: ast.AST) -> Optional[str]:
    """The accelerator's name when ``guard`` is its ``with accelerator.accumulate(...)`` or the body of
    ``if accelerator.sync_gradients:`` around ``call``."""
    if isinstance(guard, (ast.With, ast.AsyncWith)):
        for item in guard.items:
            expr = item.context_expr
            if isinstance(expr, ast.Call) and method_name(expr) == "accumulate":
                return receiver(expr)
    if isinstance(guard, ast.If) and loop.side_of(call, guard) == "body":
        name = dotted(guard.test) or ""
        if name.endswith(".sync_gradients"):
            return name[: -len(".sync_gradients")]
    return None


def _accumulation_steps(ctx: FileContext, accelerator: str, call: ast.Call) -> Optional[str]:
    """``n`` of the one ``accelerator = Accelerator(gradient_accumulation_steps=n)`` read at ``call``, when its
    prepared scheduler steps with the optimizer (no ``step_scheduler_with_optimizer=``, no ``**kwargs``)."""
    value = bound_value(ctx, accelerator, call)
    if not isinstance(value, ast.Call) or not _ACCELERATOR.search(ctx.qualname(value.func) or ""):
        return None
    given = {k.arg: k.value for k in value.keywords}
    n = given.get("gradient_accumulation_steps")
    if n is None or None in given or "step_scheduler_with_optimizer" in given:
        return None
    if isinstance(n, ast.Constant) and not (isinstance(n.value, int) and n.value > 1):
        return None
    return ast.unparse(n)


def _accelerated(ctx: FileContext, call: ast.Call) -> Optional[Tuple[TrainingLoop, str, str, ast.AST]]:
    """For a scheduler step in a batch loop under accelerate's ``with accelerator.accumulate(...)`` or
    ``if accelerator.sync_gradients:`` and no condition of its own: the loop, the accelerator's name,
    its ``gradient_accumulation_steps`` and that ``with`` or ``if``."""
    node = next((p for p in ctx.ancestors(call) if isinstance(p, _LOOPS)), None)
    loop = next((x for x in ctx.training_loops if x.node is node), None)
    if loop is None:
        return None
    name = receiver(call) or ""
    found: Optional[Tuple[str, ast.AST]] = None
    for guard in loop.guards(call):
        accelerator = _accelerate_guard(loop, call, guard)
        if accelerator is not None and found is None:
            found = (accelerator, guard)
        elif accelerator is not None or not _same_every_time(guard, name):
            return None
    n = _accumulation_steps(ctx, found[0], call) if found is not None else None
    return (loop, found[0], n, found[1]) if found is not None and n is not None else None


def _read_before_prepare(ctx: FileContext, counted: ast.Call, loader: str, prepares: List[ast.Call]) -> Optional[ast.Call]:
    """The ``accelerator.prepare(..., loader, ...)`` that comes after ``len(loader)`` in its function (with none
    before): the length counts the batches of all processes, before the loader was sharded."""
    mine = [c for c in prepares if same_scope(ctx, c, counted) and any(dotted(a) == loader for a in c.args)]
    if not mine or any(pos(c) < pos(counted) for c in mine):
        return None
    return mine[0]


@rule(
    "TK111",
    name="schedule-sized-in-micro-batches",
    severity="error",
    summary="an LR schedule sized in micro-batches (len(loader)) but stepped once per update of an accumulation "
            "runs n times too slow",
)
def check_schedule_sized_in_micro_batches(ctx: FileContext) -> Iterator[Hit]:
    """Flag the size of a schedule counted in ``len(loader)`` whose ``step()`` runs only with the accumulating step."""
    built = _built_schedulers(ctx)
    if not built:
        return
    reported: Set[int] = set()
    prepares: Dict[str, List[ast.Call]] = {}  # accelerator -> its `accelerator.prepare(...)` calls
    for call in ctx.calls:
        if method_name(call) == "prepare" and receiver(call) is not None:
            prepares.setdefault(receiver(call) or "", []).append(call)

    def sized(call: ast.Call, loop: TrainingLoop, n: str,
              prepared: Sequence[ast.Call] = ()) -> Optional[Tuple[str, ast.Call, BatchSized]]:
        """The loop's loader, the scheduler's constructor, and its size in micro-batches of that loader."""
        name = receiver(call) or ""
        loader = loop_loader(loop.node)
        constructor = constructor_for(ctx, name, call, prepared) if name in built else None
        if loader is None or constructor is None or not _LR_SCHEDULER_CLASS.search(ctx.qualname(constructor.func) or ""):
            return None  # built here by a helper of its own (`make_scheduler(optimizer, total)`): its sizes are unread
        size = counted_in_batches(ctx, constructor, loader, n)
        return None if size is None or id(size.counted) in reported else (loader, constructor, size)

    def report(got: Tuple[str, ast.Call, BatchSized], call: ast.Call, n: str, stepped: str) -> Hit:
        reported.add(id(got[2].counted))  # one finding per `len(loader)`, however many steps use the schedule
        return _too_slow(ctx, receiver(call) or "", got[1], got[2], got[0], n, stepped)

    for acc in accumulating_loops(ctx):
        for call in acc.loop.calls:
            if _is_scheduler_step(call, built) and _with_the_step(acc.loop, call, acc):
                got = sized(call, acc.loop, acc.every)
                if got is not None:
                    stepped = f"`{ast.unparse(call)}` (line {call.lineno}) runs only with the step (line {acc.step.lineno})"
                    yield report(got, call, acc.every, stepped)
    for call in ctx.calls:
        if not _is_scheduler_step(call, built):
            continue
        window = _once_per_window(ctx, call)
        if window is not None:
            loop, acc_call, n, guard = window
            got = sized(call, loop, n)
            if got is not None:
                stepped = (f"`if {ast.unparse(guard.test)}: {ast.unparse(call)}` (line {call.lineno}) inside "
                           f"`{ast.unparse(acc_call.func)}({n}, ...)` (line {acc_call.lineno}) steps it at each window's end")
                yield report(got, call, n, stepped)
            continue
        accelerated = _accelerated(ctx, call)
        if accelerated is None:
            continue
        loop, accelerator, n, guard = accelerated
        name = receiver(call) or ""
        mine = [c for c in prepares.get(accelerator, []) if "." in accelerator or same_scope(ctx, c, call)]
        if not any(dotted(a) == name for c in mine for a in c.args):
            continue  # not prepared: it steps wherever it is called
        got = sized(call, loop, n, mine)
        prepare = _read_before_prepare(ctx, got[2].counted, got[0], mine) if got is not None else None
        if got is None or prepare is None:
            continue  # read after `prepare`, the length is one process's: the right size depends on their number
        where = (f"inside `{ast.unparse(guard.items[0].context_expr)}` (line {guard.lineno})"  # type: ignore[attr-defined]
                 if isinstance(guard, (ast.With, ast.AsyncWith)) else f"under `if {ast.unparse(guard.test)}:` (line {guard.lineno})")  # type: ignore[attr-defined]
        stepped = (f"`{ast.unparse(call)}` (line {call.lineno}) {where} steps it only where the gradients sync "
                   f"(accelerate's prepared scheduler; `len({got[0]})` was read before `{accelerator}.prepare` (line "
                   f"{prepare.lineno}), so it counts the batches of all processes)")
        yield report(got, call, n, stepped)
