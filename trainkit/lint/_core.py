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
loop). A function defined in a loop's body and called there, as timm's ``_backward(loss)``, is
inlined at its calls first (:mod:`trainkit.lint._inline`). A loop that steps nothing and runs its
backwards only for an input's gradient (an attack, a saliency map: :mod:`trainkit.lint._input_grads`)
or to read the parameters' gradients (a Fisher estimate: :mod:`trainkit.lint._grad_stats`) is no
training loop.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Dict, FrozenSet, Iterator, List, Optional, Set, Tuple, Union

from trainkit.lint._calls import calls_step_function, step_function_defs
from trainkit.lint._conditions import Branching
from trainkit.lint._grad_stats import gradient_statistics
from trainkit.lint._inline import inline_loop_functions
from trainkit.lint._input_grads import input_backwards_only, nodes_before
from trainkit.lint._nodes import dotted, is_reciprocal, method_name, pos, receiver
from trainkit.lint._switches import evaluation_epoch, guarded_off, switches

LoopNode = Union[ast.For, ast.AsyncFor, ast.While]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
# Bodies that run at another time than the loop iteration that contains them.
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


_OPTIMIZER_RE = re.compile(r"optim|(^|_)opt(_|$|\d)", re.IGNORECASE)
# ``optD``/``optG``/``opt_D``: "opt" then a capital, case-sensitive so ``options``/``opts`` stay out.
_OPTIMIZER_CAMEL_RE = re.compile(r"(^|_)opt[A-Z]")
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
        if inline_loop_functions(tree, self.nodes):  # timm's `def _backward(loss): ...` in a loop body
            self.nodes = list(ast.walk(tree))
        for parent in self.nodes:
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        self._training: Dict[ast.AST, bool] = {}
        # ids of the backwards that train nothing (an attack's, a Fisher estimate's): none of a step's
        self.probe_backwards: Set[int] = set()

    @cached_property
    def assignments(self) -> Dict[str, List[ast.expr]]:
        """Every dotted name assigned in the file (``x = ...``, ``self.x = ...``, ``x: int = ...``, and
        ``a, b = x, y`` element by element) -> its values."""
        out: Dict[str, List[ast.expr]] = {}
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                pairs = [(target, node.value) for target in node.targets]
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                pairs = [(node.target, node.value)]
            else:
                continue
            while pairs:
                target, value = pairs.pop()
                if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and len(
                        target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred) for e in target.elts):
                    pairs.extend(zip(target.elts, value.elts))
                    continue
                name = dotted(target)
                if name is not None:
                    out.setdefault(name, []).append(value)
        return out

    # -- imports ------------------------------------------------------------

    @cached_property
    def aliases(self) -> Dict[str, str]:
        """Local name -> fully qualified name, from the file's imports."""
        out: Dict[str, str] = {}
        fallbacks: Dict[str, str] = {}
        for node in self.nodes:
            # ``try: from torch.amp import GradScaler / except ImportError: from torch.cuda.amp
            # import GradScaler``: the import in the handler only runs where the first one fails.
            bound = fallbacks if any(isinstance(p, ast.ExceptHandler) for p in self.ancestors(node)) else out
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        bound[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for name, full in fallbacks.items():
            out.setdefault(name, full)
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
        """Names assigned from a call whose qualified name matches ``wanted`` (see :attr:`assignments`)."""
        return {name for name, values in self.assignments.items()
                if any(isinstance(v, ast.Call) and wanted.search(self.qualname(v.func) or "") for v in values)}

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
    def reciprocal_names(self) -> FrozenSet[str]:
        """Names only ever bound to a reciprocal: ``loss_scale = 1.0 / accum`` (for ``loss * loss_scale``)."""
        good: Set[str] = set()
        bad: Set[str] = set()
        for node in self.nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                for target in targets:
                    name = dotted(target)
                    if name is None:
                        continue
                    if isinstance(node, ast.AugAssign) or value is None or not is_reciprocal(value):
                        bad.add(name)
                    else:
                        good.add(name)
        return frozenset(good - bad)

    @cached_property
    def optimizer_names(self) -> FrozenSet[str]:
        """Names assigned from an optimizer constructor (``torch.optim.AdamW(...)``)."""
        return frozenset(self._assigned_from(_OPTIMIZER_CLASSES))

    @cached_property
    def parameter_optimizers(self) -> Dict[str, FrozenSet[str]]:
        """Model name -> the optimizers built on its parameters, from the file's constructors:
        ``optimizerD = optim.Adam(netD.parameters(), ...)`` gives ``{"netD": {"optimizerD"}}``
        (``list(a.parameters()) + list(b.parameters())`` gives both models that optimizer). A
        model missing here (its optimizer passed in, or built by a helper) has unknown optimizers.
        Used to tell a GAN's ``netD.zero_grad()`` from one that touches the other half's gradients."""
        out: Dict[str, Set[str]] = {}
        for name in self.optimizer_names:
            for value in self.assignments.get(name, []):
                if not isinstance(value, ast.Call):
                    continue
                for node in ast.walk(value):
                    if isinstance(node, ast.Call) and method_name(node) in ("parameters", "named_parameters"):
                        model = receiver(node)
                        if model is not None:
                            out.setdefault(model, set()).add(name)
        return {model: frozenset(opts) for model, opts in out.items()}

    def zeroes_only_others(self, owner: Optional[str], optimizer: Optional[str]) -> bool:
        """Whether zeroing ``owner``'s gradients (``owner.zero_grad()``, or ``p.grad = None`` over
        ``owner.parameters()``) leaves ``optimizer``'s alone: ``owner`` is another optimizer, or a
        model whose parameters the file hands only to other optimizers (a GAN's other half)."""
        if owner is None or optimizer is None:
            return False
        if self.is_optimizer(owner):
            return owner != optimizer
        opts = self.parameter_optimizers.get(owner)
        return opts is not None and optimizer not in opts

    def is_optimizer(self, name: Optional[str]) -> bool:
        """Whether a dotted name looks like an optimizer (and not an LR scheduler)."""
        if not name or _SCHEDULER_RE.search(name):
            return False
        last = name.split(".")[-1]
        return name in self.optimizer_names or bool(_OPTIMIZER_RE.search(last) or _OPTIMIZER_CAMEL_RE.search(last))

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

    @cached_property
    def step_function_defs(self) -> Dict[str, List[ast.AST]]:
        """The file's functions whose own body (outside loops) runs backward or a step, by name."""
        return step_function_defs(self)  # type: ignore[return-value]

    @cached_property
    def step_functions(self) -> FrozenSet[str]:
        """The names of :attr:`step_function_defs`."""
        return frozenset(self.step_function_defs)

    def switches(self, function: ast.AST) -> Dict[str, str]:
        """The parameters that switch ``function``'s training off (:mod:`trainkit.lint._switches`), cached."""
        cache = self.__dict__.setdefault("_switches", {})
        if id(function) not in cache:
            cache[id(function)] = switches(self, function)  # type: ignore[arg-type]
        return cache[id(function)]

    def is_training_loop(self, loop: LoopNode) -> bool:
        """Whether ``loop``'s own body calls ``.backward(``, an optimizer step, or a step function."""
        if loop not in self._training:
            self._training[loop] = False  # guards against cycles; loops nest as a tree
            region = self._region(loop)
            calls = [n for n in region if isinstance(n, ast.Call)]
            # a backward or step under `if model.training:` after `model.eval()` never runs there
            steps = any((self.is_step(n) and not guarded_off(self, loop, n)) or calls_step_function(self, n)
                        for n in calls)
            backwards = [n for n in calls if self.is_backward(n) and not guarded_off(self, loop, n)
                         and id(n) not in self.probe_backwards]
            if not steps and backwards and (input_backwards_only(self, backwards, region, nodes_before(self, loop))
                                            or gradient_statistics(self, loop, region, backwards)):
                # an attack or a saliency map (an input's gradient; inside a loop that steps, adversarial
                # training, part of that loop's iteration: its `model.zero_grad()` wipes an accumulation's
                # window), or a Fisher estimate: nothing steps, and its backwards are none of a step's
                self.probe_backwards.update(id(b) for b in backwards)
            else:  # unless in a whole epoch that each call of the file runs as evaluation (`opt=None`)
                self._training[loop] = (steps or bool(backwards)) and not evaluation_epoch(self, loop, calls)
        return self._training[loop]

    @cached_property
    def training_loops(self) -> List["TrainingLoop"]:
        """Every training loop of the file, in source order."""
        loops = [n for n in self.nodes if isinstance(n, _LOOPS)]
        loops.sort(key=pos)
        return [TrainingLoop(self, loop, self._region(loop)) for loop in loops if self.is_training_loop(loop)]

    @cached_property
    def epoch_loops(self) -> FrozenSet[int]:
        """Ids of the loops around a batch loop: the nearest loop (in its function) enclosing a training
        loop that is a ``for`` over anything but ``range(...)`` (a pass over the data)."""
        out: Set[int] = set()
        for loop in self.training_loops:
            it = getattr(loop.node, "iter", None)
            if it is None or (isinstance(it, ast.Call) and dotted(it.func) in ("range", "trange")):
                continue
            for parent in self.ancestors(loop.node):
                if isinstance(parent, _SCOPES):
                    break
                if isinstance(parent, _LOOPS):
                    out.add(id(parent))
                    break
        return frozenset(out)

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
class TrainingLoop(Branching):
    """A training loop and the nodes of its own iteration, in source order.

    Which conditions each node runs under (``guards``, ``branches``, ``exclusive``,
    ``modulo_guard``) comes from :class:`trainkit.lint._conditions.Branching`.
    """

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
        return [c for c in self.calls if self.ctx.is_backward(c) and id(c) not in self.ctx.probe_backwards]

    @cached_property
    def step_calls(self) -> List[ast.Call]:
        """The optimizer / scaler ``.step(`` calls of the iteration."""
        return [c for c in self.calls if self.ctx.is_step(c)]

    @cached_property
    def per_epoch(self) -> bool:
        """An epoch loop that steps but runs no backward of its own: it holds a batch loop, and its own
        step (one for a short last window, as TK112 asks) runs once per pass, not at every batch."""
        return id(self.node) in self.ctx.epoch_loops and not self.backward_calls
