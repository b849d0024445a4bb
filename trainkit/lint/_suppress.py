"""``# trainkit: ignore[CODE]`` comments, found with :mod:`tokenize`."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional

if TYPE_CHECKING:
    from trainkit.lint._core import FileContext

_LINE_BREAK_RE = re.compile(r"\r\n|\r|\n")  # Python's own line ends, not str.splitlines()'s
_IGNORE_RE = re.compile(r"#\s*trainkit:\s*ignore\b(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE)


def parse_suppressions(source: str) -> Dict[int, Optional[FrozenSet[str]]]:
    """Map line -> codes silenced by a ``# trainkit: ignore[...]`` comment (``None``: all).

    Comments are found with :mod:`tokenize`, so a ``#`` inside a string is not one.

    Example::

        >>> found = parse_suppressions("x = 1  # trainkit: ignore[TK101, TK3]\\n")
        >>> sorted(found[1])
        ['TK101', 'TK3']
    """
    out: Dict[int, Optional[FrozenSet[str]]] = {}
    if "trainkit" not in source.lower():
        return out  # tokenizing is a third of the time on big files; skip it when it cannot match
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type != tokenize.COMMENT:
                continue
            match = _IGNORE_RE.search(tok.string)
            if not match:
                continue
            line = tok.start[0]
            codes = match.group("codes")
            if codes is None or not codes.strip():
                out[line] = None
            elif out.get(line, frozenset()) is not None:
                parsed = frozenset(c.strip().upper() for c in codes.split(",") if c.strip())
                out[line] = out.get(line, frozenset()) | parsed  # type: ignore[operator]
    except (tokenize.TokenError, SyntaxError):
        pass  # the AST parsed, so a tokenizer hiccup only costs the suppressions after it
    return out


def is_suppressed(code: str, line: int, suppressions: Dict[int, Optional[FrozenSet[str]]]) -> bool:
    """Whether ``code`` is silenced on ``line`` (a listed prefix such as ``TK1`` counts)."""
    if line not in suppressions:
        return False
    codes = suppressions[line]
    return codes is None or any(code.startswith(c) for c in codes)


_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


def comment_lines(ctx: "FileContext", node: ast.AST) -> List[int]:
    """Lines whose ``# trainkit: ignore`` silences a finding at ``node``.

    Its own line, and the first and last lines of the expressions and the simple
    statement around it: the comment may sit on ``print(`` or on the closing ``)``
    of a call written over several lines. A finding on a compound statement's header
    (the ``if`` itself, or its test) also takes the header's first and last lines: Black writes
    a long test as ``if (`` / ``test`` / ``):``. Its body's statements are not part of it.
    """
    lines = [getattr(node, "lineno", 1)]
    current: Optional[ast.AST] = node
    child: Optional[ast.AST] = None
    while current is not None and not isinstance(current, ast.mod):
        if isinstance(current, ast.stmt) and any(
            isinstance(getattr(current, field, None), list) for field in _BODIES
        ):
            in_body = child is not None and any(
                any(child is s for s in getattr(current, field, None) or []) for field in _BODIES)
            if not in_body:  # the header: from its first line to the line of its `:`
                lines.append(current.lineno)
                lines.append(_header_end(ctx, current))
            break  # a compound statement: its other lines are other statements'
        for attr in ("lineno", "end_lineno"):
            value = getattr(current, attr, None)
            if value is not None:
                lines.append(value)
        if isinstance(current, ast.stmt):
            break
        child, current = current, ctx.parents.get(current)
    return lines


def _header_end(ctx: "FileContext", stmt: ast.stmt) -> int:
    """The line of the ``:`` that ends ``stmt``'s header: after its last header expression only
    closing brackets, commas, blanks and comments may come before it."""
    header = []
    for field, value in ast.iter_fields(stmt):
        if field in _BODIES or field == "decorator_list":
            continue
        for n in value if isinstance(value, list) else [value]:
            if isinstance(n, ast.withitem):  # no position of its own
                header.extend(e for e in (n.context_expr, n.optional_vars) if e is not None)
            elif hasattr(n, "end_lineno"):
                header.append(n)
    if not header:
        return stmt.lineno
    last = max(header, key=lambda n: (n.end_lineno, n.end_col_offset))
    line, col = last.end_lineno, last.end_col_offset
    text = _LINE_BREAK_RE.split(ctx.source)  # only for a finding on a header: rare, so not cached
    while 0 < line <= len(text):
        rest = text[line - 1].encode("utf-8")[col:].decode("utf-8", errors="ignore")
        for char in rest:
            if char == ":":
                return line
            if char == "#":
                break
            if not (char.isspace() or char in "),]\\"):
                return stmt.lineno  # something unexpected: keep to what is sure
        line, col = line + 1, 0
    return stmt.lineno
