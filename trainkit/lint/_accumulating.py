"""Which loops accumulate gradients by hand, for which step, over which backwards.

The model the TK1xx rules of :mod:`trainkit.lint.accumulation` share: a loop accumulates
for an optimizer or scaler ``step()`` under ``if ... % n ...`` (or after an early exit
``if ... % n ...: continue``, or under a name bound to such a test) when some backward also
runs on batches where that step does not, and its gradients are neither wiped nor used by
another optimizer first. Also: which ``with`` block of trainkit's own ``tk.accumulate(...)``
a node sits in (:func:`tk_accumulate_with`), for the rules about those blocks.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

from trainkit.lint._exits import exit_side
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, method_name, pos, receiver


@dataclass(frozen=True)
class Accumulation:
    """A loop that accumulates gradients by hand for one optimizer step.

    Attributes:
        loop: The training loop.
        step: The first ``step()`` under ``if ... % n ...`` that sums several backwards.
        guard: That ``if`` (or ``case``): around the step, or an early exit before it.
        every: ``n`` as written in the ``%``.
        optimizer: The name of the optimizer that ``step`` steps, when it is known.
        backwards: The backwards whose gradients that step sums: those that also run
            on batches where it does not step.
    """

    loop: TrainingLoop
    step: ast.Call
    guard: ast.AST
    every: str
    optimizer: Optional[str]
    backwards: Tuple[ast.Call, ...]

    def place(self, inside: str) -> str:
        """Where code that must run only with the step goes, for a fix: ``inside`` when the step
        sits in its ``if``; after an early exit, below that ``if ...: continue``."""
        if any(p is self.guard for p in self.loop.ctx.ancestors(self.step, stop=self.loop.node)):
            return inside
        test = ast.unparse(self.guard.test) if isinstance(self.guard, ast.If) else "..."
        shown = f"if {test}: continue" if exit_side(self.guard) == "orelse" else f"if {test}: ... else: continue"
        return f"below `{shown}` (line {self.guard.lineno}) with the step"


def is_grad(node: ast.AST) -> bool:
    """``x.grad`` or ``x.grad.data``."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "grad"


def zeroing_owner(loop: TrainingLoop, node: ast.AST) -> Optional[str]:
    """Whose gradients ``node`` zeroes: ``x`` for ``x.zero_grad()``, ``model`` for ``param.grad = None``
    in ``for param in model.parameters():`` (the "set gradients to None" habit); None when unknown."""
    if isinstance(node, ast.Call):
        return receiver(node)
    target = next(t for t in node.targets if is_grad(t))  # type: ignore[attr-defined]
    root = target.value.value if isinstance(target.value, ast.Attribute) else target.value  # `p.grad.data`
    for parent in loop.ctx.ancestors(node, stop=loop.node):
        if isinstance(parent, (ast.For, ast.AsyncFor)) and isinstance(parent.target, ast.Name) \
                and isinstance(root, ast.Name) and parent.target.id == root.id:
            it = parent.iter
            if isinstance(it, ast.Call) and method_name(it) == "parameters":
                return receiver(it)
            return None
    return None


def zeroes_gradients(node: ast.AST) -> bool:
    """``x.zero_grad()``, or ``p.grad = None`` (torch's ``zero_grad(set_to_none=True)`` by hand)."""
    if isinstance(node, ast.Call):
        return method_name(node) == "zero_grad"
    return (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is None
            and any(is_grad(t) for t in node.targets))


def stepped_optimizer(ctx: FileContext, step: ast.Call) -> Optional[str]:
    """``opt`` for ``opt.step()``, ``scaler.step(opt)`` or ``amp.step(opt)``; None when unknown."""
    name = receiver(step)
    if ctx.is_optimizer(name) and not ctx.is_scaler(name):
        return name
    for arg in step.args:
        if ctx.is_optimizer(dotted(arg)):
            return dotted(arg)
    return None


def first_conditional(loop: TrainingLoop, node: ast.AST) -> Optional[ast.AST]:
    """The innermost ``if``/``case``/``except`` around ``node`` in the loop."""
    for guard in loop.guards(node):
        if not isinstance(guard, (ast.With, ast.AsyncWith)):
            return guard
    return None


def runs_with(loop: TrainingLoop, node: ast.AST, guard: ast.AST, step: ast.Call) -> bool:
    """Whether ``node`` sits in ``guard`` on the step's side: it runs only on batches that step.

    Only the side of ``guard`` matters: a clip in the ``else`` of an ``if use_amp:`` under the
    step's ``if`` runs with that branch's ``optimizer.step()``, though not with ``scaler.step``.
    An ``if`` on the same test, or on its negation, counts as ``guard``: a backward under
    ``if learn:`` runs with a step behind ``if not learn: continue``.
    """
    side = loop.side_of(step, guard)
    return side is not None and loop.runs_on(node, guard, side)


def fresh_gradient(ctx: FileContext, loop: TrainingLoop, step: ast.Call, guard: ast.AST, optimizer: Optional[str]) -> bool:
    """Whether the step's own branch zeroes the gradients, then runs a backward, before stepping.

    ``if i % n_critic == 0: opt_G.zero_grad(); loss_G.backward(); opt_G.step()`` (WGAN's
    generator): whatever earlier backwards left in those gradients is wiped, so nothing
    is accumulated across batches.
    """
    here = pos(step)
    for zero in loop.calls:
        if method_name(zero) != "zero_grad" or pos(zero) >= here or first_conditional(loop, zero) is not guard:
            continue
        owner = receiver(zero)
        if ctx.is_optimizer(owner) and optimizer is not None and owner != optimizer:
            continue  # another optimizer's gradients
        if loop.exclusive(zero, step):
            continue
        if any(pos(zero) < pos(b) < here and runs_with(loop, b, guard, step) for b in loop.backward_calls):
            return True
    return False


def stepped_by_another(ctx: FileContext, loop: TrainingLoop, backward: ast.Call, optimizer: Optional[str]) -> bool:
    """Whether another optimizer steps right after ``backward``, on every batch that runs it.

    Its gradients are then that optimizer's, used at once: WGAN's critic
    ``loss_D.backward(); opt_D.step()`` on every batch does not accumulate for the
    generator's optimizer stepping every ``n_critic`` batches. "Right after" means
    later in the iteration with no other backward in between.
    """
    if optimizer is None:
        return False
    mine = {(id(owner), side) for owner, side in loop.branches(backward)}
    start = pos(backward)
    for other in loop.step_calls:
        if pos(other) <= start:
            continue
        if any(start < pos(b) < pos(other) for b in loop.backward_calls):
            return False  # another backward comes first
        name = stepped_optimizer(ctx, other)
        if name is None or name == optimizer:
            continue
        if all((id(owner), side) in mine for owner, side in loop.branches(other)):
            return True
    return False


def accumulating_loops(ctx: FileContext) -> Iterator[Accumulation]:
    """Each loop that sums several backwards into one step under ``if ... % n ...``.

    A loop accumulates for a step only when some backward also runs on batches where
    that step does not run, and its gradients are not wiped or used by another
    optimizer first. A step and its backward under the same ``%`` test (a DQN that
    trains every ``train_frequency`` environment steps), or a generator stepped every
    ``n_critic`` batches on a freshly zeroed gradient, do not accumulate.

    Loops inside trainkit's ``tk.accumulate(...)`` (or accelerate's ``accumulate``)
    are left out: the helper normalises and zeroes for you.
    """
    for loop in ctx.training_loops:
        for step in loop.step_calls:
            guard = loop.modulo_guard(step)
            if guard is None or ctx.inside_with(step, ("accumulate",)):
                continue
            optimizer = stepped_optimizer(ctx, step)
            if fresh_gradient(ctx, loop, step, guard, optimizer):
                continue
            backwards = tuple(
                b for b in loop.backward_calls
                if not runs_with(loop, b, guard, step) and not stepped_by_another(ctx, loop, b, optimizer)
            )
            if backwards:
                modulo = loop.guard_modulo(guard)
                every = ast.unparse(modulo.right) if modulo is not None else "N"
                yield Accumulation(loop, step, guard, every, optimizer, backwards)
                break


def tk_accumulate_with(ctx: FileContext, node: ast.AST) -> Optional[Tuple[ast.AST, ast.Call]]:
    """The innermost ``with`` block of trainkit's own accumulate around ``node``, and its ``tk.accumulate(...)`` call.

    Only trainkit's (resolved through the imports): accelerate's ``accumulate`` divides the loss,
    and its ``clip_grad_norm_`` clips only where the gradients are synced.
    """
    for parent in ctx.ancestors(node):
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            for item in parent.items:
                expr = item.context_expr
                if isinstance(expr, ast.Call):
                    qual = ctx.qualname(expr.func) or ""
                    if qual.startswith("trainkit.") and qual.endswith(".accumulate"):
                        return parent, expr
    return None
