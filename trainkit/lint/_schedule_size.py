"""In which unit an LR schedule was sized: optimizer updates, or micro-batches (TK109, TK111).

A schedule built with ``num_training_steps = epochs * len(loader)`` (or
``len(dataset) // batch_size``) counts micro-batches: stepping it at every micro-batch of an
accumulation walks it at the pace it was planned for, its warm-up and decay ending where
intended (the LR only matters at the updates, which sample that curve every ``n`` points). Only
a schedule sized in updates (``len(loader) // n * epochs``, ``args.max_train_steps`` computed
from ``num_update_steps_per_epoch``), or of unknown size, runs ``n`` times too fast
(:func:`sized_in_micro_batches`, which TK109 asks to stay silent: it leans to "micro-batches").

The same schedule stepped once per update runs ``n`` times too slow (TK111).
:func:`counted_in_batches` is the strict reading that rule needs, leaning the other way: a size
counts micro-batches only when it is built from ``len(loader)`` of the very loader the loop
iterates, through products, sums, rounding and divisions by a number only; anything it cannot
read (a name bound twice or by ``x //= n``, a division by a name, ``len(dataset)``) makes it
unknown.
"""
from __future__ import annotations

import ast
import re
import weakref
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from trainkit.lint._core import FileContext
from trainkit.lint._nodes import dotted

# A name that says "accumulation": gradient_accumulation_steps, accum_iter, grad_accum.
_ACCUM_NAME = re.compile(r"accum", re.IGNORECASE)
# Constructor arguments that are not sizes.
_NOT_SIZES = frozenset({"optimizer", "last_epoch", "verbose", "anneal_strategy", "max_lr", "eta_min", "lr_lambda"})


def _constructors(ctx: FileContext, name: str) -> List[ast.Call]:
    """The calls assigned to ``name`` in the file: ``scheduler = get_linear_schedule_with_warmup(...)``
    (also ``scheduler: LRScheduler = ...``)."""
    return [value for value in ctx.assignments.get(name, ()) if isinstance(value, ast.Call)]


def _expanded(expr: ast.expr, values: Dict[str, List[ast.expr]], depth: int = 0) -> List[ast.AST]:
    """The nodes of ``expr`` and, through the names it reads, of the values they were assigned."""
    nodes: List[ast.AST] = list(ast.walk(expr))
    if depth >= 4:
        return nodes
    for node in list(nodes):
        name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        for value in values.get(name or "", ()):
            if value is not expr:
                nodes.extend(_expanded(value, values, depth + 1))
    return nodes


def _sizes(call: ast.Call) -> List[ast.expr]:
    """The arguments of a scheduler's constructor that may be sizes (not the optimizer, not ``max_lr``)."""
    return list(call.args[1:]) + [k.value for k in call.keywords if k.arg not in _NOT_SIZES]


def _mentions_accumulation(nodes: Sequence[ast.AST], every: str) -> bool:
    """Whether ``nodes`` mention the accumulation's ``every`` (as written in its ``%``) or a name about accumulation."""
    for node in nodes:
        if isinstance(node, ast.expr) and ast.unparse(node) == every:
            return True
        name: Optional[str] = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if name is not None and _ACCUM_NAME.search(name):
            return True
    return False


def sized_in_micro_batches(ctx: FileContext, scheduler: str, every: str) -> bool:
    """Whether the schedule ``scheduler`` was built with a size counted in micro-batches.

    True when the sizes passed to its constructor (through the names they read) take a
    ``len(...)`` and nowhere mention the accumulation's ``every`` (as written in its ``%``)
    nor a name about accumulation. False when unknown.
    """
    calls = _constructors(ctx, scheduler)
    if len(calls) != 1:
        return False
    sizes = _sizes(calls[0])
    if not sizes:
        return False
    nodes = [n for size in sizes for n in _expanded(size, ctx.assignments)]
    if _mentions_accumulation(nodes, every):
        return False
    return any(isinstance(n, ast.Call) and dotted(n.func) == "len" for n in nodes)


# The units of counts, for counted_in_batches: micro-batches of the loader, a plain count that
# says nothing of its unit (a number, an argument, a config value), or unknown.
_BATCHES, _PLAIN, _UNKNOWN = "batches", "plain", "unknown"
_ROUNDING = frozenset({"int", "float", "round", "ceil", "floor"})
# Calls around a loader in a ``for``: ``enumerate(tqdm(loader))``.
_WRAPPERS = frozenset({"enumerate", "tqdm", "iter"})
# Bodies of their own: a plain name bound in one is another variable than in the next.
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def loop_loader(loop: ast.AST) -> Optional[str]:
    """``train_loader`` for ``for i, batch in enumerate(tqdm(train_loader)):``; None for a ``while`` or another iterable."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return None
    it = loop.iter
    while isinstance(it, ast.Call) and it.args and (dotted(it.func) or "").split(".")[-1] in _WRAPPERS:
        it = it.args[0]
    return dotted(it)


def _number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


class _Bindings:
    """Where names are bound, by scope: a plain name (a local variable) is looked up in the scope
    that reads it, else at module level; a dotted one (``self.total``, ``args.steps``) anywhere
    in the file. Built once per file, in one pass."""

    def __init__(self, ctx: FileContext) -> None:
        scopes: Dict[ast.AST, Optional[ast.AST]] = {}
        for node in ctx.nodes:  # ast.walk order: a parent before its children
            parent = ctx.parents.get(node)
            scopes[node] = parent if isinstance(parent, _SCOPES) else scopes.get(parent) if parent is not None else None
        self.scopes = scopes
        self.values: Dict[Tuple[int, str], List[ast.expr]] = {}
        for name, values in ctx.assignments.items():
            for value in values:
                self.values.setdefault(self.key(name, value), []).append(value)
        self.stores: Dict[Tuple[int, str], int] = {}
        for node in ctx.nodes:
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
                name = dotted(node)
                if name is not None:
                    key = self.key(name, node)
                    self.stores[key] = self.stores.get(key, 0) + 1

    def key(self, name: str, node: ast.AST) -> Tuple[int, str]:
        scope = self.scopes.get(node) if "." not in name else None
        return (id(scope) if scope is not None else 0, name)

    def lookup(self, name: str, node: ast.AST) -> Tuple[List[ast.expr], bool]:
        """The values bound to ``name`` as read at ``node``, and whether they are all its bindings
        (False when it is also bound another way: ``x //= n``, a ``for`` target, ``a, b = f()``)."""
        key = self.key(name, node)
        if key not in self.values and key not in self.stores:
            scope = self.scopes.get(node)
            if "." not in name and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and any(
                    a.arg == name for a in ast.walk(scope.args) if isinstance(a, ast.arg)):
                return [], True  # an argument: whatever the caller passes
            key = (0, name)  # not bound in this scope: a module-level name
        values = self.values.get(key, [])
        return values, self.stores.get(key, 0) <= len(values)


_BINDINGS: "weakref.WeakKeyDictionary[FileContext, _Bindings]" = weakref.WeakKeyDictionary()


def _bindings(ctx: FileContext) -> _Bindings:
    if ctx not in _BINDINGS:
        _BINDINGS[ctx] = _Bindings(ctx)
    return _BINDINGS[ctx]


def constructor_for(ctx: FileContext, scheduler: str, step: ast.AST, prepared: Sequence[ast.Call] = ()) -> Optional[ast.Call]:
    """The one call that built ``scheduler`` as stepped at ``step``: for a plain name (a local
    variable), the one bound in the function that steps it (or at module level); for a dotted
    one, the only one in the file. None when unsure (bound twice, or another way too). A binding
    by one of the ``prepared`` calls (accelerate's ``sched = accelerator.prepare(sched)``, or
    ``model, sched = accelerator.prepare(model, sched)``) keeps the same schedule."""
    bindings = _bindings(ctx)
    values, complete = bindings.lookup(scheduler, step)
    kept = [v for v in values if not any(v is c for c in prepared)]
    if kept and (not complete or len(kept) < len(values)):
        key = bindings.key(scheduler, kept[0])
        rebound = 0
        for call in prepared:
            parent = ctx.parents.get(call)
            if isinstance(parent, ast.Assign) and any(
                    dotted(t) == scheduler and bindings.key(scheduler, t) == key for target in parent.targets for t in ast.walk(target)):
                rebound += 1
        complete = bindings.stores.get(key, 0) <= len(kept) + rebound
    calls = [v for v in kept if isinstance(v, ast.Call)]
    return calls[0] if complete and len(kept) == 1 and len(calls) == 1 else None


def bound_value(ctx: FileContext, name: str, node: ast.AST) -> Optional[ast.expr]:
    """The one value ``name`` is bound to as read at ``node`` (by scope, as for a constructor), or None."""
    values, complete = _bindings(ctx).lookup(name, node)
    return values[0] if complete and len(values) == 1 else None


def same_scope(ctx: FileContext, a: ast.AST, b: ast.AST) -> bool:
    """Whether ``a`` and ``b`` sit in the same function (or both at module level)."""
    scopes = _bindings(ctx).scopes
    return scopes.get(a) is scopes.get(b)


class _Units:
    """Reads the unit of a count expression (see :func:`counted_in_batches`), with a budget of nodes.

    ``accumulation`` is set when a node read, through the names it follows, mentions the
    accumulation: its ``every`` as written, or a name containing ``accum``. ``origin`` is the
    first ``len(loader)`` read as micro-batches.
    """

    def __init__(self, ctx: FileContext, loader: str, every: str) -> None:
        self.bindings = _bindings(ctx)
        self.loader = loader
        self.every = every
        self.budget = 2000  # nodes read, through names too: a pathological file gets "unknown"
        self.accumulation = False
        self.origin: Optional[ast.Call] = None

    def unit(self, expr: ast.AST, depth: int = 0) -> str:
        self.budget -= 1
        if self.budget < 0 or depth > 40:
            return _UNKNOWN
        name = dotted(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
        if isinstance(expr, (ast.Name, ast.Attribute, ast.Constant, ast.Subscript)) and (
                ast.unparse(expr) == self.every or (name is not None and _ACCUM_NAME.search(name))):
            self.accumulation = True
        if _number(expr):
            return _PLAIN
        if name is not None:
            values, complete = self.bindings.lookup(name, expr)
            units = {self.unit(v, depth + 1) for v in values} or {_PLAIN}  # unbound: an argument, a config value
            if not complete:
                return _UNKNOWN  # also bound another way: `total //= n`, a `for` target, `a, b = f()`
            return units.pop() if len(units) == 1 else _UNKNOWN
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
            return self.unit(expr.operand, depth + 1)
        if isinstance(expr, ast.BinOp):
            return self._binop(expr, depth)
        if isinstance(expr, ast.Call):
            return self._call(expr, depth)
        if isinstance(expr, ast.IfExp):
            self.unit(expr.test, depth + 1)
            units = {self.unit(expr.body, depth + 1), self.unit(expr.orelse, depth + 1)}
            return units.pop() if len(units) == 1 else _UNKNOWN
        return self._opaque(expr, depth)

    def _opaque(self, expr: ast.AST, depth: int) -> str:
        """A value the linter does not compute (``cfg["steps"]``, ``f(x)``): a plain count, unless what
        it reads counts batches or is unknown. Its parts are still read, for ``accumulation``."""
        units = {self.unit(child, depth + 1) for child in ast.iter_child_nodes(expr) if isinstance(child, ast.expr)}
        return _UNKNOWN if units & {_BATCHES, _UNKNOWN} else _PLAIN

    def _binop(self, expr: ast.BinOp, depth: int) -> str:
        left, right = self.unit(expr.left, depth + 1), self.unit(expr.right, depth + 1)
        if _UNKNOWN in (left, right):
            return _UNKNOWN
        if isinstance(expr.op, (ast.Div, ast.FloorDiv)):
            # `total // 10` keeps the unit; a division by anything but a number may be by the accumulation
            return left if right == _PLAIN and _number(expr.right) else _UNKNOWN
        if isinstance(expr.op, ast.Mult):
            return _UNKNOWN if left == right == _BATCHES else (_BATCHES if _BATCHES in (left, right) else _PLAIN)
        if isinstance(expr.op, (ast.Add, ast.Sub)):
            return _BATCHES if _BATCHES in (left, right) else _PLAIN
        return _UNKNOWN if _BATCHES in (left, right) else _PLAIN

    def _call(self, call: ast.Call, depth: int) -> str:
        func = (dotted(call.func) or "").split(".")[-1]
        if dotted(call.func) == "len":
            if len(call.args) == 1 and dotted(call.args[0]) == self.loader:
                self.origin = self.origin or call
                return _BATCHES
            return _UNKNOWN  # len(dataset): samples, or another loader's batches
        if func in _ROUNDING and len(call.args) == 1 and not call.keywords:
            return self.unit(call.args[0], depth + 1)
        if func in ("min", "max") and call.args and not call.keywords:
            units = [self.unit(a, depth + 1) for a in call.args]
            if _UNKNOWN in units:
                return _UNKNOWN
            if _BATCHES not in units:
                return _PLAIN
            # max(1, total) is still total; min(args.max_steps, total) may be either
            return _BATCHES if all(u == _BATCHES or _number(a) for u, a in zip(units, call.args)) else _UNKNOWN
        return self._opaque(call, depth)


def _warmups(ctx: FileContext, call: ast.Call) -> List[ast.expr]:
    """The warm-up sizes of a scheduler's constructor: a keyword naming a warm-up, or the warm-up
    position of transformers' factories (``get_linear_schedule_with_warmup(optimizer, warmup, total)``,
    ``get_scheduler(name, optimizer, warmup, total)``)."""
    out = [k.value for k in call.keywords if k.arg and "warmup" in k.arg]
    func = (ctx.qualname(call.func) or "").split(".")[-1]
    index = 2 if func == "get_scheduler" else 1 if "warmup" in func else None
    if index is not None and len(call.args) > index:
        out.append(call.args[index])
    return out


@dataclass(frozen=True)
class BatchSized:
    """A schedule sized in micro-batches: the ``len(loader)`` in its total size, and whether its
    warm-up is counted in micro-batches too."""

    counted: ast.Call
    warmup_too: bool


def counted_in_batches(ctx: FileContext, constructor: ast.Call, loader: str, every: str) -> Optional[BatchSized]:
    """Whether the schedule built by ``constructor`` is sized in micro-batches of ``loader``; None when unsure.

    Found only when none of its sizes mentions the accumulation (``every`` or a name with
    ``accum``), a size other than a warm-up is built from ``len(loader)`` (through the names it
    reads: ``epochs * len(loader)``, ``total // 10``, ``int(...)``, ``math.ceil(...)``,
    ``max(1, ...)``), and no size is of unknown unit: a division by a name
    (``len(loader) // n``), ``len`` of anything else, a name bound more than one way. A plain
    count (a number, an argument, a config value) is no size in micro-batches, nor in
    updates: it is left aside. A warm-up alone in micro-batches, with a total of plain count,
    is not enough: one epoch of warm-up over a total counted in updates may be meant.
    """
    units = _Units(ctx, loader, every)
    warmups = _warmups(ctx, constructor)
    total: Optional[ast.Call] = None
    warmup_too = False
    for size in _sizes(constructor):
        units.origin = None
        unit = units.unit(size)
        if unit == _UNKNOWN:
            return None
        if unit == _BATCHES:
            if any(size is w for w in warmups):
                warmup_too = True
            else:
                total = total or units.origin
    if units.accumulation or total is None:
        return None
    return BatchSized(total, warmup_too)
