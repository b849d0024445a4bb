"""Functions defined in a loop's body and called there, read as if their bodies were written at the call.

pytorch-image-models' train loop defines ``def _forward(): ...; return loss`` and
``def _backward(_loss): _loss.backward(); if need_update: optimizer.step()`` in the batch loop's
body and calls them (``loss = _forward()``, ``_backward(loss)``). Seen through the call only, the
loop's backward, step and loss division are hidden from the rules; :func:`inline_loop_functions`
rewrites the tree so each call is replaced by a copy of the body, the parameters renamed to the
call's arguments and ``return x`` turned into ``target = x``.

Only the plain shape is inlined: a ``def`` (no decorators, no ``*args``/``**kwargs`` or
keyword-only parameters) standing directly in a loop's body, whose body has no ``yield``,
``await``, ``global``/``nonlocal`` and no ``return`` but a last one, and whose name is used only
by calls after it in the same iteration (not in a nested function), each a statement of its own
(``f(x)`` or ``name = f(x)``) with plain arguments. Anything else (a ``closure`` passed to
``optimizer.step(closure)``) is left alone. The copies keep their own lines, so findings point
into the function; :func:`trainkit.lint._nodes.pos` orders them at the call through the
``inlined_at`` attribute each copied node carries.
"""
from __future__ import annotations

import ast
import copy
from typing import Dict, List, Optional

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_NOT_INLINED = (ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal)


def inline_loop_functions(tree: ast.Module, nodes: List[ast.AST]) -> bool:
    """Replace each call of a function defined in a loop's body by a copy of its body (see the module).

    ``nodes`` are the tree's nodes (one walk, shared with the caller); True when the tree changed.
    """
    candidates = [(loop, stmt) for loop in nodes if isinstance(loop, _LOOPS)
                  for stmt in loop.body if isinstance(stmt, ast.FunctionDef) and not stmt.decorator_list]
    if not candidates:
        return False
    wanted = {func.name for _, func in candidates}
    parents: Dict[ast.AST, ast.AST] = {}
    named: Dict[str, List[ast.AST]] = {}  # each use or definition of a candidate's name
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
        name = parent.id if isinstance(parent, ast.Name) else getattr(parent, "name", None)
        if name in wanted and isinstance(parent, (ast.Name,) + _SCOPES):
            named.setdefault(name, []).append(parent)
    return sum(_inline(parents, named[func.name], loop, func) for loop, func in candidates) > 0


def _own_nodes(body: List[ast.stmt]) -> List[ast.AST]:
    """The nodes of ``body`` outside nested functions, lambdas and classes."""
    out: List[ast.AST] = []
    stack: List[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        out.append(node)
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return out


def _inlinable(func: ast.FunctionDef) -> bool:
    """Plain parameters, and a body that runs through to its last statement (no early ``return``)."""
    args = func.args
    if args.vararg or args.kwarg or args.kwonlyargs:
        return False
    for node in _own_nodes(func.body):
        if isinstance(node, _NOT_INLINED):
            return False
        if isinstance(node, ast.Return) and node is not func.body[-1]:
            return False
    return True


def _scope_of(parents: Dict[ast.AST, ast.AST], node: ast.AST) -> ast.AST:
    """The function (or module) whose body holds ``node``."""
    current = parents.get(node)
    while current is not None and not isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        current = parents.get(current)
    return current if current is not None else node


def _call_site(parents: Dict[ast.AST, ast.AST], loop: ast.AST, func: ast.FunctionDef, name: ast.Name) -> Optional[ast.stmt]:
    """The statement ``f(...)`` or ``x = f(...)`` that ``name`` calls ``func`` in, when it runs in
    ``loop``'s iteration after the ``def``; None for any other use of the name."""
    call = parents.get(name)
    if not (isinstance(call, ast.Call) and call.func is name and isinstance(name.ctx, ast.Load)):
        return None
    stmt = parents.get(call)
    if isinstance(stmt, ast.Expr):
        pass
    elif not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(func.body[-1], ast.Return)
              and func.body[-1].value is not None):
        return None
    if (stmt.lineno, stmt.col_offset) <= (func.end_lineno or func.lineno, 1 << 30):  # type: ignore[union-attr]
        return None
    current = parents.get(stmt)
    while current is not None and current is not loop:
        if isinstance(current, _SCOPES):
            return None
        current = parents.get(current)
    return stmt if current is loop else None


def _bind(func: ast.FunctionDef, call: ast.Call) -> Optional[Dict[str, ast.expr]]:
    """Parameter -> argument of ``call``, defaults filled in; None when they do not match plainly."""
    params = [a.arg for a in func.args.posonlyargs + func.args.args]
    if len(call.args) > len(params) or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    bound: Dict[str, ast.expr] = dict(zip(params, call.args))
    for keyword in call.keywords:
        if keyword.arg is None or keyword.arg not in params or keyword.arg in bound:
            return None
        bound[keyword.arg] = keyword.value
    defaults = func.args.defaults
    for param, default in zip(params[len(params) - len(defaults):], defaults):
        bound.setdefault(param, default)
    return bound if len(bound) == len(params) else None


class _Rename(ast.NodeTransformer):
    """Each parameter replaced by its argument: renamed when a name, else a copy of the expression."""

    def __init__(self, bound: Dict[str, ast.expr]) -> None:
        self.bound = bound

    def visit_Name(self, node: ast.Name) -> ast.AST:
        value = self.bound.get(node.id)
        if value is None:
            return node
        if isinstance(value, ast.Name):
            return ast.copy_location(ast.Name(id=value.id, ctx=node.ctx), node)
        return ast.copy_location(copy.deepcopy(value), node)


def _within(parents: Dict[ast.AST, ast.AST], node: ast.AST, scope: ast.AST) -> bool:
    current = parents.get(node)
    while current is not None and current is not scope:
        current = parents.get(current)
    return current is scope


def _inline(parents: Dict[ast.AST, ast.AST], named: List[ast.AST], loop: ast.AST, func: ast.FunctionDef) -> bool:
    """Inline ``func`` at each of its calls, when it and every use of its name (in ``named``) are plain."""
    if not _inlinable(func):
        return False
    scope = _scope_of(parents, loop)
    sites: List[ast.stmt] = []
    for node in named:
        if node is func or not (isinstance(scope, ast.Module) or _within(parents, node, scope)):
            continue
        site = _call_site(parents, loop, func, node) if isinstance(node, ast.Name) else None
        if site is None:
            return False  # used in another way (passed on, called elsewhere), or defined again
        sites.append(site)
    if not sites:
        return False
    stored = {n.id for n in _own_nodes(func.body) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    bindings = []
    for site in sites:
        bound = _bind(func, site.value)  # type: ignore[attr-defined, arg-type]
        if bound is None or any(p in stored and not isinstance(v, ast.Name) for p, v in bound.items()):
            return False
        bindings.append(bound)
    for site, bound in zip(sites, bindings):
        _replace(parents, site, _copy_body(func, site, bound))
    loop.body.remove(func)  # type: ignore[attr-defined]
    return True


def _copy_body(func: ast.FunctionDef, site: ast.stmt, bound: Dict[str, ast.expr]) -> List[ast.stmt]:
    body = [_Rename(bound).visit(copy.deepcopy(stmt)) for stmt in func.body]
    last = body[-1]
    if isinstance(last, ast.Return):
        body.pop()
        if isinstance(site, ast.Assign):
            targets = [copy.deepcopy(t) for t in site.targets]
            body.append(ast.copy_location(ast.Assign(targets=targets, value=last.value), last))
        elif last.value is not None:
            body.append(ast.copy_location(ast.Expr(value=last.value), last))
    if not body:
        body.append(ast.copy_location(ast.Pass(), site))
    at = (site.lineno, site.col_offset)
    for stmt in body:
        for node in ast.walk(stmt):
            node.inlined_at = at  # type: ignore[attr-defined]
    return body


def _replace(parents: Dict[ast.AST, ast.AST], site: ast.stmt, body: List[ast.stmt]) -> None:
    parent = parents[site]
    for _, value in ast.iter_fields(parent):
        if isinstance(value, list):
            for i, stmt in enumerate(value):
                if stmt is site:
                    value[i:i + 1] = body
                    return
