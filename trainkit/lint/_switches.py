"""Calls of a step function with training switched off: ``step(model, batch, opt, train=False)``.

One function often serves both loops: ``def step(model, batch, opt, train=True): ... if train:
loss.backward(); opt.step()``, called as ``step(model, batch, opt)`` over the training data and
``step(model, batch, opt, train=False)`` over the validation data. The second call runs no backward
and no step, so its loop is evaluation code, not a training loop. Read conservatively, since taking
a training loop for an evaluation one hides its findings:

* a *switch* is a parameter the function never rebinds and that every backward and step of its own
  body (outside nested functions) needs: each runs only where ``if train:`` (or ``if train and
  ...:``, ``if not train: ... else:``) takes it, or after ``if not train: return ...`` (or ``raise``)
  in its block or an enclosing one; ``if opt is not None:`` needs ``opt`` not to be None;
* the call passes a literal ``False`` or ``None`` (positionally or by keyword, or by leaving out a
  parameter whose default is one) to a switch that needs it truthy, or ``None`` to one that needs
  it not None; nothing else (``train=is_training``) is read, nor a call with ``*args``/``**kwargs``;
* every function of the file by that name that runs a step is switched off by the call.

The model's own mode is such a switch too: ``if model.training:`` (or ``if not model.training:
return``) with ``model`` a parameter (or ``self.model``, ``self`` bound to the caller's ``self``)
that the function leaves as it gets it (no statement of it may change the mode, see
:mod:`trainkit.lint._modes`, and no gradients switched back on), called from a loop the file runs
in eval mode: ``model.eval()`` before it, or ``torch.no_grad()`` around it. A loop's own backward
and step under such a test are read the same way (:func:`guarded_off`).

A whole epoch (``def epoch(loader, model, opt=None): for X, y in loader: ... if opt: ...``) whose
every call in the file switches it off holds no training loop (:func:`evaluation_epoch`).

The same reading tells which statements of a function a call never runs (:func:`never_runs`): the
training loop's ``step(model, batch, opt)`` (``train=True`` by default) never runs ``if not train:
return loss.item()``, so TK301 and TK302 do not read it through that call.
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Union

from trainkit.lint._modes import grad_back_on, innermost_loop, may_change, mode_before
from trainkit.lint._nodes import dotted, own_nodes

if TYPE_CHECKING:
    from trainkit.lint._core import FileContext

Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]

_TRUTHY, _FALSY, _NOT_NONE, _NONE = "truthy", "falsy", "not None", "None"
Needs = Dict[str, Set[str]]


def _need(test: ast.expr, holds: bool, out: Needs) -> None:
    """Add to ``out`` what ``test`` being ``holds`` needs of a plain name: truthy or falsy, None or not."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        _need(test.operand, not holds, out)
    elif isinstance(test, ast.BoolOp):
        # `a and b` true (or `a or b` false) needs every part; the other way round, none alone
        if isinstance(test.op, ast.And) == holds:
            for value in test.values:
                _need(value, holds, out)
    elif isinstance(test, ast.Name):
        out.setdefault(test.id, set()).add(_TRUTHY if holds else _FALSY)
    elif isinstance(test, ast.Attribute) and test.attr == "training" and dotted(test.value):
        out.setdefault(dotted(test) or "", set()).add(_TRUTHY if holds else _FALSY)  # `if model.training:`
    elif (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name)
          and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None
          and isinstance(test.ops[0], (ast.Is, ast.IsNot))):
        out.setdefault(test.left.id, set()).add(_NOT_NONE if isinstance(test.ops[0], ast.IsNot) == holds else _NONE)


def _leaves(block: List[ast.stmt]) -> bool:
    """Whether running ``block`` always leaves the function: it ends in ``return`` or ``raise``."""
    return bool(block) and isinstance(block[-1], (ast.Return, ast.Raise))


def _needs_of(parents: Dict[ast.AST, ast.AST], function: Function, node: ast.AST) -> Needs:
    """What ``node`` (in ``function``'s own body) needs of names to run: the ``if`` tests around it,
    and the early ``return``/``raise`` exits before it in its block and the blocks around it."""
    out: Needs = {}
    child = node
    parent = parents.get(child)
    while parent is not None and child is not function:
        if isinstance(parent, ast.If) and child is not parent.test:
            _need(parent.test, any(child is s for s in parent.body), out)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if not isinstance(block, list) or not any(child is s for s in block):
                continue
            for stmt in block[:block.index(child)]:
                if isinstance(stmt, ast.If) and _leaves(stmt.body) and not _leaves(stmt.orelse):
                    _need(stmt.test, False, out)  # `if not train: return ...`: the rest runs where it is false
                elif isinstance(stmt, ast.If) and _leaves(stmt.orelse) and not _leaves(stmt.body):
                    _need(stmt.test, True, out)
        child, parent = parent, parents.get(parent)
    return out


def _fixed(function: Function, own: List[ast.AST]) -> Set[str]:
    """``function``'s parameters that its own body never rebinds."""
    args = function.args
    params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    return params - {n.id for n in own if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def switches(ctx: "FileContext", function: Function) -> Needs:
    """The parameters every backward and step of ``function`` needs, and what they need (see the module)."""
    own = own_nodes(function)
    found: Optional[Needs] = None
    for node in own:
        if isinstance(node, ast.Call) and (ctx.is_backward(node) or ctx.is_step(node)):
            needs = _needs_of(ctx.parents, function, node)
            if found is None:
                found = needs
            else:
                found = {k: v & needs.get(k, set()) for k, v in found.items()}
                found = {k: v for k, v in found.items() if v}
            if not found:
                return {}
    fixed = _fixed(function, own)
    return {name: need for name, need in (found or {}).items()
            if name in fixed or (name.split(".")[0] in fixed and _mode_kept(ctx, function, name))}


def _mode_kept(ctx: "FileContext", function: Function, key: str) -> bool:
    """Whether ``function`` leaves the mode that ``key`` (``model.training``) reads as its caller set
    it: no statement of its body may change it, and it does not switch gradients back on (under
    ``torch.no_grad()`` the caller's mode is read as eval, see :mod:`trainkit.lint._modes`)."""
    name = key[:-len(".training")]
    return not grad_back_on([function]) and not any(may_change(ctx, stmt, name) for stmt in function.body)


def _argument(function: Function, call: ast.Call, name: str, *, default: bool = False) -> Optional[ast.expr]:
    """What ``call`` passes to ``function``'s parameter ``name`` (or its default, when ``default``
    and the call passes nothing); None when that is not plain to read."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    args = function.args
    params = [a.arg for a in args.posonlyargs + args.args]
    # `self.f(x)` binds the method's first parameter to `self`
    first = 1 if isinstance(call.func, ast.Attribute) and params and not function.decorator_list else 0
    if first and name == params[0]:
        return call.func.value  # type: ignore[attr-defined]
    if name in params:
        index = params.index(name)
        if first <= index < first + len(call.args):
            return call.args[index - first]
        defaults = args.defaults
        offset = index - (len(params) - len(defaults))
        return defaults[offset] if default and offset >= 0 and index >= first + len(call.args) else None
    kwonly = [a.arg for a in args.kwonlyargs]
    if default and name in kwonly:
        return args.kw_defaults[kwonly.index(name)]
    return None


def _contradicts(value: Optional[ast.expr], needs: Set[str]) -> bool:
    """Whether the literal ``value`` (``True``, ``False`` or ``None``) never meets one of ``needs``."""
    if not (isinstance(value, ast.Constant) and (value.value is None or isinstance(value.value, bool))):
        return False
    truthy, none = bool(value.value), value.value is None
    return ((_TRUTHY in needs and not truthy) or (_FALSY in needs and truthy)
            or (_NOT_NONE in needs and none) or (_NONE in needs and not none))


def _value(ctx: "FileContext", function: Function, call: ast.Call, key: str) -> Optional[ast.expr]:
    """What ``call`` gives the switch ``key``: the argument (or default) of a parameter, or for
    ``model.training`` the mode the caller's loop runs its argument in, as a literal; None if unknown."""
    if "." not in key:
        return _argument(function, call, key, default=True)
    root, _, rest = key[:-len(".training")].partition(".")
    base = dotted(_argument(function, call, root) or ast.Constant(None))
    loop = innermost_loop(ctx, call)
    if base is None or loop is None:
        return None
    mode = mode_before(ctx, loop, ".".join(p for p in (base, rest) if p))
    return None if mode is None else ast.Constant(mode)


def guarded_off(ctx: "FileContext", loop: ast.AST, node: ast.AST) -> bool:
    """Whether ``node`` (a backward or a step in ``loop``'s own body) runs only under ``if
    model.training:`` (or after ``if not model.training: return``) where ``model`` is in eval mode
    while its loop runs (:mod:`trainkit.lint._modes`): ``model.eval()`` before the loop."""
    inner = innermost_loop(ctx, node)
    if inner is None:
        return False
    for key, needs in _needs_of(ctx.parents, loop, node).items():  # type: ignore[arg-type]
        if key.endswith(".training"):
            mode = mode_before(ctx, inner, key[:-len(".training")])
            if mode is not None and _contradicts(ast.Constant(mode), needs):
                return True
    return False


def switched_off(ctx: "FileContext", call: ast.Call, functions: List[Function]) -> bool:
    """Whether ``call`` switches off every backward and step of each of ``functions`` (the step
    functions its name may run): it passes ``False`` or ``None`` to a switch (see the module)."""
    return bool(functions) and all(
        any(_contradicts(_value(ctx, function, call, name), needs) for name, needs in ctx.switches(function).items())
        for function in functions)


def never_runs(ctx: "FileContext", function: Function, call: ast.Call, node: ast.AST) -> bool:
    """Whether ``node`` of ``function``'s body never runs when ``call`` runs the function: it needs
    a parameter (never rebound) that the call, or its default, sets to a literal ``True``,
    ``False`` or ``None`` that does not meet it (``if not train: return loss.item()`` for
    ``step(batch)``, ``train=True`` by default)."""
    needs = _needs_of(ctx.parents, function, node)
    if not needs:
        return False
    fixed = _fixed(function, own_nodes(function))
    return any(name.split(".")[0] in fixed and (name in fixed or _mode_kept(ctx, function, name))
               and _contradicts(_value(ctx, function, call, name), need) for name, need in needs.items())


def evaluation_epoch(ctx: "FileContext", loop: ast.AST, calls: List[ast.Call]) -> bool:
    """Whether ``loop`` is in a whole epoch that the file only ever runs as evaluation: ``def
    epoch(loader, model, opt=None): for X, y in loader: ... if opt: loss.backward(); opt.step()``
    whose every call (``epoch(test_loader, model)``; one at least) switches its training off.
    ``calls`` are those of the loop's iteration: each backward and step among them must be under an
    ``if`` (the switch), which most training loops are not, so their function is not read further.

    Read conservatively: the function is the one ``def`` of its name in the file, undecorated, at
    module level or a method; its name is used nowhere but in such calls (``f(...)`` for a function,
    ``self.f(...)`` for a method), so neither passed on (``fn=epoch``) nor rebound. Another module
    importing it is not seen (the file is read alone).
    """
    function = next((p for p in ctx.ancestors(loop) if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                      ast.ClassDef, ast.Lambda))), None)
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.decorator_list:
        return False
    trains = [c for c in calls if ctx.is_backward(c) or ctx.is_step(c)]
    if not trains or not all(any(isinstance(p, ast.If) for p in ctx.ancestors(c, stop=function)) for c in trains):
        return False  # cheap first: a backward or a step that needs no `if` needs no switch
    if not ctx.switches(function):
        return False
    owner = ctx.parents.get(function)
    method = isinstance(owner, ast.ClassDef)
    if not (method or isinstance(owner, ast.Module)):
        return False
    name = function.name
    calls = 0
    for node in ctx.nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            if node is not function:
                return False  # another def of that name: which one runs?
        elif getattr(node, "id", None) == name or (isinstance(node, ast.Attribute) and node.attr == name):
            call = ctx.parents.get(node)  # a Name (the only node with `.id`) or an attribute of that name
            if (not isinstance(call, ast.Call) or call.func is not node
                    or (method != isinstance(node, ast.Attribute))
                    or (method and dotted(node.value) != "self")  # type: ignore[attr-defined]
                    or not switched_off(ctx, call, [function])):
                return False
            calls += 1
        elif isinstance(node, (ast.Import, ast.ImportFrom, ast.Global)) and any(
                (getattr(a, "asname", None) or getattr(a, "name", a)) == name for a in node.names):
            return False
    return calls > 0
