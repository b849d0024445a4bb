"""TK109: an LR scheduler stepped at every micro-batch of an accumulation.

A per-step LR schedule (warm-up, cosine or linear decay, OneCycleLR) counts optimizer
updates. With gradient accumulation there is one update every ``n`` micro-batches, so a
``scheduler.step()`` run at every micro-batch advances the schedule ``n`` times per update:
the warm-up is over after ``1/n`` of its updates and the decay ends early.

Which ``.step()`` is a scheduler's: a call with no arguments (``step(metric)`` is
ReduceLROnPlateau's, ``step(epoch)`` says where the schedule is) on a receiver that is

* assigned in the file from an LR scheduler: anything under ``torch.optim.lr_scheduler``,
  a class whose name ends in ``LR`` (``OneCycleLR``, ``LinearWarmupCosineAnnealingLR``),
  ``CosineAnnealingWarmRestarts``, ``ChainedScheduler``, a ``...Warmup...Schedule(r)`` class,
  or a ``get_..._schedule...``/``get_scheduler`` factory (transformers, diffusers); or
* named like one: its last part starts with ``sched`` or ``lr_sched`` (``scheduler``,
  ``self.lr_scheduler``, ``sched_G``). Other schedules (``noise_scheduler``,
  ``beta_scheduler``) count only when built from an LR scheduler as above.

TK111, the inverse mistake, is :mod:`trainkit.lint.scheduler_pace`'s.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, Iterator, Optional, Set, Tuple

from trainkit.lint._accumulating import Accumulation, accumulating_loops, stepped_optimizer, tk_accumulate_with
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, find_modulo, is_device_check, method_name, receiver
from trainkit.lint._schedule_size import sized_in_micro_batches
from trainkit.lint._registry import Hit, rule

_LR_SCHEDULER_CLASS = re.compile(
    r"^torch\.optim\.lr_scheduler\.|(^|\.)(\w*LR|CosineAnnealingWarmRestarts|ChainedScheduler|"
    r"\w*Warmup\w*Schedule(r)?|get_\w*schedule\w*|get_scheduler)$")
_PLATEAU = re.compile(r"(^|\.)ReduceLROnPlateau$")
_SCHEDULER_NAME = re.compile(r"^(lr_?)?sched", re.IGNORECASE)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _too_fast(n: str) -> str:
    """What stepping the schedule at every one of ``n`` micro-batches does, in numbers."""
    k = n if n.isdigit() else f"`{n}`"
    return (f"so the LR schedule advances {k} times per update and runs {k} times too fast: a warm-up or decay "
            f"planned over K updates is over after K/{k}")


def _built_schedulers(ctx: FileContext) -> Dict[str, Optional[str]]:
    """Names assigned from an LR scheduler constructor -> the optimizer passed to it (None when unseen).

    ReduceLROnPlateau is left out: it steps on a metric, once per validation.
    """
    out: Dict[str, Optional[str]] = {}
    plateau: Set[str] = set()
    for name, values in ctx.assignments.items():
        for call in values:
            if not isinstance(call, ast.Call):
                continue
            qual = ctx.qualname(call.func) or ""
            if _PLATEAU.search(qual):
                plateau.add(name)
            elif _LR_SCHEDULER_CLASS.search(qual):
                given = call.args[0] if call.args else next(
                    (k.value for k in call.keywords if k.arg == "optimizer"), None)
                out[name] = dotted(given) if given is not None else None
    for name in plateau:
        out.pop(name, None)
    return out


def _is_scheduler_step(call: ast.Call, built: Dict[str, Optional[str]]) -> bool:
    """``scheduler.step()`` with no arguments on an LR scheduler, by construction or by name."""
    if method_name(call) != "step" or call.args or call.keywords:
        return False
    name = receiver(call)
    if name is None:
        return False
    return name in built or bool(_SCHEDULER_NAME.search(name.split(".")[-1]))


def _about(test: ast.expr, name: str) -> bool:
    """Whether ``test`` only asks about the scheduler itself: ``if scheduler is not None:``,
    ``if scheduler:``, ``if not isinstance(scheduler, ReduceLROnPlateau):`` and ``and``/``or``/``not`` of those.
    Such a test takes the same branch at every micro-batch."""
    if dotted(test) == name:
        return True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _about(test.operand, name)
    if isinstance(test, ast.BoolOp):
        return all(_about(v, name) for v in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)):
        other = test.comparators[0]
        return dotted(test.left) == name and isinstance(other, ast.Constant) and other.value is None
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id in ("isinstance", "hasattr"):
        return bool(test.args) and dotted(test.args[0]) == name
    return False


def _same_every_time(guard: ast.AST, name: str) -> bool:
    """Whether ``guard`` takes the same branch at every micro-batch: a ``with``, a device check,
    or an ``if`` about the scheduler ``name`` itself."""
    if isinstance(guard, (ast.With, ast.AsyncWith)):
        return True
    return isinstance(guard, ast.If) and find_modulo(guard.test) is None and (
        is_device_check(guard.test) or _about(guard.test, name))


def _every_micro_batch(loop: TrainingLoop, call: ast.Call) -> bool:
    """Whether ``call`` runs at every iteration of ``loop``: no condition around it but a device
    check, an ``if`` about the scheduler itself, or a ``with``. Any other condition (``if acc.stepped:``,
    a ``%`` test of its own, a flag set by the step) is given the benefit of the doubt."""
    name = receiver(call) or ""
    return all(_same_every_time(guard, name) for guard in loop.guards(call))


def _block_parts(block: ast.AST, acc_call: ast.Call) -> Tuple[str, Optional[str]]:
    """``n`` as written in ``tk.accumulate(n, ...)``, and the name its ``with`` binds (``acc``), if any."""
    given = acc_call.args[0] if acc_call.args else next((k.value for k in acc_call.keywords if k.arg == "n"), None)
    item = next(i for i in block.items if i.context_expr is acc_call)  # type: ignore[attr-defined]
    bound = dotted(item.optional_vars) if item.optional_vars is not None else None
    return (ast.unparse(given) if given is not None else "n"), bound


def _hand_written(ctx: FileContext, acc: Accumulation, built: Dict[str, Optional[str]]) -> Iterator[Hit]:
    """Scheduler steps at every micro-batch of a hand-written accumulation (step under ``% n``)."""
    loop = acc.loop
    # the other optimizers stepped in this loop, and whether one of them steps on every batch
    others: Set[str] = set()
    every_batch = False
    for step in loop.step_calls:
        name = stepped_optimizer(ctx, step)
        if name is not None and name != acc.optimizer:
            others.add(name.split(".")[-1])
            every_batch = every_batch or loop.modulo_guard(step) is None
    for call in loop.calls:
        if not _is_scheduler_step(call, built) or not _every_micro_batch(loop, call):
            continue
        owner = built.get(receiver(call) or "")
        if owner is not None and owner.split(".")[-1] in others:
            continue  # another optimizer's schedule (a GAN's discriminator, stepped on every batch)
        if owner is None and every_batch:
            continue  # another optimizer steps on every batch: this schedule may be its own
        if sized_in_micro_batches(ctx, receiver(call) or "", acc.every):
            continue  # planned over micro-batches (epochs * len(loader)): walked at its own pace
        shown = ast.unparse(call)
        yield Hit(
            call,
            f"`{shown}` runs on every micro-batch but the step (line {acc.step.lineno}) runs every "
            f"`{acc.every}`, " + _too_fast(acc.every),
            f"move `{shown}` {acc.place('under the same `if` as the step')}, right after it; or "
            "`with tk.accumulate(n, optimizer) as acc:` and `if acc.stepped: " + shown + "`",
        )


def _in_tk_accumulate(ctx: FileContext, call: ast.Call) -> Optional[Hit]:
    """A scheduler step at every micro-batch of a loop inside ``with tk.accumulate(...)``."""
    found = tk_accumulate_with(ctx, call)
    if found is None:
        return None
    block, acc_call = found
    loops = [p for p in ctx.ancestors(call, stop=block) if isinstance(p, _LOOPS)]
    loop = next((x for x in ctx.training_loops if loops and x.node is loops[0]), None)
    if loop is None or not any(c is call for c in loop.calls) or not _every_micro_batch(loop, call):
        return None  # once per block (per epoch), in a nested def, or under a condition
    n, bound = _block_parts(block, acc_call)
    if sized_in_micro_batches(ctx, receiver(call) or "", n):
        return None  # planned over micro-batches: walked at its own pace
    func = ast.unparse(acc_call.func)
    shown = ast.unparse(call)
    steps = [s for s in loop.step_calls if stepped_optimizer(ctx, s) is not None]
    where = f"`{ast.unparse(steps[0])}` (line {steps[0].lineno})" if steps else "`optimizer.step()`"
    fix = f"step it only when a window ended: `if {bound or 'acc'}.stepped: {shown}` right after {where}"
    if bound is None:
        fix += f", binding the block with `with {func}(...) as acc:`"
    return Hit(
        call,
        f"`{shown}` runs at every micro-batch inside `{func}({n}, ...)` (line {acc_call.lineno}), where {where} "
        f"really steps only at the end of each window of `{n}` micro-batches, " + _too_fast(n),
        fix,
    )


@rule(
    "TK109",
    name="scheduler-every-micro-batch",
    severity="error",
    summary="an LR scheduler stepped at every micro-batch of a loop that accumulates runs its schedule n times too fast",
)
def check_scheduler_every_micro_batch(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``scheduler.step()`` run on micro-batches where the accumulating optimizer does not step."""
    built = _built_schedulers(ctx)
    for acc in accumulating_loops(ctx):
        yield from _hand_written(ctx, acc, built)
    for call in ctx.calls:
        if _is_scheduler_step(call, built):
            hit = _in_tk_accumulate(ctx, call)
            if hit is not None:
                yield hit
