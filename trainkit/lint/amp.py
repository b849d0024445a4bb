"""TK2xx: GradScaler misuse in mixed-precision loops (wrong or stalled updates)."""
from __future__ import annotations

import ast
from typing import Iterator, Optional

from trainkit.lint._accumulating import zeroes_gradients, zeroing_owner
from trainkit.lint._conditions import implies
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, method_name, pos, receiver
from trainkit.lint._loss import backward_operand
from trainkit.lint._registry import Hit, rule

_TK_AMP = "or let trainkit do it: `with tk.autocast_scaled(scaler) as amp:` then `amp.backward(loss); amp.step(optimizer)` unscales, steps, updates and counts skipped steps"


_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _over_optimizers(ctx: FileContext, node: ast.AST) -> bool:
    """A loop over optimizers: ``for opt in optimizers:``, ``for i, o in enumerate(self.optimizers):``."""
    parts = [getattr(node, "target", None), getattr(node, "iter", None)]
    return any(ctx.is_optimizer(dotted(n)) for part in parts if part is not None for n in ast.walk(part)
               if isinstance(n, (ast.Name, ast.Attribute)))


def _enclosing_loop(ctx: FileContext, node: ast.AST) -> Optional[ast.AST]:
    for outer in ctx.ancestors(node):
        if isinstance(outer, _SCOPES):
            return None
        if isinstance(outer, _LOOPS):
            return outer
    return None


def _updates_around(ctx: FileContext, loop: TrainingLoop) -> Iterator[ast.Call]:
    """Calls that run with each pass of ``loop``: its own, and, for a loop over optimizers, those of
    the loop around it.

    ``for opt in optimizers: scaler.step(opt)`` steps each optimizer once and its
    ``scaler.update()`` follows it, once per batch, in the enclosing loop; such a loop also
    counts the statements right after it (a per-batch ``train_step`` function). Any other loop's
    steps need their update inside it: one after the batch loop, once per epoch, comes after the
    second step, which has raised already.
    """
    yield from loop.calls
    node: Optional[ast.AST] = loop.node
    while node is not None and _over_optimizers(ctx, node):
        parent = ctx.parents.get(node)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and any(s is node for s in block):
                after = block[[id(s) for s in block].index(id(node)) + 1:]
                for stmt in after:
                    yield from (n for n in ast.walk(stmt) if isinstance(n, ast.Call))
        node = _enclosing_loop(ctx, node)
        if node is not None:
            yield from (n for n in ast.walk(node) if isinstance(n, ast.Call))


def _late_update(ctx: FileContext, loop: TrainingLoop, name: str) -> Optional[ast.Call]:
    """A ``name.update()`` in a loop around ``loop`` (once per epoch): too late for each step."""
    outer = _enclosing_loop(ctx, loop.node)
    while outer is not None:
        for n in ast.walk(outer):
            if isinstance(n, ast.Call) and method_name(n) == "update" and receiver(n) == name:
                return n
        outer = _enclosing_loop(ctx, outer)
    return None


@rule(
    "TK201",
    name="scaler-step-without-update",
    severity="error",
    summary="scaler.step() without scaler.update() after each step: the second step raises RuntimeError",
)
def check_step_without_update(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``scaler.step(opt)`` in a loop that does not call ``scaler.update()`` with each step."""
    for loop in ctx.training_loops:
        updated = {receiver(c) for c in _updates_around(ctx, loop) if method_name(c) == "update"}
        for step in loop.step_calls:
            name = receiver(step)
            if ctx.is_scaler(name) and name not in updated:
                late = _late_update(ctx, loop, name)  # type: ignore[arg-type]
                where = (f"`{name}.update()` on line {late.lineno} runs once per pass of the loop around it, "
                         f"not after each step" if late is not None else f"no `{name}.update()` in the loop")
                yield Hit(
                    step,
                    f"`{ast.unparse(step)}` with {where}: the next `{ast.unparse(step)}` raises `RuntimeError: "
                    "step() has already been called since the last update()`, so the run crashes on its second "
                    "step (with the scaler enabled); the loss scale must also adapt after every step",
                    f"call `{name}.update()` right after `{ast.unparse(step)}`, in the same loop; {_TK_AMP}",
                )


def _scaled_backward(ctx: FileContext, call: ast.Call) -> bool:
    operand = backward_operand(call)
    return isinstance(operand, ast.Call) and method_name(operand) == "scale" and ctx.is_scaler(receiver(operand))


def _scaler_disabled_at(ctx: FileContext, loop: TrainingLoop, scaler: Optional[str], node: ast.AST) -> bool:
    """Whether ``node`` runs only where ``scaler`` is switched off: every assignment of it is
    ``GradScaler(..., enabled=E)`` and ``node`` sits where ``E`` is false (``else:`` of ``if E:``,
    ``if not E:``). There ``scaler.scale(loss)`` returns the loss unchanged, so a plain step is right."""
    switches = [next((k.value for k in v.keywords if k.arg == "enabled"), None) if isinstance(v, ast.Call) else None
                for v in ctx.assignments.get(scaler or "", [])]
    if not switches or any(e is None for e in switches) or len({ast.dump(e) for e in switches}) != 1:  # type: ignore[arg-type]
        return False  # constructed without `enabled=`, or with different switches
    switch = ast.dump(switches[0])  # type: ignore[arg-type]

    def off(expr: ast.expr, holds: bool) -> bool:
        return not holds and ast.dump(expr) == switch

    return any(isinstance(owner, ast.If) and side in ("body", "orelse")
               and implies(loop.resolved(owner.test), side == "body", off)
               for owner, side in loop.branches(node))


def _zeroed_before(ctx: FileContext, loop: TrainingLoop, step: ast.Call, optimizer: str,
                   scaled: list) -> bool:
    """Whether ``optimizer``'s gradients are zeroed earlier in the iteration, whenever ``step`` runs,
    with no scaled backward between that zeroing and the step: what it steps then comes from plain
    backwards only. A GAN with one half under the scaler (``scaler.step(opt_d)``) and the other plain
    (``opt_g.zero_grad(); g_loss.backward(); opt_g.step()``) is correct; the scaled ``d_loss`` may have
    reached G's parameters, but that was wiped. The zeroing is ``optimizer.zero_grad()``, or that of
    the one model (``netG.zero_grad()``, ``p.grad = None`` over its parameters) the file builds
    ``optimizer`` on. A zeroing after the step does not count: the next iteration's plain step sees
    what the scaled backward left."""
    here = pos(step)
    mine = {(id(owner), side) for owner, side in loop.branches(step)}
    for node in loop.region:
        if pos(node) >= here or not zeroes_gradients(node):
            continue
        owner = zeroing_owner(loop, node)
        models = {m for m, opts in ctx.parameter_optimizers.items() if optimizer in opts}
        if owner != optimizer and models != {owner}:
            continue  # another optimizer's, or a model holding only part of this optimizer's parameters
        if not all((id(o), side) in mine for o, side in loop.branches(node)):
            continue  # skipped on some iterations that step
        if not any(pos(node) < pos(b) < here and not loop.exclusive(b, step) for b in scaled):
            return True
    return False


@rule(
    "TK202",
    name="scaled-backward-plain-step",
    severity="error",
    summary="scaler.scale(loss).backward() followed by a plain optimizer.step(): the step uses scaled gradients",
)
def check_plain_step_after_scaled_backward(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``optimizer.step()`` in a loop whose backward goes through ``scaler.scale(...)``.

    Not where the plain step never sees a scaled gradient: on the other side of an ``if`` from the
    scaled backward, where the scaler is switched off (``enabled=``), or after that optimizer's
    gradients were zeroed with no scaled backward since (a GAN whose other half alone is scaled).
    """
    for loop in ctx.training_loops:
        scaled = [c for c in loop.backward_calls if _scaled_backward(ctx, c)]
        if not scaled:
            continue
        scaler = receiver(backward_operand(scaled[0]))  # type: ignore[arg-type]
        unscaled = [c for c in loop.calls if method_name(c) == "unscale_" and receiver(c) == scaler]
        for step in loop.step_calls:
            name = receiver(step)
            # ``if use_amp: scaled backward + scaler.step  else: plain backward + step`` is fine.
            if ctx.is_optimizer(name) and not ctx.is_scaler(name) and not loop.exclusive(scaled[0], step) \
                    and not _scaler_disabled_at(ctx, loop, scaler, step) \
                    and not _zeroed_before(ctx, loop, step, name, scaled):  # type: ignore[arg-type]
                # After `scaler.unscale_(opt)` (to clip) the gradients are true ones: what is wrong then
                # is that the step is taken whatever they hold, and the scale never adapts.
                what = (f"`{ast.unparse(unscaled[0])}` (line {unscaled[0].lineno}) unscaled the gradients, but "
                        "inf/NaN steps are not skipped and the loss scale never adapts" if unscaled else
                        "the gradients are still multiplied by the loss scale (65536 at first) and inf/NaN steps "
                        "are not skipped")
                yield Hit(
                    step,
                    f"`{ast.unparse(step)}` after `{ast.unparse(scaled[0])}` (line {scaled[0].lineno}): {what}",
                    f"`{scaler}.step({name}); {scaler}.update()` instead of `{ast.unparse(step)}`; {_TK_AMP}",
                )
