"""TK112: a short last window never stepped.

The most common hand-written accumulation steps only under ``%``::

    for epoch in range(epochs):
        for i, batch in enumerate(loader):
            loss = model(**batch).loss / n
            loss.backward()
            if (i + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()

When ``len(loader)`` is not a multiple of ``n``, the last ``len(loader) % n`` micro-batches of each
pass are never stepped on their own: their gradients are carried into the next epoch's first window
(which then sums ``n + k`` micro-batches, each divided by ``n``) or, after the last epoch or when
the epoch loop zeroes the gradients before its batch loop, thrown away.

Reported, conservatively, on the ``if`` of the step when the batch loop is a ``for`` over a name
(``loader``, ``enumerate(loader)``, ``tqdm(loader)``; not ``range(...)`` nor a name bound to
``itertools.cycle(...)``), the ``%`` test counts the batches of this pass (the ``enumerate`` index,
or a counter set to a number before the batch loop, in the epoch loop or the function, and only
incremented in it), the step's test has nothing but its ``%`` test (no last-batch alternative, as
TK110 reads them in :mod:`trainkit.lint.last_window`, and no other ``or``), no other step of that
optimizer runs in the batch loop outside that test, and no step of it (or call of a step function)
runs after the batch loop before the next pass: in the epoch loop, or after the batch loop in its
function. Loops inside ``tk.accumulate``/``accelerator.accumulate`` are left out (see
:func:`trainkit.lint._accumulating.accumulating_loops`).
"""
from __future__ import annotations

import ast
import bisect
import itertools
import re
from typing import Iterator, List, Optional, Tuple

from trainkit.lint._accumulating import Accumulation, accumulating_loops, runs_with, stepped_optimizer
from trainkit.lint._calls import calls_step_function
from trainkit.lint._core import FileContext
from trainkit.lint._nodes import dotted, method_name, pos, receiver
from trainkit.lint._registry import Hit, rule
from trainkit.lint.last_window import mentions_last_batch, step_test

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
# Calls around a loader in a ``for``: ``enumerate(tqdm(loader))``, ``tqdm(enumerate(loader), total=...)``.
_WRAPPERS = frozenset({"enumerate", "tqdm", "iter"})
# What a name iterated over may be bound to that never ends, or counts steps: ``cycle(loader)``, ``range(n)``.
_ENDLESS = re.compile(r"cycle|count|repeat|range|islice|infinite|endless|forever|loop", re.IGNORECASE)
# A batch cut into micro-batches (``batch.chunk(n)``, ``micro_batches``): likely exactly ``n`` of them.
_MICRO = re.compile(r"micro|accum|chunk|split", re.IGNORECASE)


def _loader_and_index(ctx: FileContext, loop: ast.AST) -> Optional[Tuple[str, Optional[str], int]]:
    """``("loader", "i", 0)`` for ``for i, batch in enumerate(tqdm(loader)):`` (the loader, the index
    and where it starts); ``("loader", None, 0)`` without ``enumerate``; None for a ``while``,
    ``range(...)``, a name bound to ``itertools.cycle(...)``, a batch cut into micro-batches
    (``micro_batches``, ``chunks = batch.chunk(n)``: likely ``n`` of them), or anything but a plain name."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return None
    it: ast.expr = loop.iter
    enum: Optional[ast.Call] = None
    while isinstance(it, ast.Call) and it.args and (dotted(it.func) or "").split(".")[-1] in _WRAPPERS:
        if (dotted(it.func) or "").split(".")[-1] == "enumerate":
            if enum is not None:
                return None
            enum = it
        it = it.args[0]
    loader = dotted(it)
    if loader is None:
        return None
    if _MICRO.search(loader.split(".")[-1]):
        return None
    for value in ctx.assignments.get(loader, []):
        if isinstance(value, ast.Call) and (_ENDLESS.search(dotted(value.func) or "")
                                            or _MICRO.search((dotted(value.func) or "").split(".")[-1])):
            return None
    if enum is None:
        return loader, None, 0
    target = loop.target
    index = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else None
    if not isinstance(index, ast.Name):
        return None
    start = enum.args[1] if len(enum.args) > 1 else next((k.value for k in enum.keywords if k.arg == "start"), None)
    if start is None:
        return loader, index.id, 0
    if isinstance(start, ast.Constant) and isinstance(start.value, int) and not isinstance(start.value, bool):
        return loader, index.id, start.value
    return None


def _enclosing(ctx: FileContext, loop: ast.AST) -> Tuple[Optional[ast.AST], ast.AST]:
    """The epoch loop around the batch loop (the nearest loop, within its function), if any, and the
    function (or module) the batch loop sits in."""
    epoch: Optional[ast.AST] = None
    for parent in ctx.ancestors(loop):
        if isinstance(parent, _SCOPES):
            return epoch, parent
        if epoch is None and isinstance(parent, _LOOPS):
            epoch = parent
    return epoch, ctx.tree


class _Scope:
    """The calls and assignments of a scope's own body (no nested ``def``/``class``/``lambda``), in
    source order, with their positions for bisecting, and the steps among them; built once per
    scope, however many loops in it accumulate (a notebook exported as one module has hundreds), so
    each loop costs a bisect and a pass over the steps, not a pass over the whole scope."""

    def __init__(self, ctx: FileContext, scope: ast.AST) -> None:
        found: List[ast.AST] = []
        stack: List[ast.AST] = list(getattr(scope, "body", [])) + list(getattr(scope, "orelse", []))
        while stack:
            node = stack.pop()
            if isinstance(node, _SCOPES):
                continue
            if isinstance(node, (ast.Call, ast.Assign)):
                found.append(node)
            stack.extend(ast.iter_child_nodes(node))
        found.sort(key=pos)
        self.nodes = found
        self.keys = [pos(n)[:2] for n in found]
        # each step (or step function call) with the backward-running loops around it in the scope
        self.steps = [(key, node, [p for p in ctx.ancestors(node, stop=scope)
                                   if isinstance(p, _LOOPS) and _runs_backward(ctx, p)])
                      for key, node in zip(self.keys, found)
                      if isinstance(node, ast.Call) and (ctx.is_step(node)
                                                         or calls_step_function(ctx, node))]

    def body_range(self, loop: ast.AST) -> Tuple[Tuple[int, int], Tuple[int, int], bool]:
        """The positions of ``loop``'s body: from, to, and whether ``to`` is excluded (its ``else``
        starts there and runs after the loop, so it is kept outside)."""
        low = pos(loop.body[0])[:2]  # type: ignore[attr-defined]
        orelse = loop.orelse  # type: ignore[attr-defined]
        if orelse:
            return low, pos(orelse[0])[:2], True
        # a copy inlined at a call (timm's `_backward(loss)`) is placed at the call by `pos`, its own lines aside
        return low, _end(loop), False

    def outside(self, loop: ast.AST) -> List[ast.AST]:
        """The calls and assignments outside ``loop``'s body (its ``else`` is kept)."""
        low, high, open_end = self.body_range(loop)
        start = bisect.bisect_left(self.keys, low)
        end = bisect.bisect_left(self.keys, high) if open_end else bisect.bisect_right(self.keys, high)
        return self.nodes[:start] + self.nodes[end:]


def _scope_index(ctx: FileContext, scope: ast.AST) -> _Scope:
    cache = ctx.__dict__.setdefault("_tk112_scopes", {})
    found = cache.get(id(scope))
    if found is None:
        found = cache[id(scope)] = _Scope(ctx, scope)
    return found


def _outside(ctx: FileContext, scope: ast.AST, loop: ast.AST) -> List[ast.AST]:
    """The calls and assignments of ``scope`` outside ``loop``'s body (its ``else`` runs after the
    loop, so it is kept)."""
    return _scope_index(ctx, scope).outside(loop)


def _in_another_batch_loop(ctx: FileContext, node: ast.AST, scope: ast.AST, loop: ast.AST) -> bool:
    """Whether ``node`` runs in another loop of ``scope`` than ``loop`` (whose ``else`` runs after it)
    that runs a backward: another batch loop, what it steps is its own window, the leftovers carried
    into it."""
    return any(isinstance(p, _LOOPS) and p is not loop and _runs_backward(ctx, p)
               for p in ctx.ancestors(node, stop=scope))


def _runs_backward(ctx: FileContext, loop: ast.AST) -> bool:
    cache = ctx.__dict__.setdefault("_tk112_backward_loops", None)
    if cache is None:
        cache = {id(t.node) for t in ctx.training_loops if t.backward_calls}
        ctx.__dict__["_tk112_backward_loops"] = cache
    return id(loop) in cache


def _end(node: ast.AST) -> Tuple[int, int]:
    return (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)


def _per_pass_counter(ctx: FileContext, acc: Accumulation, name: str, scope: ast.AST, nodes: List[ast.AST]) -> bool:
    """Whether ``name`` counts this pass's batches: set to a number in ``scope`` before the batch loop
    (in the epoch loop, or in the function before it), and only incremented (``+= 1``) in the loop."""
    loop = acc.loop.node
    increments = 0
    for node in acc.loop.region:
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, (ast.Store, ast.Del)):
            parent = ctx.parents.get(node)
            if not (isinstance(parent, ast.AugAssign) and isinstance(parent.op, ast.Add)
                    and isinstance(parent.value, ast.Constant) and parent.value.value == 1):
                return False
            increments += 1
    if increments == 0:
        return False
    return any(isinstance(n, ast.Assign) and pos(n) < pos(loop) and isinstance(n.value, ast.Constant)
               and isinstance(n.value.value, int) and any(dotted(t) == name for t in n.targets)
               for n in nodes)


def _counted_name(expr: ast.expr) -> Optional[str]:
    """``i`` for ``i``, ``i + 1``, ``(i - 1)``: the counter a ``%`` test reads."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)) and isinstance(expr.right, ast.Constant):
        expr = expr.left
    return expr.id if isinstance(expr, ast.Name) else None


def _counts_windows_exactly(alternative: Tuple[ast.expr, bool], modulo: ast.BinOp, offset: Optional[int]) -> bool:
    """Whether the step's test is true exactly on the multiples of ``n`` of the 1-based batch number
    (``(i + 1) % n == 0`` or ``i % n == n - 1`` over ``enumerate(loader)``, ``i % n == 0`` from
    ``start=1``; also as an early exit ``... != 0: continue``), so the batches left over number
    ``len(loader) % n``. ``offset`` is what the ``%``'s left side adds to the 1-based batch number."""
    expr, positive = alternative
    if offset is None or not (isinstance(expr, ast.Compare) and len(expr.ops) == 1):
        return False
    if not isinstance(expr.ops[0], ast.Eq if positive else ast.NotEq):
        return False
    sides = [expr.left, expr.comparators[0]]
    if not any(side is modulo for side in sides):
        return False
    other = sides[1] if sides[0] is modulo else sides[0]
    if isinstance(other, ast.Constant) and other.value == 0 and not isinstance(other.value, bool):
        return offset == 0
    return (offset == -1 and isinstance(other, ast.BinOp) and isinstance(other.op, ast.Sub)
            and ast.dump(other.left) == ast.dump(modulo.right)
            and isinstance(other.right, ast.Constant) and other.right.value == 1)


def _offset(modulo: ast.BinOp, start: int) -> Optional[int]:
    """What ``i + c`` (the ``%``'s left side) adds to the 1-based batch number ``i - start + 1``."""
    left = modulo.left
    c = 0
    if isinstance(left, ast.BinOp) and isinstance(left.op, (ast.Add, ast.Sub)) and isinstance(left.right, ast.Constant):
        if not isinstance(left.right.value, int) or isinstance(left.right.value, bool):
            return None
        c = left.right.value if isinstance(left.op, ast.Add) else -left.right.value
    return c + start - 1


def _same_optimizer(ctx: FileContext, call: ast.Call, optimizer: Optional[str]) -> bool:
    """Whether ``call`` is a step of ``optimizer`` (either being unknown counts: a flush is read leniently)."""
    if not ctx.is_step(call):
        return False
    other = stepped_optimizer(ctx, call)
    return optimizer is None or other is None or other == optimizer


def _flushed(ctx: FileContext, acc: Accumulation, scope: ast.AST, after: Optional[Tuple[int, int]]) -> bool:
    """Whether a step of the optimizer (or a step function) runs outside the batch loop and any other
    batch loop, after it when ``after`` is given; or another step of it runs in the batch loop
    outside the step's test."""
    index = _scope_index(ctx, scope)
    loop = acc.loop.node
    low, high, open_end = index.body_range(loop)
    for key, node, loops in index.steps:
        if low <= key and (key < high if open_end else key <= high):
            continue  # in the batch loop's body
        if after is not None and key < after:
            continue
        if any(other is not loop for other in loops):
            continue  # in another batch loop: its own window
        if _same_optimizer(ctx, node, acc.optimizer) or calls_step_function(ctx, node):  # type: ignore[arg-type]
            return True
    return any(other is not acc.step and _same_optimizer(ctx, other, acc.optimizer)
               and not runs_with(acc.loop, other, acc.guard, acc.step) for other in acc.loop.step_calls)


def _zeroes(node: ast.AST) -> bool:
    """``x.zero_grad()`` or ``p.grad = None``: what may wipe the leftover gradients."""
    if isinstance(node, ast.Call):
        return method_name(node) == "zero_grad"
    return isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is None


def _zeroing(ctx: FileContext, acc: Accumulation, scope: ast.AST, nodes: List[ast.AST]) -> Optional[ast.AST]:
    """A ``zero_grad()`` (or ``p.grad = None``) outside the batch loop (and any other batch loop), or
    before the first backward inside it: what wipes the leftover gradients before the next pass's
    first window steps."""
    first = min((pos(b) for b in acc.backwards), default=None)
    # on every batch (TK103's mistake) or at each window's start (`if i % n == 0:`), so on the pass's first
    inside = [n for n in acc.loop.region if first is not None and pos(n) < first
              and (not acc.loop.is_conditional(n) or acc.loop.modulo_guard(n) is not None)]
    # the loop test last: it walks the node's parents, and most nodes are no zeroing at all
    outside = (n for n in nodes if _zeroes(n) and not _in_another_batch_loop(ctx, n, scope, acc.loop.node))
    for node in itertools.chain(outside, inside):
        if isinstance(node, ast.Call) and method_name(node) == "zero_grad":
            if ctx.zeroes_only_others(receiver(node), acc.optimizer):
                continue  # another optimizer's gradients, or a model's it does not hold (a GAN's other half)
            return node
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is None and any(
                isinstance(t, ast.Attribute) and t.attr == "grad" for t in node.targets):
            return node
    return None


def _outcome(ctx: FileContext, acc: Accumulation, epoch: Optional[ast.AST], function: ast.AST,
             nodes: List[ast.AST], every: str) -> str:
    """What becomes of the leftover gradients: thrown away, carried into the next pass, or never stepped."""
    if epoch is None and function is ctx.tree:
        return "their gradients are never stepped: the loop ends with them still in `.grad`"
    zero = _zeroing(ctx, acc, epoch if epoch is not None else function, nodes)
    if zero is not None:
        shown = ast.unparse(zero).splitlines()[0]
        return (f"their gradients are thrown away by `{shown}` (line {zero.lineno}) before the next pass's first "
                "window steps, so those micro-batches never train the model")
    carried = (f"their gradients are carried into the next epoch's first window, which then sums `{every}` + k "
               f"micro-batches each divided by `{every}` (an update up to twice too large), and after the last "
               "epoch they are never stepped")
    if epoch is not None:
        return carried
    return (f"if `{getattr(function, 'name', 'the function')}` runs once per epoch, {carried}, unless something "
            "zeroes the gradients between the calls (then they are thrown away)")


def _negated(alternative: Tuple[ast.expr, bool]) -> str:
    """The test true after the loop when its last batch did not step: ``(i + 1) % n != 0`` for a step
    under ``(i + 1) % n == 0``, ``i % n == 0`` for one behind ``if i % n != 0: continue``."""
    expr, positive = alternative
    if not positive:
        return ast.unparse(expr)
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], (ast.Eq, ast.NotEq)):
        flipped = ast.NotEq() if isinstance(expr.ops[0], ast.Eq) else ast.Eq()
        return ast.unparse(ast.Compare(left=expr.left, ops=[flipped], comparators=expr.comparators))
    return f"not ({ast.unparse(expr)})"


def _literal_multiple(ctx: FileContext, loader: str, n: ast.expr) -> bool:
    """Whether the loader is a list or tuple literal whose length is a multiple of the number ``n``."""
    if not (isinstance(n, ast.Constant) and isinstance(n.value, int) and n.value > 0):
        return False
    values = ctx.assignments.get(loader, [])
    return len(values) == 1 and isinstance(values[0], (ast.List, ast.Tuple)) and not any(
        isinstance(e, ast.Starred) for e in values[0].elts) and len(values[0].elts) % n.value == 0


@rule(
    "TK112",
    name="short-last-window-never-stepped",
    severity="warning",
    summary="the step runs only under `(i + 1) % n == 0` with nothing stepping a short last window: "
            "the last len(loader) % n micro-batches of each pass are carried into the next epoch or thrown away",
)
def check_leftover_window(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``if (i + 1) % n == 0: optimizer.step()`` in a pass over a loader with no flush after it."""
    for acc in accumulating_loops(ctx):
        loop = acc.loop.node
        found = _loader_and_index(ctx, loop)
        test = step_test(acc)
        if found is None or test is None:
            continue
        loader, index, start = found
        modulo, alternatives = test
        n = modulo.right
        if len(alternatives) != 1 or mentions_last_batch(ctx, alternatives[0][0], n):
            continue  # a last-batch alternative (TK110's business), or an `or` with anything else
        if isinstance(n, ast.Constant) and n.value == 1 or _literal_multiple(ctx, loader, n):
            continue
        if any(isinstance(getattr(x, "ctx", None), ast.Store) and dotted(x) == dotted(n) for x in acc.loop.region):
            continue  # `n` rebound in the loop (timm sets `accum_steps` for its last window)
        epoch, function = _enclosing(ctx, loop)
        scope = epoch if epoch is not None else function
        nodes = _outside(ctx, scope, loop)
        counted = _counted_name(modulo.left)
        if counted is None or (counted != index and not _per_pass_counter(ctx, acc, counted, scope, nodes)):
            continue  # a counter that runs on across passes (windows then straddle epochs) or a step count
        if _flushed(ctx, acc, scope, None if epoch is not None else _end(loop)):
            continue
        every = ast.unparse(n)
        guard = acc.guard
        shown_test = ast.unparse(guard.test).splitlines()[0] if isinstance(guard, ast.If) else ast.unparse(modulo)
        in_body = acc.loop.side_of(acc.step, guard) == "body"
        where = f"where `{shown_test}`" if in_body else f"where `{shown_test}` is false"
        step = ast.unparse(acc.step)
        optimizer = acc.optimizer or "optimizer"
        if counted == index:
            last = f"{index} == len({loader})" if start == 1 else (
                f"{index} + 1 == len({loader})" if start == 0 else f"{index} - {start - 1} == len({loader})")
        else:
            last = f"{counted} == len({loader})"  # the counter after its `+= 1`, on the pass's last batch
        if _counts_windows_exactly(alternatives[0], modulo, _offset(modulo, start) if counted == index else None):
            left = (f"when the number of batches of `{loader}` is not a multiple of `{every}`, the last "
                    f"`len({loader}) % {every}` micro-batches of each pass of the loop (line {loop.lineno})")
            harmless = f"harmless when the length is a multiple of `{every}`"
        else:
            left = (f"unless each pass of the loop (line {loop.lineno}) over `{loader}` ends on a batch that test "
                    "steps at, the micro-batches after its last step")
            harmless = "harmless only for the lengths of the loader that end on a step"
        yield Hit(
            guard,
            f"the step (`{step}`, line {acc.step.lineno}) runs only {where}, and nothing steps a short "
            f"last window: {left} are never stepped on their own; "
            f"{_outcome(ctx, acc, epoch, function, nodes, every)}; {harmless}",
            f"step once more after the batch loop when the pass ended mid-window (`if {_negated(alternatives[0])}:` "
            f"then `{step}` and `{optimizer}.zero_grad()`; its k micro-batches were divided by `{every}`, so that "
            f"update is k/`{every}` of a full one unless rescaled, see TK110), or add `or {last}` to the step's "
            f"test (and divide that last window's losses by its real size, see TK110); or `with "
            f"tk.accumulate({every}, {optimizer}):` "
            "around the batch loop, which steps a short last window when the block ends",
        )
