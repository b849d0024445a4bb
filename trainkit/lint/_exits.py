"""Early exits: the statements of a loop iteration after which the rest of their block may not run.

``if c: ...; continue`` is the plain shape (the rest of the block runs where ``c`` is false).
Also an exit: ``break`` and ``return`` in place of ``continue``, an exit nested in an inner
``if`` (``if warm: if (i + 1) % n != 0: continue``), and an ``elif`` chain. :func:`exit_condition`
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
from typing import List, Optional, Tuple, Union

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


def exit_condition(stmt: ast.AST) -> Condition:
    """When ``stmt`` ends the loop's iteration (``continue``, ``break`` or ``return``).

    ``if``, ``elif`` and ``with`` blocks are followed; an exit inside a nested loop, a
    ``try`` or a ``match`` is not (the first two belong to or may be caught by something
    else, and the conditions of the last are not ``if`` tests).
    """
    if isinstance(stmt, _EXIT_STATEMENTS):
        return ALWAYS
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return block_exit(stmt.body)
    if not isinstance(stmt, ast.If):
        return None
    body, orelse = block_exit(stmt.body), block_exit(stmt.orelse)
    if body is None and orelse is None:
        return None
    if body is ALWAYS and orelse is ALWAYS:
        return ALWAYS
    sides: List[ast.expr] = []
    for cond, test in ((body, stmt.test), (orelse, _not(stmt.test))):
        if cond is ALWAYS:
            sides.append(test)
        elif cond is not None:
            sides.append(_join(ast.And(), [test, cond]))  # type: ignore[list-item]
    return _join(ast.Or(), sides)


def plain_side(stmt: ast.If, cond: ast.expr) -> Optional[str]:
    """``"orelse"`` when ``cond`` is ``stmt``'s own test (``if c: continue``), ``"body"`` when it is
    its negation (``if c: ... else: continue``); None for any other shape."""
    if cond is stmt.test:
        return "orelse"
    if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Not) and cond.operand is stmt.test:
        return "body"
    return None


def synthetic_exit(stmt: ast.If, cond: ast.expr) -> ast.If:
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

    The plain shapes are ``stmt`` itself; a nested one is a new ``if <condition>: continue``
    standing in for it (with ``stmt``'s position).
    """
    if not isinstance(stmt, ast.If):
        return None
    cond = exit_condition(stmt)
    if cond is None or cond is ALWAYS:
        return None
    side = plain_side(stmt, cond)  # type: ignore[arg-type]
    if side is not None:
        return stmt, side
    return synthetic_exit(stmt, cond), "orelse"  # type: ignore[arg-type]


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
