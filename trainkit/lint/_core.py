"""The AST model shared by the rules: names, imports, training loops.

Everything here is static: the user's code is parsed with :mod:`ast` and never
imported or run, so the linter works on a machine without torch or a GPU.

A *training loop* is a ``for``/``while`` loop whose own body calls ``.backward(``
or an optimizer/scaler ``.step(``. "Own body" means the statements of the loop
including nested blocks and nested non-training loops, but not nested
function, lambda or class bodies (a ``def closure():`` is only *called* by
``optimizer.step(closure)``, so it is not analysed as part of the loop) and not
a nested loop that is itself a training loop (that one is analysed on its own,
so an epoch loop around a batch loop reports each mistake once, at the batch
loop).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Dict, FrozenSet, Iterator, List, Optional, Set, Tuple, Union

LoopNode = Union[ast.For, ast.AsyncFor, ast.While]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
# Bodies that run at another time than the loop iteration that contains them.
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


# --------------------------------------------------------------------------- names


def dotted(node: ast.AST) -> Optional[str]:
    """Return ``"a.b.c"`` for a Name/Attribute chain, else ``None``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def method_name(call: ast.Call) -> Optional[str]:
    """Return ``"step"`` for ``x.step(...)``; ``None`` for a plain function call."""
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def receiver(call: ast.Call) -> Optional[str]:
    """Return the dotted receiver of a method call: ``"self.opt"`` for ``self.opt.step()``."""
    return dotted(call.func.value) if isinstance(call.func, ast.Attribute) else None


def has_modulo(test: ast.AST) -> bool:
    """Whether an ``if`` test computes ``a % b`` (string formatting ``"%s" % x`` excluded)."""
    return find_modulo(test) is not None


def find_modulo(test: ast.AST) -> Optional[ast.BinOp]:
    """Return the first ``a % b`` in ``test`` whose left side is not a string literal."""
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            if not (isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)):
                return node
    return None


def names_in(node: ast.AST) -> Iterator[str]:
    """Yield every identifier and attribute name mentioned in ``node``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr


def pos(node: ast.AST) -> Tuple[int, int]:
    """Source position used to order statements inside one loop iteration."""
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


_OPTIMIZER_RE = re.compile(r"optim|(^|_)opt(_|$|\d)", re.IGNORECASE)
_SCHEDULER_RE = re.compile(r"sched", re.IGNORECASE)
_SCALER_CLASS = re.compile(r"GradScaler$")
_OPTIMIZER_CLASSES = re.compile(r"^torch\.optim\.(?!lr_scheduler)|Optimizer$|^(Adam|AdamW|SGD|RMSprop|Adagrad|LBFGS)$")


# --------------------------------------------------------------------------- file model


class FileContext:
    """A parsed file plus the facts several rules share (imports, loops, names).

    Example::

        ctx = FileContext("t.py", source, ast.parse(source))
        [loop.node.lineno for loop in ctx.training_loops]
    """

    def __init__(self, path: str, source: str, tree: ast.Module) -> None:
        self.path = path
        self.source = source
        self.tree = tree
        self.parents: Dict[ast.AST, ast.AST] = {}
        # One walk, reused by every rule: walking big files is most of the cost.
        self.nodes: List[ast.AST] = list(ast.walk(tree))
        for parent in self.nodes:
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        self._training: Dict[ast.AST, bool] = {}

    # -- imports ------------------------------------------------------------

    @cached_property
    def aliases(self) -> Dict[str, str]:
        """Local name -> fully qualified name, from the file's imports."""
        out: Dict[str, str] = {}
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        out[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        out[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        return out

    def qualname(self, node: ast.AST) -> Optional[str]:
        """Resolve ``amp.autocast`` to ``torch.cuda.amp.autocast`` through the imports."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        full = self.aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    @cached_property
    def references(self) -> List[Tuple[ast.AST, str]]:
        """Every maximal Name/Attribute chain read by the file, with its qualified name.

        Maximal means ``torch.cuda.amp.autocast`` is listed once, not also as
        ``torch.cuda.amp`` and ``torch.cuda``.
        """
        out: List[Tuple[ast.AST, str]] = []
        for node in self.nodes:
            if isinstance(node, (ast.Name, ast.Attribute)) and not isinstance(self.parents.get(node), ast.Attribute):
                if isinstance(getattr(node, "ctx", None), ast.Load):
                    qual = self.qualname(node)
                    if qual is not None:
                        out.append((node, qual))
        return out

    @cached_property
    def calls(self) -> List[ast.Call]:
        """Every call in the file, in source order."""
        return sorted((n for n in self.nodes if isinstance(n, ast.Call)), key=pos)

    # -- names of things ----------------------------------------------------

    def _assigned_from(self, wanted: "re.Pattern[str]") -> Set[str]:
        """Names assigned from a call whose qualified name matches ``wanted``."""
        found: Set[str] = set()
        for node in self.nodes:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                if wanted.search(self.qualname(node.value.func) or ""):
                    found.update(n for n in map(dotted, node.targets) if n)
        return found

    @cached_property
    def scaler_names(self) -> FrozenSet[str]:
        """Names that hold a GradScaler: built from ``GradScaler(...)``, called ``.scale(``, or named so."""
        found = self._assigned_from(_SCALER_CLASS)
        for node in self.nodes:
            if isinstance(node, ast.Call) and method_name(node) == "scale":
                found.add(receiver(node) or "")
            elif isinstance(node, (ast.Name, ast.Attribute)):
                name = dotted(node)
                if name and "scaler" in name.split(".")[-1].lower():
                    found.add(name)
        found.discard("")
        return frozenset(found)

    @cached_property
    def optimizer_names(self) -> FrozenSet[str]:
        """Names assigned from an optimizer constructor (``torch.optim.AdamW(...)``)."""
        return frozenset(self._assigned_from(_OPTIMIZER_CLASSES))

    def is_optimizer(self, name: Optional[str]) -> bool:
        """Whether a dotted name looks like an optimizer (and not an LR scheduler)."""
        if not name or _SCHEDULER_RE.search(name):
            return False
        return name in self.optimizer_names or bool(_OPTIMIZER_RE.search(name.split(".")[-1]))

    def is_scaler(self, name: Optional[str]) -> bool:
        """Whether a dotted name holds a ``GradScaler``."""
        return bool(name) and name in self.scaler_names

    def is_step(self, call: ast.Call) -> bool:
        """``optimizer.step()``, ``scaler.step(opt)`` or ``amp.step(opt)``; not ``scheduler.step()``."""
        if method_name(call) != "step":
            return False
        name = receiver(call)
        if name and _SCHEDULER_RE.search(name):
            return False
        if self.is_optimizer(name) or self.is_scaler(name):
            return True
        # trainkit's ``amp.step(optimizer)`` and similar wrappers take the optimizer.
        return any(self.is_optimizer(dotted(arg)) for arg in call.args)

    @staticmethod
    def is_backward(call: ast.Call) -> bool:
        """``loss.backward()``, ``amp.backward(loss)``, ``torch.autograd.backward(loss)``."""
        return method_name(call) == "backward"

    @cached_property
    def mentions_cuda(self) -> bool:
        """Whether the file targets CUDA: ``.cuda()``, ``torch.cuda``, ``"cuda"`` or ``"cuda:0"``."""
        for node in self.nodes:
            if isinstance(node, ast.Attribute) and node.attr == "cuda":
                return True
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "cuda" in node.value.lower():
                return True
        return False

    # -- loops --------------------------------------------------------------

    def _region(self, loop: LoopNode) -> List[ast.AST]:
        out: List[ast.AST] = []
        stack: List[ast.AST] = list(loop.body)
        while stack:
            node = stack.pop()
            if isinstance(node, _SCOPES):
                continue
            if isinstance(node, _LOOPS) and self.is_training_loop(node):
                continue
            out.append(node)
            stack.extend(ast.iter_child_nodes(node))
        out.sort(key=pos)
        return out

    def is_training_loop(self, loop: LoopNode) -> bool:
        """Whether ``loop``'s own body calls ``.backward(`` or an optimizer step."""
        if loop not in self._training:
            self._training[loop] = False  # guards against cycles; loops nest as a tree
            region = self._region(loop)
            self._training[loop] = any(
                isinstance(n, ast.Call) and (self.is_backward(n) or self.is_step(n)) for n in region
            )
        return self._training[loop]

    @cached_property
    def training_loops(self) -> List["TrainingLoop"]:
        """Every training loop of the file, in source order."""
        loops = [n for n in self.nodes if isinstance(n, _LOOPS)]
        loops.sort(key=pos)
        return [TrainingLoop(self, loop, self._region(loop)) for loop in loops if self.is_training_loop(loop)]

    def ancestors(self, node: ast.AST, *, stop: Optional[ast.AST] = None) -> Iterator[ast.AST]:
        """Yield the parents of ``node`` up to (not including) ``stop`` or the module."""
        current = self.parents.get(node)
        while current is not None and current is not stop:
            yield current
            current = self.parents.get(current)

    def inside_with(self, node: ast.AST, suffixes: Tuple[str, ...], *, stop: Optional[ast.AST] = None) -> bool:
        """Whether ``node`` runs under ``with X(...)`` where X's name ends with one of ``suffixes``."""
        for parent in self.ancestors(node, stop=stop):
            if isinstance(parent, (ast.With, ast.AsyncWith)):
                for item in parent.items:
                    expr = item.context_expr
                    target = expr.func if isinstance(expr, ast.Call) else expr
                    name = dotted(target) or ""
                    if name.split(".")[-1].endswith(suffixes):
                        return True
        return False


@dataclass(frozen=True)
class TrainingLoop:
    """A training loop and the nodes of its own iteration, in source order."""

    ctx: FileContext
    node: LoopNode
    region: List[ast.AST]

    # cached_property writes to the instance __dict__, which a frozen dataclass allows.
    @cached_property
    def calls(self) -> List[ast.Call]:
        """Calls made by one iteration, in source order."""
        return [n for n in self.region if isinstance(n, ast.Call)]

    @cached_property
    def backward_calls(self) -> List[ast.Call]:
        """The ``.backward(`` calls of the iteration."""
        return [c for c in self.calls if self.ctx.is_backward(c)]

    @cached_property
    def step_calls(self) -> List[ast.Call]:
        """The optimizer / scaler ``.step(`` calls of the iteration."""
        return [c for c in self.calls if self.ctx.is_step(c)]

    def guards(self, node: ast.AST) -> List[ast.AST]:
        """The ``if``/``except``/``with`` blocks between ``node`` and the loop, innermost first.

        For an ``if`` the node is returned only when ``node`` sits in its body
        or else branch (not in its test).
        """
        out: List[ast.AST] = []
        child = node
        for parent in self.ctx.ancestors(node, stop=self.node):
            if isinstance(parent, ast.If) and child is not parent.test:
                out.append(parent)
            elif isinstance(parent, (ast.ExceptHandler, ast.With, ast.AsyncWith, ast.IfExp)):
                out.append(parent)
            child = parent
        return out

    def is_conditional(self, node: ast.AST) -> bool:
        """Whether ``node`` is skipped on some iterations (under an ``if`` or ``except``)."""
        return any(isinstance(g, (ast.If, ast.ExceptHandler, ast.IfExp)) for g in self.guards(node))

    def exclusive(self, a: ast.AST, b: ast.AST) -> bool:
        """Whether ``a`` and ``b`` sit in opposite branches of one ``if`` (never both run)."""
        branch_of_a: Dict[ast.AST, str] = {}
        child = a
        for parent in self.ctx.ancestors(a, stop=self.node):
            if isinstance(parent, ast.If):
                branch_of_a[parent] = "body" if any(child is s for s in parent.body) else "orelse"
            child = parent
        child = b
        for parent in self.ctx.ancestors(b, stop=self.node):
            if parent in branch_of_a:
                side = "body" if any(child is s for s in parent.body) else "orelse"
                return side != branch_of_a[parent]
            child = parent
        return False

    def modulo_guard(self, node: ast.AST) -> Optional[ast.If]:
        """The innermost enclosing ``if`` whose test uses ``%``, if any."""
        for guard in self.guards(node):
            if isinstance(guard, ast.If) and has_modulo(guard.test):
                return guard
        return None
