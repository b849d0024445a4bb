"""Which mode a model is in when a loop runs: ``model.eval()`` before an evaluation loop.

One step function often serves both loops by the model's own mode: ``def step(model, batch, opt):
... if model.training: loss.backward(); opt.step()``, called after ``model.train()`` over the
training data and after ``model.eval()`` over the validation data. :func:`mode_before` tells which
of the two a loop runs in, read conservatively (a training loop taken for an evaluation one hides
its findings), so anything in doubt is unknown (None):

* the nearest ``m.eval()``/``m.train(False)`` (eval) or ``m.train()``/``m.train(True)`` (training),
  a statement of its own before the loop, in its block or a block around it, in the same function
  (or at module level); a statement in between that may change the mode (a ``.train(``, ``.eval(``
  or ``.apply(`` on ``m``, a part of it or what holds it; ``m`` rebound; a call passed ``m``, or a
  method call on what holds it, ``self.validate()`` for ``self.model``, but of a function of the
  file that makes no mode call and passes none of its parameters on; all also inside branches:
  ``if args.eval: model.eval()``) leaves it unknown;
* a plain alias is the same module (:func:`_aliases`): ``net = model; net.eval()``, or ``model =
  self.model; model.eval()``, a statement of its own in the loop's block or one around it, before
  the loop, the plain name bound nowhere else in the function and the model not bound again before
  the loop; the search reads a statement on the alias as one on the model;
* nothing in the loop itself may change it (``model.train()`` at the end of the body runs before
  the next batch), nor anything in a loop around it that the search passes on its way up;
* a loop inside ``with torch.no_grad():`` or ``torch.inference_mode():`` (in the same function)
  runs no backward, so a backward guarded by ``m.training`` runs there only if ``m`` is in eval
  mode or the code fails: it reads as eval mode, unless gradients are switched back on
  (``enable_grad``, ``set_grad_enabled``) in the loop or in the function the caller checks.
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Iterable, List, Optional, Tuple

from trainkit.lint._nodes import dotted, method_name, receiver

if TYPE_CHECKING:
    from trainkit.lint._core import FileContext

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.Module)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_GRAD_OFF = ("no_grad", "inference_mode")
_GRAD_ON = ("enable_grad", "set_grad_enabled")
_MODE_CALLS = ("train", "eval", "apply")


def _related(a: Optional[str], b: str) -> bool:
    """Whether dotted names ``a`` and ``b`` may be the same module or one part of the other; an
    expression that is no dotted name (``models[0]``) may be anything."""
    return a is None or a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _toggle(stmt: ast.stmt, name: str) -> Optional[bool]:
    """True for a statement ``name.train()``/``name.train(True)``, False for ``name.eval()`` or
    ``name.train(False)``, None for anything else."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not isinstance(call, ast.Call) or receiver(call) != name or call.keywords:
        return None
    if method_name(call) == "eval" and not call.args:
        return False
    if method_name(call) == "train":
        if not call.args:
            return True
        flag = call.args[0]
        if len(call.args) == 1 and isinstance(flag, ast.Constant) and isinstance(flag.value, bool):
            return flag.value
    return None


def _passes(call: ast.Call, name: str) -> bool:
    """Whether ``call`` passes ``name``, a part of it or what holds it: as an argument, or as the
    receiver of a method that holds it (``self.validate()`` for ``self.model``; not the module
    called itself, ``self.model(x)``)."""
    args = [a.value if isinstance(a, ast.Starred) else a for a in list(call.args) + [k.value for k in call.keywords]]
    holder = receiver(call)
    return (any(_related(dotted(a), name) for a in args if isinstance(a, (ast.Name, ast.Attribute)))
            or (holder is not None and dotted(call.func) != name and name.startswith(holder + ".")))


def _carried(function: ast.AST, call: ast.Call, name: str) -> Optional[List[str]]:
    """The names ``name`` goes by in ``function`` when ``call`` runs it (``self.model`` through
    ``self.f()``, ``m`` through ``f(model)`` with ``def f(m)``); None when not plain to tell."""
    args = function.args  # type: ignore[attr-defined]
    params = [a.arg for a in args.posonlyargs + args.args]
    given: List[Tuple[str, ast.expr]] = []
    positional = list(call.args)
    if isinstance(call.func, ast.Attribute):
        positional.insert(0, call.func.value)
    for param, arg in zip(params, positional):
        given.append((param, arg))
    for keyword in call.keywords:
        if keyword.arg is None:
            return None
        given.append((keyword.arg, keyword.value))
    if len(positional) > len(params) or any(isinstance(a, ast.Starred) for a in positional):
        return None
    out = []
    for param, arg in given:
        text = dotted(arg)
        if text is None or not _related(text, name):
            continue
        if not (text == name or name.startswith(text + ".")):
            return None  # a part of it passed (`model.encoder`): not followed
        out.append(param + name[len(text):])
    return out


def _harmless(ctx: "FileContext", call: ast.Call, name: str, depth: int) -> bool:
    """A call of the file's own function (``f(...)`` or ``self.f(...)``) that leaves ``name``'s mode
    as it was: every ``def`` of that name makes no mode call and, one level down, passes it on to
    nothing that may change it."""
    func = call.func
    fname = func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) and dotted(func.value) == "self" else None)
    defs = [n for n in ctx.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == fname]
    if not defs or depth > 1:
        return False
    for function in defs:
        inner = _carried(function, call, name)
        if inner is None or any(isinstance(sub, ast.Call) and method_name(sub) in _MODE_CALLS for sub in ast.walk(function)):
            return False
        if any(may_change(ctx, stmt, n, depth + 1) for n in inner for stmt in function.body):
            return False
    return True


def may_change(ctx: "FileContext", node: ast.AST, name: str, depth: int = 0) -> bool:
    """Whether ``node`` may change the mode of ``name`` (see the module): a mode call on it, a part
    of it or what holds it, a call passed it (but a harmless one), or it rebound."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            if method_name(sub) in _MODE_CALLS and _related(receiver(sub), name):
                return True
            if _passes(sub, name) and not _harmless(ctx, sub, name, depth):
                return True
        elif isinstance(sub, (ast.Name, ast.Attribute)) and not isinstance(sub.ctx, ast.Load):
            if _related(dotted(sub), name):
                return True
    return False


def _grad_off(item: ast.withitem) -> bool:
    """``torch.no_grad()`` or ``torch.inference_mode()`` (not ``inference_mode(False)``)."""
    expr = item.context_expr
    if not isinstance(expr, ast.Call) or (dotted(expr.func) or "").split(".")[-1] not in _GRAD_OFF:
        return False
    return not expr.keywords and all(isinstance(a, ast.Constant) and a.value is True for a in expr.args)


def grad_back_on(nodes: Iterable[ast.AST]) -> bool:
    """Whether any of ``nodes`` (or what they hold) switches gradients back on."""
    return any(isinstance(sub, (ast.Name, ast.Attribute)) and (dotted(sub) or "").split(".")[-1] in _GRAD_ON
               for node in nodes for sub in ast.walk(node))


def innermost_loop(ctx: "FileContext", node: ast.AST) -> Optional[ast.AST]:
    """The nearest loop around ``node`` in its function, or None."""
    for parent in ctx.ancestors(node):
        if isinstance(parent, _SCOPES):
            return None
        if isinstance(parent, _LOOPS):
            return parent
    return None


def mode_before(ctx: "FileContext", loop: ast.AST, name: str) -> Optional[bool]:
    """The mode ``name`` is in while ``loop`` runs: True (training), False (eval), None (unknown)."""
    cache = ctx.__dict__.setdefault("_modes", {})
    key = (id(loop), name)
    if key not in cache:
        cache[key] = _mode_before(ctx, loop, name)
    return cache[key]


def _mode_before(ctx: "FileContext", loop: ast.AST, name: str) -> Optional[bool]:
    names, skip = _aliases(ctx, loop, name)
    if any(may_change(ctx, loop, n) for n in names):
        return None  # toggled inside the loop
    found: Optional[bool] = None
    no_grad = False
    child: ast.AST = loop
    for parent in ctx.ancestors(loop):
        if isinstance(parent, (ast.With, ast.AsyncWith)) and any(_grad_off(i) for i in parent.items):
            no_grad = True
        if found is None:
            found = _before(ctx, parent, child, names, skip)
            if found is None and isinstance(parent, (_LOOPS + (ast.Try, ast.ExceptHandler))) and any(
                    may_change(ctx, parent, n) for n in names):
                found = _UNKNOWN  # the loop around re-runs, or a handler after its try body: in doubt
        if isinstance(parent, _SCOPES):
            break
        child = parent
    if no_grad and not grad_back_on([loop]):
        return False
    return None if found is _UNKNOWN else found  # type: ignore[return-value]


_UNKNOWN = object()


def _before(ctx: "FileContext", parent: ast.AST, child: ast.AST, names: List[str],
            skip: List[ast.stmt]) -> Optional[object]:
    """The mode the nearest statement before ``child`` in ``parent``'s block sets on one of ``names``
    (the model and its aliases), ``_UNKNOWN`` when one may change it in another way, None when none
    touches it. The statements binding the aliases (``skip``) leave the module as it was."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if not isinstance(block, list) or not any(child is s for s in block):
            continue
        for stmt in reversed(block[:block.index(child)]):  # type: ignore[arg-type]
            if any(stmt is s for s in skip):
                continue
            toggle = next((t for t in (_toggle(stmt, n) for n in names) if t is not None), None)
            if toggle is not None:
                return toggle
            if any(may_change(ctx, stmt, n) for n in names):
                return _UNKNOWN
    return None


def _stores(scope: ast.AST) -> List[ast.AST]:
    """What ``scope``'s own body binds (outside nested scopes): stored names and attributes, the
    ``def``/``class``, import and ``global`` statements, and the function's parameters."""
    out: List[ast.AST] = []
    args = getattr(scope, "args", None)
    if isinstance(args, ast.arguments):
        out.extend(args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a])
    stack: List[ast.AST] = list(getattr(scope, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)) or isinstance(node, _SCOPES):
            out.append(node)
            continue
        if isinstance(node, (ast.Name, ast.Attribute)) and not isinstance(node.ctx, ast.Load):
            out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _binds(node: ast.AST, name: str) -> bool:
    """Whether ``node`` (one of :func:`_stores`) binds the dotted ``name`` or what holds it
    (``self.model = ...`` or ``self = ...`` for ``self.model``; not ``self.model.head = ...``)."""
    head = name.split(".")[0]
    if isinstance(node, ast.arg):
        return node.arg == head
    if isinstance(node, (ast.Name, ast.Attribute)):
        text = dotted(node)
        return text is not None and (text == name or name.startswith(text + "."))
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name).split(".")[0] == head for a in node.names)
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return head in node.names
    return getattr(node, "name", None) == head  # a `def` or `class`


def _aliases(ctx: "FileContext", loop: ast.AST, name: str) -> Tuple[List[str], List[ast.stmt]]:
    """``name`` and the plain aliases of it the loop sees, with the statements binding them.

    An alias is ``net = model`` (``net`` a plain name, ``model`` the dotted ``name``), or ``model =
    net`` when ``name`` is the plain ``model``: a statement of its own in the loop's block or one
    around it, in the same function, before the loop; the plain name bound nowhere else in the
    function, the other side not bound between that statement and the loop. Anything else (bound
    twice or in a branch, the model rebound after it) is no alias, and the mode stays unknown.
    """
    scope = next((p for p in ctx.ancestors(loop) if isinstance(p, _SCOPES)), None)
    if scope is None:
        return [name], []
    chain = {id(p) for p in ctx.ancestors(loop)}
    stores = _stores(scope)
    start = (loop.lineno, loop.col_offset)  # type: ignore[attr-defined]
    names, skip = [name], []
    for stmt in ast.walk(scope):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and id(ctx.parents.get(stmt)) in chain and (stmt.lineno, stmt.col_offset) < start):
            continue
        alias, value = stmt.targets[0].id, dotted(stmt.value)
        if value is None or not isinstance(stmt.value, (ast.Name, ast.Attribute)):
            continue
        other = value if alias == name else alias if value == name else None
        if other is None or other == name:
            continue
        if sum(_binds(n, alias) for n in stores) != 1:
            continue  # the plain name bound more than once (a parameter, a second assignment, a `for`)
        here = (stmt.lineno, stmt.col_offset)
        if any(_binds(n, value) and here < (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)) < start
               for n in stores):
            continue  # the model rebound after the alias: they are two modules
        names.append(other)
        skip.append(stmt)
    return names, skip
