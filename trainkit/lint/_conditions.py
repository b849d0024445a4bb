"""When a statement of a training loop's iteration runs: the conditions around it.

:class:`Branching` is the part of :class:`trainkit.lint._core.TrainingLoop` that answers
which ``if``/``case``/``except`` blocks a node sits in, on which side, whether two nodes
ever run in the same iteration, and which ``if`` tests a modulo (an accumulation's
``if (i + 1) % n == 0:``).

Two spellings of such a test are followed besides the plain ``if``:

* an *early exit*: ``if (i + 1) % n != 0: continue`` (a branch ending in ``continue``)
  guards the rest of its block, which runs only on the other side of that ``if``
  (timm's train loop). Only exits whose test uses ``%`` count: ``if x is None: continue``
  filters data and leaves the rest running on (nearly) every batch. ``break``/``return``
  exit too, and a nested exit is read as one ``if`` (see :mod:`trainkit.lint._exits`);
* a *named test*: ``need_update = last_batch or (i + 1) % n == 0`` bound once in the
  iteration, then ``if need_update:`` or ``if not need_update: continue``.
"""
from __future__ import annotations

import ast
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional, Tuple

from trainkit.lint._exits import TRY_STATEMENTS, as_exit, leaves_rare, polarity
from trainkit.lint._nodes import dotted, find_modulo, is_device_check, pos

if TYPE_CHECKING:
    from trainkit.lint._core import FileContext, LoopNode

# ``case`` blocks of a ``match`` (Python 3.10+): each runs only when its pattern matches.
_MATCH_CASE: Tuple[type, ...] = (ast.match_case,) if hasattr(ast, "match_case") else ()
# Early exits before a statement, nearest first, as a linked list: (exit ``if``, the ones before it).
_Chain = Optional[Tuple[ast.If, "_Chain"]]

def implies(test: ast.expr, holds: bool, leaf: Callable[[ast.expr, bool], bool]) -> bool:
    """Whether ``test`` being ``holds`` (true, or false) implies what ``leaf`` asks of one of its parts."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return implies(test.operand, not holds, leaf)
    if isinstance(test, ast.BoolOp):
        parts = (implies(v, holds, leaf) for v in test.values)
        # `a and b` true (or `a or b` false) pins every part; `a or b` true pins none of them alone
        return any(parts) if isinstance(test.op, ast.And) == holds else all(parts)
    return leaf(test, holds)


def _is_query(call: ast.Call) -> bool:
    """``scaler.is_enabled()``, ``torch.cuda.is_available()``: a state query without arguments."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    return name.startswith("is_") and not call.args and not call.keywords


class Branching:
    """Conditions of a loop iteration; mixed into ``TrainingLoop`` (which has ``ctx``, ``node``, ``region``)."""

    ctx: "FileContext"
    node: "LoopNode"
    region: List[ast.AST]

    # -- named tests and early exits -----------------------------------------

    @cached_property
    def named_tests(self) -> Dict[str, ast.Assign]:
        """Plain names bound exactly once in the iteration, by ``name = value``: ``need_update = ...``."""
        binds: Dict[str, List[ast.Name]] = {}
        for n in self.region:
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                binds.setdefault(n.id, []).append(n)
        out: Dict[str, ast.Assign] = {}
        for name, nodes in binds.items():
            parent = self.ctx.parents.get(nodes[0])
            if len(nodes) == 1 and isinstance(parent, ast.Assign) and parent.targets == [nodes[0]]:
                out[name] = parent
        return out

    def resolved(self, expr: ast.expr, depth: int = 0) -> ast.expr:
        """``expr`` with each named test it reads (through ``not``/``and``/``or``) replaced by its value.

        The value's own nodes are kept (so a finding points at the assignment's line); only
        the ``not``/``and``/``or`` above them are new.
        """
        if depth > 8:
            return expr
        if isinstance(expr, ast.Name) and isinstance(expr.ctx, ast.Load):
            bound = self.named_tests.get(expr.id)
            if bound is not None and pos(bound) < pos(expr):
                return self.resolved(bound.value, depth + 1)
            return expr
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            return ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=self.resolved(expr.operand, depth + 1)), expr)
        if isinstance(expr, ast.BoolOp):
            return ast.copy_location(ast.BoolOp(op=expr.op, values=[self.resolved(v, depth + 1) for v in expr.values]), expr)
        return expr

    @cached_property
    def _blocks(self) -> List[List[ast.stmt]]:
        """Every statement list of the iteration: the loop's body and each nested block. A ``try``'s
        ``else`` runs after its body, so the two are one block: an exit in the body guards the ``else``."""
        blocks: List[List[ast.stmt]] = [self.node.body]
        for n in self.region:
            if isinstance(n, TRY_STATEMENTS):
                blocks += [n.body + n.orelse, n.finalbody]  # type: ignore[attr-defined]
                continue
            for field in ("body", "orelse", "finalbody"):
                block = getattr(n, field, None)
                if isinstance(block, list):
                    blocks.append(block)
        return blocks

    @cached_property
    def _exit_chains(self) -> Tuple[Dict[ast.AST, "_Chain"], Dict[ast.AST, "_Chain"], Dict[int, str]]:
        """Statement -> the early exits before it in its block, nearest first: every one, and those on
        a ``%`` test; and each exit's side. A chain shares its tail with the statements before it, so
        a block of many ``if ...: continue`` filters costs linear time and memory.

        An exit on a ``%`` test counts when it may be taken where that test says "not a multiple"
        (``if i % n != 0: continue``, ``if warm: if i % n != 0: continue``), so the rest runs on
        the multiples; not ``if step % eval_every == 0 and done: break``, after which the rest
        runs on nearly every batch.
        """
        every: Dict[ast.AST, _Chain] = {}
        modulo: Dict[ast.AST, _Chain] = {}
        sides: Dict[int, str] = {}
        for block in self._blocks:
            all_chain: _Chain = None
            mod_chain: _Chain = None
            for stmt in block:
                if all_chain is not None:
                    every[stmt] = all_chain
                if mod_chain is not None:
                    modulo[stmt] = mod_chain
                found = as_exit(stmt)
                if found is None:
                    continue
                owner, side = found
                sides[id(owner)] = side
                all_chain = (owner, all_chain)
                if self.guard_modulo(owner) is not None and leaves_rare(self._exit_test(owner, side)):
                    mod_chain = (owner, mod_chain)
        return every, modulo, sides

    def _exit_test(self, owner: ast.If, side: str) -> ast.expr:
        """When early exit ``owner`` is taken (its test, or its negation for ``if c: ... else: continue``)."""
        test = self.resolved(owner.test)
        return test if side == "orelse" else ast.UnaryOp(op=ast.Not(), operand=test)

    def stand_in(self, guard: ast.AST) -> bool:
        """Whether ``guard`` is the ``if <condition>: continue`` standing in for a nested early exit."""
        return isinstance(guard, ast.If) and guard not in self.ctx.parents

    def _path(self, node: ast.AST) -> Iterator[Tuple[ast.AST, ast.AST]]:
        """``(parent, child)`` from ``node`` up to the loop; an early exit on a ``%`` test before
        ``child`` comes as ``(exit_if, child)``, before ``child``'s own parent (it is nearer)."""
        exits = self._exit_chains[1]
        child = node
        for parent in self.ctx.ancestors(node, stop=self.node):
            chain = exits.get(child)
            while chain is not None:
                yield chain[0], child
                chain = chain[1]
            yield parent, child
            child = parent
        chain = exits.get(child)
        while chain is not None:
            yield chain[0], child
            chain = chain[1]

    def _exit_side(self, owner: ast.AST, child: ast.AST) -> Optional[str]:
        """The side of early exit ``owner`` that ``child`` (a later statement of its block) runs on."""
        if isinstance(owner, ast.If) and child is not owner.test and not any(
                child is s for s in owner.body + owner.orelse):
            return self._exit_chains[2].get(id(owner))
        return None

    def exits_before(self, node: ast.AST) -> List[ast.If]:
        """The early exits on a ``%`` test that ``node`` runs behind, innermost first."""
        return [owner for owner, child in self._path(node) if self._exit_side(owner, child) is not None]  # type: ignore[misc]

    def behind_exit(self, node: ast.AST, key: str, wanted: Callable[[ast.If, str], bool]) -> bool:
        """Whether ``node`` runs behind an early exit (on any test) for which ``wanted(exit_if, side)``
        holds, ``side`` being the one the rest of its block runs on. ``key`` names ``wanted`` for the
        cache: each exit is asked once per loop."""
        cache = self.__dict__.setdefault("_behind_cache", {})
        if key not in cache:
            every, _, sides = self._exit_chains
            flags: Dict[ast.AST, bool] = {}
            for block in self._blocks:
                seen = False
                asked: Optional[ast.If] = None
                for stmt in block:
                    chain = every.get(stmt)
                    # ask each exit once: when it first heads the chain (the nearest before `stmt`)
                    if chain is not None and not seen and chain[0] is not asked:
                        asked = chain[0]
                        seen = wanted(asked, sides[id(asked)])
                    if seen:
                        flags[stmt] = True
            cache[key] = flags
        flags = cache[key]
        child = node
        for parent in self.ctx.ancestors(node, stop=self.node):
            if flags.get(child):
                return True
            child = parent
        return bool(flags.get(child))

    # -- guards and branches --------------------------------------------------

    def guards(self, node: ast.AST) -> List[ast.AST]:
        """The ``if``/``case``/``except``/``with`` blocks between ``node`` and the loop, innermost first.

        For an ``if`` the node is returned only when ``node`` sits in its body
        or else branch (not in its test), or after it when it is an early exit on a ``%``
        test (``if i % n != 0: continue``).
        """
        out: List[ast.AST] = []
        for parent, child in self._path(node):
            if isinstance(parent, ast.If) and child is not parent.test:
                out.append(parent)
            elif isinstance(parent, (ast.ExceptHandler, ast.With, ast.AsyncWith, ast.IfExp) + _MATCH_CASE):
                out.append(parent)
        return out

    def is_conditional(self, node: ast.AST) -> bool:
        """Whether ``node`` is skipped on some iterations (under an ``if``, ``case`` or ``except``).

        An ``if`` that only checks which device there is (``torch.cuda.is_available()``,
        ``device.type == "cuda"``) is not a condition: on a given machine it takes the
        same branch on every iteration.
        """
        for guard in self.guards(node):
            if isinstance(guard, (ast.If, ast.IfExp)) and not is_device_check(guard.test):
                return True
            if isinstance(guard, (ast.ExceptHandler,) + _MATCH_CASE):
                return True
        return False

    def branches(self, node: ast.AST) -> List[Tuple[ast.AST, object]]:
        """The conditional branches ``node`` sits in, innermost first: ``(if, "body")``, ``(match, 2)``.

        After an early exit ``if c: continue``, ``node`` is on that ``if``'s ``"orelse"`` side.
        """
        out: List[Tuple[ast.AST, object]] = []
        for parent, child in self._path(node):
            side = self._exit_side(parent, child)
            if side is not None:
                out.append((parent, side))
            elif isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                if isinstance(parent.body, list):
                    in_body = any(child is s for s in parent.body)
                else:  # an IfExp's body is one expression
                    in_body = child is parent.body
                out.append((parent, "body" if in_body else "orelse"))
            elif _MATCH_CASE and isinstance(parent, _MATCH_CASE):
                match = self.ctx.parents.get(parent)
                if match is not None:
                    out.append((match, next(i for i, case in enumerate(match.cases) if case is parent)))
        return out

    def side_of(self, node: ast.AST, guard: ast.AST) -> Optional[object]:
        """The side of ``guard`` (an ``if`` or ``match``) that ``node`` runs on, if it sits in one."""
        return next((side for owner, side in self.branches(node) if owner is guard), None)

    def _same_test(self, first: ast.If, second: ast.If) -> Optional[bool]:
        """Two ``if`` statements testing one unchanged value: True for ``if use_amp:`` twice in an
        iteration, False for ``if x:`` then ``if not x:`` (or ``==`` then ``!=``), else None.

        The test must read names only (no call, which could answer differently; but an
        argument-less ``is_...()`` query such as ``scaler.is_enabled()`` answers the same), and
        none of them may be assigned between the two ``if`` statements.
        """
        (a, kept_a), (b, kept_b) = polarity(first.test), polarity(second.test)
        if a != b:
            return None
        if any(isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom))
               or (isinstance(n, ast.Call) and not _is_query(n)) for n in ast.walk(first.test)):
            return None
        read = {dotted(n) for n in ast.walk(first.test) if isinstance(n, (ast.Name, ast.Attribute))}
        read.discard(None)
        low, high = sorted((pos(first), pos(second)))
        for n in self.region:
            if low < pos(n) < high and isinstance(getattr(n, "ctx", None), (ast.Store, ast.Del)):
                name = dotted(n)
                if name is not None and any(r == name or r.startswith(name + ".") for r in read):  # type: ignore[union-attr]
                    return None
        return kept_a == kept_b

    def runs_on(self, node: ast.AST, guard: ast.AST, side: object) -> bool:
        """Whether ``node`` runs only on ``side`` of ``guard``: it sits there, or on the matching side
        of an ``if`` with the same test or its negation (``if x:`` ... ``if not x: continue``)."""
        for owner, mine in self.branches(node):
            if owner is guard:
                return mine == side
            if isinstance(owner, ast.If) and isinstance(guard, ast.If) and mine in ("body", "orelse"):
                same = self._same_test(owner, guard)
                if same is not None and (mine == side) == same:
                    return True
        return False

    def exclusive(self, a: ast.AST, b: ast.AST) -> bool:
        """Whether ``a`` and ``b`` never both run in one iteration.

        They sit in opposite branches of one ``if`` (or in two ``case`` blocks of one
        ``match``), or in opposite branches of two ``if`` statements with the same test whose
        names are not reassigned between them (``if use_amp: ... if use_amp: ... else: ...``),
        or on the same side of ``if x:`` and ``if not x:``.
        """
        path_a = self.branches(a)
        path_b = self.branches(b)
        for owner_a, side_a in path_a:
            for owner_b, side_b in path_b:
                if owner_a is owner_b or not (isinstance(owner_a, ast.If) and isinstance(owner_b, ast.If)):
                    continue
                same = self._same_test(owner_a, owner_b)
                if same is not None and (side_a == side_b) != same:
                    return True
        sides_a = {id(owner): side for owner, side in path_a}
        for owner, side in path_b:
            if id(owner) in sides_a:
                return side != sides_a[id(owner)]
        return False

    # -- modulo tests ---------------------------------------------------------

    def modulo_guard(self, node: ast.AST) -> Optional[ast.AST]:
        """The innermost enclosing ``if`` (or ``case``) whose condition uses ``%``, if any.

        An early exit on a ``%`` test before ``node`` (``if i % n != 0: continue``) counts,
        and so does a named test bound to one (``if need_update:``).
        """
        for guard in self.guards(node):
            if isinstance(guard, ast.If) or (_MATCH_CASE and isinstance(guard, _MATCH_CASE)):
                if self.guard_modulo(guard) is not None:
                    return guard
        return None

    def guard_modulo(self, guard: ast.AST) -> Optional[ast.BinOp]:
        """The ``a % b`` of an ``if`` test (through its named tests), or of a ``case``'s ``match`` subject or guard."""
        if isinstance(guard, ast.If):
            return find_modulo(self.resolved(guard.test))
        if _MATCH_CASE and isinstance(guard, _MATCH_CASE):
            match = self.ctx.parents.get(guard)
            for expr in (getattr(match, "subject", None), guard.guard):  # type: ignore[attr-defined]
                found = find_modulo(expr) if expr is not None else None
                if found is not None:
                    return found
        return None

    def tests_for(self, guard: ast.If, side: object) -> Iterator[Tuple[ast.Compare, bool]]:
        """Each comparison of ``guard``'s test (through ``not``/``and``/``or`` and named tests), with
        whether it being true leads to ``side``: for ``if i % n != 0: continue``, the rest of the
        block (``"orelse"``) runs when ``i % n != 0`` is false.
        """
        stack: List[Tuple[ast.AST, bool]] = [(self.resolved(guard.test), side == "body")]
        while stack:
            expr, positive = stack.pop()
            if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
                stack.append((expr.operand, not positive))
            elif isinstance(expr, ast.BoolOp):
                stack.extend((v, positive) for v in reversed(expr.values))
            elif isinstance(expr, ast.Compare):
                yield expr, positive
            else:
                stack.extend((n, positive) for n in ast.iter_child_nodes(expr))
