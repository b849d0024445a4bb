"""The file as the accumulation and AMP rules read it: step functions' bodies written at their calls.

``def train_step(x, y): loss = crit(model(x), y); loss.backward()`` called by ``for i, (x, y) in
enumerate(loader): train_step(x, y); if (i + 1) % 4 == 0: opt.step()`` accumulates an undivided
loss (TK102), and a ``scaler.scale(loss).backward()`` in the function with a plain ``opt.step()`` in
the loop steps scaled gradients (TK202); neither the loop nor the function alone shows it.
:func:`stepped_view` gives TK1xx and TK2xx a copy of the file where each such call is replaced by
the function's body, as :mod:`trainkit.lint._inline` does for a function defined in the loop body:
parameters renamed to the call's arguments (``self`` to the loop's ``self``), ``return x`` turned
into ``target = x``, an ``if`` on a literal left by a default (``if True:``) reduced to its branch.
The copies keep their lines, so findings point into the function, and carry ``inlined_from``, so
the message says which loop calls it (:func:`where`).

Only what :mod:`trainkit.lint._step_bodies` reads through a call, and only the plain shape:

* the call is made by a training loop on every iteration (not one that steps once per epoch), as a
  statement of its own, ``f(...)`` or ``y = f(...)`` (then the function ends in ``return value``),
  without ``*xs``/``**kw``, and does not switch the function's training off (``train=False``);
* it resolves as there (:func:`trainkit.lint._step_bodies.functions_of`): the one undecorated
  module-level ``def f``, or the ``def f`` of the loop's class or of a base class of the file;
* the function is a step function (its own body runs a backward or a step) with plain parameters
  (no ``*args``, ``**kwargs``, keyword-only ones), no ``yield``, ``await``, ``global``/``nonlocal``,
  no ``return`` but a last one, no training loop of its own (a micro-batch loop is read on its own;
  a batch loop makes it a whole epoch), and no parameter it rebinds given an expression;
* the names the function binds (its locals) are its own: a local that the loop's iteration uses
  too (``print(loss)`` in the loop, a function's local ``loss``; the call's own target aside:
  ``loss = train_step(x)`` is the function's ``return loss``), or that an earlier call's copy binds
  too, gets a fresh name in the copy: a GAN's ``d_loss = step(D, ...)`` and ``g_loss = step(G,
  ...)``, or accelerate's tests calling ``step_model`` for two models, one dividing its loss, each
  read with its own ``loss`` (one ``loss`` for both would let the first's division count for the
  second's backward). The mark of the fresh name is taken out of messages (:func:`plain`).

One level: the calls inside the copied body are not followed.
"""
from __future__ import annotations

import ast
import copy
from typing import Dict, List, Optional, Set, Tuple

from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._inline import _bind, _copy_body, _inlinable, _own_nodes, _replace
from trainkit.lint._step_bodies import Function, functions_of, maybe_skipped
from trainkit.lint._switches import switched_off

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
# appended to a local renamed in a second copy (no identifier holds it); taken out of messages
_FRESH = "\u2032"
# (function name, line of the loop, line of the call), set on every node of a copy
Origin = Tuple[str, int, int]
# a call statement to replace, the function it runs, parameter -> argument, and its origin
_Site = Tuple[ast.stmt, Function, Dict[str, ast.expr], Origin]


def where(node: ast.AST) -> str:
    """The end of a finding's message for a node copied from a step function, else ``""``."""
    origin: Optional[Origin] = getattr(node, "inlined_from", None)
    if origin is None:
        return ""
    name, loop_line, call_line = origin
    return (f", in `{name}()`, which runs on every iteration because the training loop on line {loop_line} "
            f"calls it on line {call_line}")


def _statement(ctx: FileContext, call: ast.Call, function: Function) -> Optional[ast.stmt]:
    """The statement ``f(...)`` or ``y = f(...)`` that ``call`` is, when plain (see the module)."""
    stmt = ctx.parents.get(call)
    if isinstance(stmt, ast.Expr):
        pass
    elif not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(function.body[-1], ast.Return)
              and function.body[-1].value is not None):
        return None
    return stmt if stmt.value is call else None  # type: ignore[union-attr]


def _readable(ctx: FileContext, function: Function) -> bool:
    """A step function of the plain shape: :func:`trainkit.lint._inline._inlinable`, and no training loop."""
    if function.name not in ctx.step_function_defs or not isinstance(function, ast.FunctionDef):
        return False
    if function not in ctx.step_function_defs[function.name] or not _inlinable(function):
        return False
    return not any(isinstance(n, _LOOPS) and ctx.is_training_loop(n) for n in _own_nodes(function.body))


def _bound(function: Function, call: ast.Call) -> Optional[Dict[str, ast.expr]]:
    """Parameter -> argument, the method's first parameter bound to the receiver (``self``)."""
    if isinstance(call.func, ast.Attribute):
        call = ast.Call(func=call.func, args=[call.func.value] + list(call.args), keywords=call.keywords)
    bound = _bind(function, call)  # type: ignore[arg-type]
    if bound is None:
        return None
    stored = {n.id for n in _own_nodes(function.body) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    if any(p in stored and not isinstance(v, ast.Name) for p, v in bound.items()):
        return None  # `x = x.to(device)` with `x` given `batch[0]`: no name to rebind
    return bound


class _Fold(ast.NodeTransformer):
    """``if True:`` / ``if not None:`` (a default written in) replaced by the branch it takes."""

    def visit_If(self, node: ast.If) -> object:
        self.generic_visit(node)
        test, taken = node.test, True
        while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, taken = test.operand, not taken
        if not (isinstance(test, ast.Constant) and (test.value is None or isinstance(test.value, bool))):
            return node
        block = node.body if bool(test.value) == taken else node.orelse
        return block or [ast.copy_location(ast.Pass(), node)]


def _locals(function: Function) -> Set[str]:
    """The names ``function``'s own body binds, other than its parameters."""
    args = function.args
    params = {a.arg for a in args.posonlyargs + args.args}
    return {n.id for n in _own_nodes(function.body)
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)} - params


def plain(text: str) -> str:
    """``text`` (a finding's message or fix) with the marks of renamed locals taken out."""
    return text.replace(_FRESH, "")


def _apart(loop: TrainingLoop, found: List[_Site]) -> List[_Site]:
    """The sites, each copy's locals kept apart from the loop's names and from an earlier copy's: a
    local that the loop uses too (the call's own target aside) or that an earlier site's copy binds
    is renamed in this one (``loss`` to ``loss′``). Written into one iteration, the function's
    ``loss`` and the loop's ``print(loss)`` (or a second copy's ``loss``) would be one variable;
    Python keeps them apart, the function's locals being its own."""
    names = {n.id for n in loop.region if isinstance(n, ast.Name)}
    names |= {n.id for n in ast.walk(getattr(loop.node, "target", loop.node)) if isinstance(n, ast.Name)}
    taken: Set[str] = set()
    out = []
    for stmt, function, bound, origin in found:
        targets = {n.id for t in getattr(stmt, "targets", []) for n in ast.walk(t) if isinstance(n, ast.Name)}
        mine = _locals(function)
        bound = dict(bound)
        for name in sorted(mine & (taken | (names - targets))):
            fresh = name + _FRESH
            while fresh in taken:
                fresh += _FRESH
            bound[name] = ast.Name(id=fresh, ctx=ast.Load())
        taken |= {bound[n].id if n in bound else n for n in mine}  # type: ignore[attr-defined]
        out.append((stmt, function, bound, origin))
    return out


def _sites(ctx: FileContext) -> List[_Site]:
    """Each call to write a step function's body at (see the module), with its binding."""
    out: List[_Site] = []
    functions = functions_of(ctx)
    for loop in ctx.training_loops:
        if loop.per_epoch:
            continue
        found: List[_Site] = []
        for call in loop.calls:
            target = functions.resolve(loop, call)
            if target is None or loop.is_conditional(call) or maybe_skipped(ctx, loop, call):
                continue
            if not _readable(ctx, target) or switched_off(ctx, call, [target]):
                continue
            stmt = _statement(ctx, call, target)
            bound = _bound(target, call) if stmt is not None else None
            if stmt is not None and bound is not None:
                found.append((stmt, target, bound, (target.name, loop.node.lineno, call.lineno)))
        out += _apart(loop, found)
    return out


def stepped_view(ctx: FileContext) -> FileContext:
    """``ctx``'s file with each step function's body written at its calls (``ctx`` when there are none)."""
    cached = ctx.__dict__.get("_stepped_view")
    if cached is not None:
        return cached
    sites = _sites(ctx) if ctx.step_function_defs else []
    view = ctx
    if sites:
        tree = copy.deepcopy(ctx.tree)
        twin = {id(a): b for a, b in zip(ast.walk(ctx.tree), ast.walk(tree))}
        parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        for stmt, function, bound, origin in sites:
            site = twin[id(stmt)]
            body = [_Fold().visit(s) for s in _copy_body(function, site, bound)]  # type: ignore[arg-type]
            flat = [s for part in body for s in (part if isinstance(part, list) else [part])]
            for part in flat:
                for node in ast.walk(part):
                    node.inlined_from = origin  # type: ignore[attr-defined]
            _replace(parents, site, flat)
        view = FileContext(ctx.path, ctx.source, tree)
    ctx.__dict__["_stepped_view"] = view
    return view
