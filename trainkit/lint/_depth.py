"""A bound on how deeply a source nests, for Pythons whose ``ast.parse`` can crash on it.

On Python 3.9 and 3.10, ``ast.parse`` turns the parser's tree into Python objects with a C
recursion that has no depth check: ``x = 1+1+...+1`` with ~100,000 terms overflows the C stack and
kills the process (SIGSEGV) instead of raising. 3.11 added the check (a ``RecursionError``
"during ast construction", past ~3,000 levels). ``check_depth`` gives 3.9/3.10 that error before
the parse, from the tokens alone: no tree is built.
"""
from __future__ import annotations

import io
import re
import tokenize
from typing import List, Optional

# Refused above this bound of the expressions' depth (statements add at most ~200 levels: the
# tokenizer allows 100 indents). The parse crashes past ~100,000 levels (8 MiB stack); 3.11
# refuses ~3,000.
LIMIT = 20_000

# Tokens that can add a level of the tree above what follows them on the same item.
_OPS = frozenset("""
    + - * / // % ** @ << >> & | ^ ~ < > <= >= == != . := = += -= *= /= //= %= **= @= <<= >>= &= |= ^= ->
    not and or if else lambda await yield for in is from async
""".split())
_OPEN = {"(": ")", "[": "]", "{": "}"}
# Each character or word that the bound counts (brackets once each side, as a group adds 2):
# a source with fewer matches in all cannot reach LIMIT, and is not tokenized (slow before 3.12).
_COUNTED = re.compile(r"[-+*/%@<>&|^~.=()\[\]{}]|\b(?:not|and|or|if|else|lambda|await|yield|for|in|is|from|async)\b")


def nesting_bound(source: str, stop: Optional[int] = None) -> int:
    """An upper bound of the expression nodes on a path of ``ast.parse(source)``'s tree, from tokens.

    Within a bracket (or a statement), each comma-separated item counts its operators, keywords
    and brackets, plus the deepest bracket inside it (and one, for a tuple); items are siblings,
    so a 100,000-element list is shallow. An f-string counts its operators, brackets and keywords
    (before 3.12 its expressions are one token). Raises ``tokenize.TokenError`` or
    ``SyntaxError`` where the source does not tokenize. Past ``stop``, returns what it has.
    """
    deepest = 0
    # Per open bracket (the statement at the bottom): [ops in this item, deepest child in this
    # item, deepest item so far].
    stack: List[List[int]] = [[0, 0, 0]]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        top = stack[-1]
        if tok.type == tokenize.OP and tok.string in _OPEN:
            stack.append([0, 0, 0])
        elif tok.type == tokenize.OP and tok.string in (")", "]", "}") and len(stack) > 1:
            inner = stack.pop()
            depth = 1 + max(inner[2], inner[0] + inner[1])  # 1: a tuple or slice in it (a[1, 2:3])
            parent = stack[-1]
            parent[0] += 1  # the call, subscript or display itself
            parent[1] = max(parent[1], depth)
        elif (tok.type == tokenize.OP and tok.string in (",", ";")) or tok.type == tokenize.NEWLINE:
            top[2] = max(top[2], top[0] + top[1])
            top[0] = top[1] = 0
        elif tok.string in _OPS and tok.type in (tokenize.OP, tokenize.NAME):
            top[0] += 1
        elif tok.type == tokenize.STRING and "f" in tok.string.split(tok.string[-1], 1)[0].lower():
            top[0] += len(_COUNTED.findall(tok.string))
        deepest = max(deepest, top[0] + top[1], top[2])
        if stop is not None and deepest > stop:
            break
    return deepest + 2  # a statement's bare tuple (return a, b), and the leaf name or constant


def check_depth(source: str) -> None:
    """Raise ``RecursionError`` where ``source`` may nest deeper than ``LIMIT``; else nothing.

    Sources that do not tokenize are left to ``ast.parse``, which reports their syntax error
    without building a tree.
    """
    if len(source) <= LIMIT or len(_COUNTED.findall(source)) + 2 <= LIMIT:
        return
    try:
        bound = nesting_bound(source, stop=LIMIT)
    except (tokenize.TokenError, SyntaxError, ValueError):
        return
    if bound > LIMIT:
        raise RecursionError(f"the source may nest {bound} levels deep (more than {LIMIT})")
