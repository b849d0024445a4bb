"""Early exits: the statements of a loop iteration after which the rest of their block may not run.

``if c: ...; continue`` is the plain shape (the rest of the block runs where ``c`` is false).
Also an exit: ``break`` and ``return`` in place of ``continue``, an exit nested in an inner
``if`` (``if warm: if (i + 1) % n != 0: continue``), an ``elif`` chain, and an exit in a ``with``
block, a ``try`` body or a ``match`` case (read as an ``if`` chain); not one in a nested loop
(it ends that loop) or in an ``except`` handler (taken only on an exception). :func:`exit_condition`
gives the condition under which a statement ends the iteration, built as an expression from
the statement's own tests (``warm and (i + 1) % n != 0``), so the code that reads ``if`` tests
(named tests, ``%``, De Morgan) reads it too.

:func:`leaves_rare` says whether the rest of the block then runs only on the batches a ``%``
test picks out (the exit is taken on the others): ``if warm: if i % n != 0: continue`` does,
``if step % eval_every == 0 and done: break`` does not (the rest runs on nearly every batch).
:func:`polarity` reads ``if x:`` and ``if not x:`` (``==`` and ``!=``) as one test, negated.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Sequence, Tuple, Union

_EXIT_STATEMENTS = (ast.Continue, ast.Break, ast.Return)


class _Always:
    """The statement always ends the iteration (``continue`` itself)."""


ALWAYS = _Always()
Condition = Union[None, _Always, ast.expr]  # None: never exits
Exit = Tuple[ast.If, str]  # an early-exit ``if`` and the side the rest of its block runs on


def _not(expr: ast.expr) -> ast.expr:
    """``not expr``, kept as a new node even for ``not not x``: :func:`plain_side` recognises it."""
    return ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=expr), expr)


def _join(op: ast.boolop, values: List[ast.expr]) -> ast.expr:
    if len(values) == 1:
        return values[0]
    return ast.copy_location(ast.BoolOp(op=op, values=values), values[0])


def block_exit(block: List[ast.stmt]) -> Condition:
    """When running ``block`` ends the iteration: ``ALWAYS``, None (never), or a condition."""
    found: List[ast.expr] = []
    for stmt in block:
        cond = exit_condition(stmt)
        if cond is ALWAYS:
            return ALWAYS  # the rest of the block is not reached
        if cond is not None:
            found.append(cond)  # type: ignore[arg-type]
    return _join(ast.Or(), found) if found else None


TRY_STATEMENTS: Tuple[type, ...] = (ast.Try, ast.TryStar) if hasattr(ast, "TryStar") else (ast.Try,)
_MATCH: Tuple[type, ...] = (ast.Match,) if hasattr(ast, "Match") else ()


def exit_condition(stmt: ast.AST) -> Condition:
    """When ``stmt`` ends the loop's iteration (``continue``, ``break`` or ``return``).

    ``if``/``elif`` and ``with`` blocks are followed, a ``try`` on its path without an exception
    (its body, ``else`` and ``finally`` in turn; an exit in an ``except`` handler is taken only on
    an exception, like a data filter's), and a ``match`` whose patterns read as tests (see
    :func:`_match_exit`). An exit inside a nested loop is not: its ``continue`` and ``break`` end
    only that loop, and whether a ``return`` there is taken depends on that loop's iterations.
    """
    if isinstance(stmt, _EXIT_STATEMENTS):
        return ALWAYS
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return block_exit(stmt.body)
    if isinstance(stmt, TRY_STATEMENTS):
        return block_exit(stmt.body + stmt.orelse + stmt.finalbody)
    if _MATCH and isinstance(stmt, _MATCH):
        return _match_exit(stmt)
    if not isinstance(stmt, ast.If):
        return None
    return _either(((stmt.test, block_exit(stmt.body)), (_not(stmt.test), block_exit(stmt.orelse))))


def _either(sides: Sequence[Tuple[Optional[ast.expr], Condition]]) -> Condition:
    """The exit of branches taken where their tests hold (None: always taken), each ending the
    iteration under its own condition; ``ALWAYS`` when every one always exits."""
    if all(cond is ALWAYS for _, cond in sides):
        return ALWAYS
    found: List[ast.expr] = []
    for test, cond in sides:
        parts = [test] if test is not None else []
        if cond is not ALWAYS and cond is not None:
            parts.append(cond)  # type: ignore[arg-type]
        if cond is not None:
            if not parts:
                return ALWAYS  # a branch taken always, that always exits
            found.append(_join(ast.And(), parts))  # type: ignore[arg-type]
    return _join(ast.Or(), found) if found else None


def _pattern_test(subject: ast.expr, pattern: ast.AST) -> Union[None, bool, ast.expr]:
    """``subject == 3`` for ``case 3:``, True for one that matches anything (``case _:``,
    ``case x:``), None for a pattern that is no plain test (a class, sequence or mapping)."""
    if isinstance(pattern, ast.MatchValue):
        return ast.copy_location(ast.Compare(left=subject, ops=[ast.Eq()], comparators=[pattern.value]), pattern)
    if isinstance(pattern, ast.MatchSingleton):
        value = ast.copy_location(ast.Constant(value=pattern.value), pattern)
        return ast.copy_location(ast.Compare(left=subject, ops=[ast.Is()], comparators=[value]), pattern)
    if isinstance(pattern, ast.MatchAs):
        return True if pattern.pattern is None else _pattern_test(subject, pattern.pattern)
    if isinstance(pattern, ast.MatchOr):
        tests = [_pattern_test(subject, p) for p in pattern.patterns]
        if any(t is None for t in tests):
            return None
        if any(t is True for t in tests):
            return True
        return _join(ast.Or(), tests)  # type: ignore[arg-type]
    return None


def _match_exit(stmt: ast.AST) -> Condition:
    """A ``match`` read as an ``if``/``elif`` chain: ``case 0:`` tests ``subject == 0`` (its guard
    added with ``and``), each case on the earlier ones failing. The cases from one whose pattern is
    no plain test (``case Point(x=0):``) on are not followed."""
    sides: List[Tuple[Optional[ast.expr], Condition]] = []
    earlier: List[ast.expr] = []
    for case in stmt.cases:  # type: ignore[attr-defined]
        test = _pattern_test(stmt.subject, case.pattern)  # type: ignore[attr-defined]
        if test is None:
            break
        tests = [t for t in (test, case.guard) if t is not None and t is not True]  # type: ignore[attr-defined]
        here = _join(ast.And(), tests) if tests else None  # None: the case matches anything
        parts = [_not(e) for e in earlier] + ([here] if here is not None else [])
        sides.append((_join(ast.And(), parts) if parts else None, block_exit(case.body)))
        if here is None:
            return _either(sides)  # irrefutable: later cases are never reached
        earlier.append(here)
    sides.append((None, None))  # no case taken (or one not followed): no exit
    return _either(sides)


def plain_side(stmt: ast.If, cond: ast.expr) -> Optional[str]:
    """``"orelse"`` when ``cond`` is ``stmt``'s own test (``if c: continue``), ``"body"`` when it is
    its negation (``if c: ... else: continue``); None for any other shape."""
    if cond is stmt.test:
        return "orelse"
    if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Not) and cond.operand is stmt.test:
        return "body"
    return None


def synthetic_exit(stmt: ast.stmt, cond: ast.expr) -> ast.If:
    """``if cond: continue`` at ``stmt``'s place: the exit of a nested shape, as one ``if``."""
    exit_if = ast.If(test=cond, body=[ast.Continue()], orelse=[])
    return ast.copy_location(exit_if, stmt)


def _multiples_only(cond: ast.expr, positive: bool, found: List[bool]) -> None:
    """Append, for each ``%`` test in ``cond``, whether it holds only on the multiples there."""
    if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Not):
        _multiples_only(cond.operand, not positive, found)
    elif isinstance(cond, ast.BoolOp):
        for value in cond.values:
            _multiples_only(value, positive, found)
    elif isinstance(cond, ast.BinOp) and isinstance(cond.op, ast.Mod):
        found.append(not positive)  # `i % n` true: not a multiple
    elif isinstance(cond, ast.Compare) and len(cond.ops) == 1 and any(
            isinstance(s, ast.BinOp) and isinstance(s.op, ast.Mod) for s in (cond.left, cond.comparators[0])):
        op = cond.ops[0]
        found.append(isinstance(op, ast.Eq) if positive else isinstance(op, ast.NotEq))


def leaves_rare(cond: ast.expr) -> bool:
    """Whether exit condition ``cond`` may be taken where a ``%`` test says "not a multiple"
    (``i % n != 0``, ``not i % n == 0``, a bare ``i % n``, ``warm and i % n != 0``), so the rest
    of the block runs on the multiples; not when every ``%`` test in it holds only on the
    multiples (``step % eval_every == 0 and done``: the rest runs on nearly every batch).
    """
    found: List[bool] = []
    _multiples_only(cond, True, found)
    return not found or not all(found)


def exit_side(stmt: ast.AST) -> Optional[str]:
    """``"orelse"`` for ``if c: ...; continue`` (the rest of the block runs where ``c`` is false),
    ``"body"`` for ``if c: ... else: continue``, None for a statement that is no early exit.

    ``break`` and ``return`` exit too. A nested shape (``if warm: if i % n != 0: continue``) is
    ``"orelse"``: its exit is read as ``if warm and i % n != 0: continue`` (see ``_exits``).
    """
    if not isinstance(stmt, ast.If):
        return None
    cond = exit_condition(stmt)
    if cond is None or cond is ALWAYS:
        return None  # no exit, or every path exits (the rest of the block never runs)
    return plain_side(stmt, cond) or "orelse"  # type: ignore[arg-type]


def as_exit(stmt: ast.AST) -> Optional[Exit]:
    """The early exit ``stmt`` makes, as an ``if`` whose one side the rest of its block runs on.

    The plain shapes are ``stmt`` itself; a nested one (also in a ``with``, ``try`` or ``match``)
    is a new ``if <condition>: continue`` standing in for it (with ``stmt``'s position).
    """
    if not isinstance(stmt, (ast.If, ast.With, ast.AsyncWith) + TRY_STATEMENTS + _MATCH):
        return None
    cond = exit_condition(stmt)
    if cond is None or cond is ALWAYS:
        return None
    found = _plain_exit(stmt, cond)  # type: ignore[arg-type]
    if found is not None:
        return found
    return synthetic_exit(stmt, cond), "orelse"  # type: ignore[arg-type]


def _plain_exit(stmt: ast.stmt, cond: ast.expr) -> Optional[Exit]:
    """``(if, side)`` for the plain ``if c: continue`` (or ``if c: ... else: continue``) whose test is
    ``cond``: ``stmt`` itself, or one inside its ``with`` or ``try`` blocks, which pass it on as it is."""
    stack: List[ast.stmt] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            side = plain_side(node, cond)
            if side is not None:
                return node, side
            if node is stmt:
                return None  # an `if` passes on only a test of its own
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            stack.extend(node.body)
        elif isinstance(node, TRY_STATEMENTS):
            stack.extend(node.body + node.orelse + node.finalbody)  # type: ignore[attr-defined]
    return None


def polarity(test: ast.expr) -> Tuple[str, bool]:
    """``test`` without its ``not``s (``a != b`` read as ``not a == b``), and whether it is kept as is."""
    kept = True
    while True:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, kept = test.operand, not kept
        elif isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.NotEq):
            return ast.dump(ast.Compare(left=test.left, ops=[ast.Eq()], comparators=test.comparators)), not kept
        else:
            return ast.dump(test), kept
