"""``# trainkit: ignore[CODE]`` comments, found with :mod:`tokenize`."""
from __future__ import annotations

import io
import re
import tokenize
from typing import Dict, FrozenSet, Optional

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
