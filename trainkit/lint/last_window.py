"""TK110: a short last window weighted as a full one.

The tutorial shape of hand-written accumulation steps on every ``n``-th batch *or on the
last one*::

    loss = loss / accumulation_steps
    loss.backward()
    if (i + 1) % accumulation_steps == 0 or i + 1 == len(loader):
        optimizer.step()

When ``len(loader)`` is not a multiple of ``n`` the last window holds ``k < n``
micro-batches, each still divided by ``n``: its update is ``k/n`` of a full one.

Reported on the division, when the loss is divided by the very ``n`` of the step's ``%`` test
(the same name or literal, not rebound in the loop, as timm rebinds ``accum_steps`` for its last
window; also through ``scale = 1 / n`` then ``loss * scale``), and the step's test has a last-batch alternative: ``i + 1 == len(loader)``,
``i == len(loader) - 1``, ``i == last_idx``, a name bound to one (``last_batch = i == last_idx``,
then ``need_update = last_batch or ...``), or a bare ``is_last`` / ``last_batch`` flag.
"""
from __future__ import annotations

import ast
import re
from typing import Iterator, List, Optional, Tuple

from trainkit.lint._accumulating import Accumulation, accumulating_loops
from trainkit.lint._core import FileContext
from trainkit.lint._loss import divisor, loss_of, normalisations_before, through_reciprocal_name
from trainkit.lint._nodes import dotted, find_modulo
from trainkit.lint._registry import Hit, rule

# Names that say "the end of the pass": last_idx, num_batches, steps_per_epoch, len_loader, max_steps.
_END_NAME = re.compile(
    r"last|len|total|(^|_)n_?(batch|step|iter)|num_?(batch|step|iter|update)|(batch|step|iter)s?_per_epoch|"
    r"(batch|step|iter)s?_in_(the_)?epoch|epoch_?(len|size|step|iter)|max_?(step|iter)", re.IGNORECASE)
# Lengths that are not the pass's: seq_len, max_len, max_length, context_len, prompt_len, n_tokens.
_NOT_END_NAME = re.compile(r"seq|token|ctx|context|block|prompt|input|text|sent|word|char|pad|max_?len", re.IGNORECASE)
# A flag of its own that says "this is the last batch": is_last, last_batch, last_step.
_LAST_FLAG = re.compile(r"^(is_)?last(_?(batch|step|iter|micro_?batch))?$", re.IGNORECASE)

_Alt = Tuple[ast.expr, bool]  # an alternative of the step's test, and whether it must be true


def _alternatives(expr: ast.expr, positive: bool) -> List[_Alt]:
    """The alternatives any one of which runs the step: ``a or b`` true, ``a and b`` false (De Morgan)."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return _alternatives(expr.operand, not positive)
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or if positive else ast.And):
        return [alt for value in expr.values for alt in _alternatives(value, positive)]
    return [(expr, positive)]


def _len_of(ctx: FileContext, expr: ast.expr) -> Optional[ast.expr]:
    """``loader`` of a ``len(loader)`` in ``expr``, or in the value a name of it is bound to in the file."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and dotted(node.func) == "len" and len(node.args) == 1:
            return node.args[0]
    names = {dotted(n) for n in ast.walk(expr) if isinstance(n, (ast.Name, ast.Attribute))} - {None}
    for node in ctx.nodes:
        if isinstance(node, ast.Assign) and any(dotted(t) in names for t in node.targets):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Call) and dotted(sub.func) == "len" and len(sub.args) == 1:
                    return sub.args[0]
    return None


def _is_end(ctx: FileContext, expr: ast.expr) -> bool:
    """``len(loader)``, ``len(loader) - 1``, ``last_idx``, ``num_batches``, or a name bound to a ``len(...)``."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Sub, ast.Add)) and isinstance(expr.right, ast.Constant):
        expr = expr.left
    if isinstance(expr, ast.Call):
        return dotted(expr.func) == "len"
    name = dotted(expr)
    if name is None:
        return False
    last = name.split(".")[-1]
    if _NOT_END_NAME.search(last):
        return False
    return bool(_END_NAME.search(last)) or _len_of(ctx, expr) is not None


def _loader(ctx: FileContext, last: ast.expr) -> Optional[ast.expr]:
    """``loader`` of the end a last-batch test compares with (``len(loader)``, ``last_idx = len(loader) - 1``)."""
    if isinstance(last, ast.Compare):
        for side in (last.comparators[0], last.left):
            if _is_end(ctx, side):
                return _len_of(ctx, side)
    return None


def _is_index(expr: ast.expr) -> bool:
    """``i``, ``i + 1``, ``self.step``: a counter, possibly shifted by a constant."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)) and isinstance(expr.right, ast.Constant):
        expr = expr.left
    return dotted(expr) is not None


def _last_batch(ctx: FileContext, expr: ast.expr, positive: bool, every: ast.expr) -> Optional[ast.expr]:
    """The last-batch test in one alternative of the step's test (``i + 1 == len(loader)``), if it is one.

    An ``and`` counts when one of its parts is (``len(loader) < n and i + 1 == len(loader)``).
    The accumulation's own ``every`` is no index: ``steps_in_epoch <= n`` asks whether the pass is
    shorter than a window, not whether this is its last batch.
    """
    if positive and isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.And):
        return next((found for v in expr.values for found in [_last_batch(ctx, v, True, every)] if found is not None), None)
    if positive and isinstance(expr, (ast.Name, ast.Attribute)):
        name = dotted(expr) or ""
        return expr if _LAST_FLAG.search(name.split(".")[-1]) else None
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1) or find_modulo(expr) is not None:
        return None
    left, right, op = expr.left, expr.comparators[0], expr.ops[0]
    if _is_index(left) and _is_end(ctx, right) and not _is_end(ctx, left):
        index_left = True
    elif _is_index(right) and _is_end(ctx, left) and not _is_end(ctx, right):
        index_left = False
    else:
        return None
    if ast.dump(left if index_left else right) == ast.dump(every):
        return None
    # true at the end: ==, or index >= end; false at the end: !=, or index < end
    at_end = (ast.Eq, ast.GtE if index_left else ast.LtE)
    before_end = (ast.NotEq, ast.Lt if index_left else ast.Gt)
    return expr if isinstance(op, at_end if positive else before_end) else None


def step_test(acc: Accumulation) -> Optional[Tuple[ast.BinOp, List[_Alt]]]:
    """The step's ``%`` test and the alternatives any one of which runs the step (through early exits
    and named tests), when the step sits under an ``if`` whose test uses ``%``."""
    guard, loop = acc.guard, acc.loop
    side = loop.side_of(acc.step, guard)
    if not isinstance(guard, ast.If) or side is None:
        return None
    alternatives = _alternatives(loop.resolved(guard.test), side == "body")
    modulo = next((found for expr, _ in alternatives for found in [find_modulo(expr)] if found is not None), None)
    return (modulo, alternatives) if modulo is not None else None


def last_batch_alternative(ctx: FileContext, modulo: ast.BinOp, alternatives: List[_Alt]) -> Optional[ast.expr]:
    """The last-batch test among the step's alternatives (``... or i + 1 == len(loader)``), if any."""
    return next((found for expr, positive in alternatives if find_modulo(expr) is None
                 for found in [_last_batch(ctx, expr, positive, modulo.right)] if found is not None), None)


def mentions_last_batch(ctx: FileContext, expr: ast.expr, every: ast.expr) -> bool:
    """Whether any part of ``expr`` is a last-batch test, either way round (``i + 1 == len(loader)``,
    ``i + 1 != len(loader)``, ``is_last``), wherever it sits in the ``and``/``or``/``not``."""
    return any(isinstance(sub, (ast.Compare, ast.Name, ast.Attribute, ast.BoolOp))
               and (_last_batch(ctx, sub, True, every) is not None or _last_batch(ctx, sub, False, every) is not None)
               for sub in ast.walk(expr))


def _step_alternatives(acc: Accumulation) -> Optional[Tuple[ast.BinOp, ast.expr]]:
    """The step's ``%`` test and a last-batch alternative to it (``... or i + 1 == len(loader)``), if both."""
    found = step_test(acc)
    if found is None:
        return None
    modulo, alternatives = found
    last = last_batch_alternative(acc.loop.ctx, modulo, alternatives)
    return (modulo, last) if last is not None else None


def _rebound(acc: Accumulation, n: ast.expr) -> bool:
    """Whether ``n`` is a name bound in the loop's iteration (timm sets ``accum_steps`` for its last window)."""
    name = dotted(n)
    return name is not None and any(
        isinstance(getattr(x, "ctx", None), ast.Store) and dotted(x) == name for x in acc.loop.region)


def _example(n: ast.expr) -> str:
    """The consequence in numbers, for ``n`` as written."""
    if isinstance(n, ast.Constant) and isinstance(n.value, int) and n.value >= 2:
        size = n.value
        where = ""
    else:
        size = 4
        where = f" and `{ast.unparse(n)}` = 4"
    k = size // 2
    share = "half as large" if 2 * k == size else f"{k}/{size} of a full one"
    return f"with {2 * size + k} batches{where} the last window holds {k} and its update is {share}"


def _window_size(acc: Accumulation, n: ast.expr, loader: Optional[ast.expr]) -> Optional[str]:
    """``min(n, len(loader) - (i // n) * n)``: the micro-batches in the window of ``for i, ... in enumerate(loader)``."""
    node = acc.loop.node
    if not (isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.iter, ast.Call)
            and dotted(node.iter.func) == "enumerate" and node.iter.args):
        return None
    target = node.target
    index = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else None
    if not isinstance(index, ast.Name):
        return None
    start = node.iter.args[1] if len(node.iter.args) > 1 else next(
        (k.value for k in node.iter.keywords if k.arg == "start"), None)
    counted = index.id if start is None else f"({index.id} - {ast.unparse(start)})"
    shown = ast.unparse(n)
    if not isinstance(n, (ast.Name, ast.Attribute, ast.Constant)):
        shown = f"({shown})"
    seq = ast.unparse(loader if loader is not None else node.iter.args[0])
    return f"min({shown}, len({seq}) - ({counted} // {shown}) * {shown})"


@rule(
    "TK110",
    name="short-last-window-weighted-full",
    severity="warning",
    summary="the step also runs on the last batch but its short window's losses are divided by the full n, "
            "so the last update is k/n of a full one",
)
def check_short_last_window(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``loss / n`` in a loop stepping on ``(i + 1) % n == 0 or i + 1 == len(loader)``."""
    for acc in accumulating_loops(ctx):
        found = _step_alternatives(acc)
        if found is None:
            continue
        modulo, last = found
        n = modulo.right
        if _rebound(acc, n) or (isinstance(n, ast.Constant) and n.value == 1):
            continue
        seen = set()
        for call in acc.backwards:
            name = loss_of(acc.loop, call)
            for node in normalisations_before(acc.loop, call, name):
                by = divisor(node, ctx.reciprocal_names)
                if by is None or ast.dump(through_reciprocal_name(ctx, by)) != ast.dump(n) or id(node) in seen:
                    continue
                seen.add(id(node))
                every = ast.unparse(n)
                shown = ast.unparse(node).splitlines()[0]
                size = _window_size(acc, n, _loader(ctx, last))
                real = (f"`{size}`" if size is not None
                        else f"the micro-batches actually in the window (`{every}`, or fewer in the last one)")
                yield Hit(
                    node,
                    f"`{shown}` divides each micro-batch's loss by `{every}`, but the step (line {acc.step.lineno}) "
                    f"also runs on the last batch (`{ast.unparse(last)}`, line {last.lineno}): when the number of "
                    f"batches is not a multiple of `{every}`, the last window holds k < `{every}` micro-batches, each "
                    f"still divided by `{every}`, so its update is only k/`{every}` of a full one "
                    f"({_example(n)}); harmless when the length is a multiple of `{every}`",
                    f"divide by {real} instead of `{every}`; or `with tk.accumulate(n, optimizer):`, which divides "
                    "by the micro-batches actually in each window, a short last window included",
                )
                break
