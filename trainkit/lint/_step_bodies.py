"""Same-file functions a training loop calls on every iteration: their statements run every step.

The PyTorch char-RNN tutorial's loop is ``output, loss = train(category_tensor, line_tensor)``, and
``train`` ends in ``return output, loss.item()``; a Trainer's ``fit()`` calls ``self.train_step(batch)``.
Seen from the loop alone, the ``.item()`` (or a ``torch.cuda.empty_cache()``) is hidden in the
call, yet it runs on every step all the same. :func:`called_every_step` gives the rules that are
about what runs every step (TK301, TK302) each such function's body, read as one iteration of a
loop: :class:`trainkit.lint._core.TrainingLoop` over the ``def``, so the conditions inside it
(``if step % 100 == 0:``, ``if step % 10 != 0: return``) are read as in a loop body.

Read conservatively, since a finding in the wrong function is worse than a miss:

* the call is made at every iteration: not under an ``if``, ``case`` or ``except`` of the loop, not
  behind an early exit on a ``%`` test, not in a comprehension (it may run for no item) nor after
  the first operand of ``and``/``or``; each rule adds its own exemptions at the call (TK302's
  ``with torch.no_grad():``);
* the name resolves in the file: ``f(...)`` to the one module-level ``def f`` when nothing else at
  module level binds ``f`` (``f = torch.compile(f)`` does) and no function around the loop has a
  local ``f``; ``self.f(...)`` to the one ``def f`` of the class whose method holds the loop, or
  inherited from a class of the same file (:mod:`trainkit.lint._classes`: the lookup stops at a base
  the file does not define). Nothing imported, and no decorated function (``@torch.no_grad()``
  makes it eval code);
* one level: calls inside the function are not followed, the function is not one that holds the
  loop (recursion), and not a whole epoch (it holds a batch loop of its own: a ``for`` over anything
  but ``range(...)`` that steps, itself or through a step function). A training loop inside the
  function is analysed on its own, as everywhere, and left out of the body read here.
"""
from __future__ import annotations

import ast
import weakref
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Set, Union

from trainkit.lint._calls import calls_step_function, is_batch_loop
from trainkit.lint._classes import Classes
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import pos
from trainkit.lint._switches import never_runs

Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
# A call here may run on no iteration, or not at all: `[f(x) for x in xs]`, a generator never consumed.
_MAYBE = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class Called:
    """A same-file function that ``loop`` calls (at ``call``) on every iteration, and its body read
    as one iteration (``body.node`` is the ``def``)."""

    loop: TrainingLoop
    call: ast.Call
    function: Function
    body: TrainingLoop

    def where(self) -> str:
        """Why a statement of the body runs every step, for the message."""
        return (f"in `{self.function.name}()`, which runs on every step because the training loop on line "
                f"{self.loop.node.lineno} calls it on line {self.call.lineno}")

    def skips(self, node: ast.AST) -> bool:
        """Whether this call never runs ``node``: it needs a flag the call sets otherwise
        (``if not train: return loss.item()`` for ``step(batch)`` with ``train=True``)."""
        return never_runs(self.loop.ctx, self.function, self.call, node)


def _bound(body: List[ast.stmt], args: Optional[ast.arguments] = None) -> Set[str]:
    """The names a scope binds itself (parameters, assignments, ``def``, ``class``, imports, ``del``),
    not those of the scopes nested in it. Comprehension targets count: conservative."""
    out: Set[str] = set()
    if args is not None:
        every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        out.update(a.arg for a in every)
    stack: List[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            out.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return out


class _Functions:
    """The file's functions a call can be resolved to by name, and their bodies (built once per file)."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        tree = ctx.tree
        defs: Dict[str, List[Function]] = {}
        for stmt in tree.body:
            if isinstance(stmt, _FUNCTIONS):
                defs.setdefault(stmt.name, []).append(stmt)
        declared_global = {name for n in ctx.nodes if isinstance(n, ast.Global) for name in n.names}
        module_names = _bound([s for s in tree.body if not isinstance(s, _FUNCTIONS)])
        # bound once, by its `def`: not redefined, rebound (`f = torch.compile(f)`) nor set through `global f`
        self.module = {name: found[0] for name, found in defs.items()
                       if len(found) == 1 and name not in module_names and name not in declared_global}
        # a base class named by a module-level `class` statement alone (not also a `def`, `x = ...`, import)
        not_classes = _bound([s for s in tree.body if not isinstance(s, _FUNCTIONS + (ast.ClassDef,))])
        self.classes = Classes(tree, not_classes | set(defs) | declared_global)
        self.bodies: Dict[int, Optional[TrainingLoop]] = {}
        self.locals: Dict[int, Set[str]] = {}

    def _locals(self, scope: Function) -> Set[str]:
        if id(scope) not in self.locals:
            self.locals[id(scope)] = _bound(scope.body, scope.args)
        return self.locals[id(scope)]

    def resolve(self, loop: TrainingLoop, call: ast.Call) -> Optional[Function]:
        """The function ``call`` (in ``loop``) runs: ``f(...)`` or ``self.f(...)`` (see the module)."""
        func = call.func
        if isinstance(func, ast.Name):
            target = self.module.get(func.id)
            if target is None:
                return None
            around = [p for p in self.ctx.ancestors(loop.node) if isinstance(p, _SCOPES)]
            if any(isinstance(s, _FUNCTIONS) and func.id in self._locals(s) for s in around):
                return None  # a parameter or local of the loop's function (or of one around it)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            around = [p for p in self.ctx.ancestors(loop.node) if isinstance(p, _SCOPES)]
            method = around[0] if around else None
            cls = self.ctx.parents.get(method) if method is not None else None
            if not isinstance(method, _FUNCTIONS) or not isinstance(cls, ast.ClassDef) or method.decorator_list:
                return None  # the loop is not in a plain method
            params = method.args.posonlyargs + method.args.args
            if not params or func.value.id != params[0].arg:
                return None  # `self.helper.f()`, `other.f()`: another object
            found = self.classes.find_method(cls, func.attr)
            if found is None or f"{params[0].arg}.{func.attr}" in self.ctx.assignments:
                return None  # redefined, rebound (`train_step = ...`, `self.train_step = ...`), or unknown
            target = found
        else:
            return None
        if target.decorator_list or any(target is s for s in around):
            return None  # a decorator may change what runs; recursion
        return target

    def _pass_over_data(self, loop: ast.AST) -> bool:
        """A batch loop (:func:`trainkit.lint._calls.is_batch_loop`), also one that steps through a step
        function (``for batch in self.loader: self.train_step(batch)``): what runs after it runs once per pass.
        Not a loop over micro-batches that only runs backwards: what runs after it runs once per step."""
        if is_batch_loop(self.ctx, loop):
            return True
        it = getattr(loop, "iter", None)
        if it is None or (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                          and it.func.id in ("range", "trange")):
            return False  # a `while`, or `for _ in range(n_critic):`: part of a step
        return any(isinstance(n, ast.Call) and calls_step_function(self.ctx, n)
                   for stmt in loop.body for n in ast.walk(stmt))  # type: ignore[attr-defined]

    def body(self, function: Function) -> Optional[TrainingLoop]:
        """The statements one call of ``function`` runs, read as a loop iteration; None for a whole epoch."""
        if id(function) not in self.bodies:
            nodes: List[ast.AST] = []
            stack: List[ast.AST] = list(function.body)
            epoch = False
            while stack:
                node = stack.pop()
                if isinstance(node, _SCOPES):
                    continue
                if isinstance(node, _LOOPS):
                    epoch = epoch or self._pass_over_data(node)
                    if self.ctx.is_training_loop(node):
                        continue  # analysed on its own
                nodes.append(node)
                stack.extend(ast.iter_child_nodes(node))
            nodes.sort(key=pos)
            # Branching only needs a node with a body: the `def` stands for the loop, its body for one iteration.
            body = None if epoch else TrainingLoop(self.ctx, function, nodes)  # type: ignore[arg-type]
            self.bodies[id(function)] = body
        return self.bodies[id(function)]


_CACHE: "weakref.WeakKeyDictionary[FileContext, _Functions]" = weakref.WeakKeyDictionary()


def functions_of(ctx: FileContext) -> "_Functions":
    """The file's functions that calls resolve to (:meth:`_Functions.resolve`), built once per file."""
    functions = _CACHE.get(ctx)
    if functions is None:
        functions = _CACHE[ctx] = _Functions(ctx)
    return functions


def maybe_skipped(ctx: FileContext, loop: TrainingLoop, call: ast.Call) -> bool:
    """In a comprehension, or after the first operand of ``and``/``or``: it may not run at all."""
    child: ast.AST = call
    for parent in ctx.ancestors(call, stop=loop.node):
        if isinstance(parent, _MAYBE) or (isinstance(parent, ast.BoolOp) and child is not parent.values[0]):
            return True
        child = parent
    return False


def called_every_step(ctx: FileContext) -> Iterator[Called]:
    """Each call a training loop makes on every iteration of a same-file function, with its body.

    Loops that step once per epoch (:attr:`TrainingLoop.per_epoch`) are left out, as TK301 and TK302 do.
    A rule reports a statement of the body once, however many loops call the function: the caller
    that comes first in the file names it in the message.
    """
    if not ctx.training_loops:
        return
    functions = functions_of(ctx)
    for loop in ctx.training_loops:
        if loop.per_epoch:
            continue
        for call in loop.calls:
            target = functions.resolve(loop, call)
            if target is None or loop.is_conditional(call) or maybe_skipped(ctx, loop, call):
                continue
            body = functions.body(target)
            if body is not None:
                yield Called(loop, call, target, body)
