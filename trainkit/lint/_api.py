"""Running the rules: code selection, file discovery, linting a source or paths."""
from __future__ import annotations

import ast
import os
import re
import sys
from typing import Collection, Dict, FrozenSet, List, Optional, Tuple, Union

from trainkit.lint._core import FileContext
from trainkit.lint._depth import check_depth
from trainkit.lint._files import PathArg, as_path, as_paths, iter_python_files, read_source
from trainkit.lint._registry import RULES, Finding, LintError
from trainkit.lint._step_inline import plain, stepped_view, where
from trainkit.lint._suppress import comment_lines, is_suppressed, parse_suppressions

Codes = Union[str, Collection[str], None]
_LINE_BREAK_RE = re.compile(r"\r\n|\r|\n")
# Rules that read a step function's body at each call of it (:mod:`trainkit.lint._step_inline`).
_STEPPED = ("TK1", "TK2")

__all__ = ["Codes", "iter_python_files", "lint_file", "lint_paths", "lint_source", "parse_codes", "read_source"]


def valid_codes_text() -> str:
    """``"TK101, TK102, ..."``: the valid codes, for error messages."""
    return ", ".join(sorted(RULES))


def parse_codes(value: Codes, *, option: str) -> Optional[FrozenSet[str]]:
    """Normalise ``"TK1,TK301"`` or ``["TK1"]`` to codes/prefixes, rejecting unknown ones.

    Args:
        value: Comma-separated string, collection of codes or prefixes, or ``None``.
        option: Name shown in the error (``"--select"``).

    Returns:
        The upper-cased codes, or ``None`` when ``value`` is ``None``.

    Raises:
        ValueError: A value that is neither a code nor a prefix of one.

    Example::

        >>> sorted(parse_codes("tk1, TK301", option="--select"))
        ['TK1', 'TK301']
    """
    if value is None:
        return None
    # A plain string is split on commas; iterating it would give single letters.
    items = value.split(",") if isinstance(value, str) else list(value)
    if len(items) > 1 and not items[-1].strip() and items[-2].strip():
        items = items[:-1]  # one trailing comma ("TK3,") is harmless; an empty item elsewhere is not
    out = set()
    for item in items:
        code = item.strip().upper()
        if not code or not any(known.startswith(code) for known in RULES):
            raise ValueError(
                f"unknown rule code {item.strip()!r} in {option}; valid codes: {valid_codes_text()} "
                "(or a prefix such as 'TK1' for a family)"
            )
        out.add(code)
    return frozenset(out)


def _chosen(select: Codes, ignore: Codes) -> List[str]:
    selected = parse_codes(select, option="select")
    ignored = parse_codes(ignore, option="ignore") or frozenset()
    return [
        code
        for code in sorted(RULES)
        if (selected is None or any(code.startswith(s) for s in selected))
        and not any(code.startswith(i) for i in ignored)
    ]


def lint_source(source: str, path: str = "<string>", *, select: Codes = None, ignore: Codes = None) -> List[Finding]:
    """Lint Python source text without importing or running it.

    Args:
        source: The code.
        path: Name used in the findings.
        select: Codes or prefixes to run (all rules when ``None``).
        ignore: Codes or prefixes to skip.

    Returns:
        Findings sorted by line, column and code, minus those silenced by
        ``# trainkit: ignore[...]`` comments.

    Raises:
        LintError: ``source`` is not valid Python (``line`` says where), or is nested too
            deeply to parse or lint (``line`` is 0).
        ValueError: An unknown code in ``select`` or ``ignore``.

    Example::

        >>> src = ("for i, x in enumerate(data):\\n    loss = f(x)\\n    loss.backward()\\n"
        ...        "    loss = loss / 4\\n    if i % 4 == 3:\\n        opt.step(); opt.zero_grad()\\n")
        >>> [(f.code, f.line) for f in lint_source(src)]
        [('TK101', 4), ('TK112', 5)]
    """
    if not isinstance(source, str):
        hint = ("decode it first: lint_source(data.decode('utf-8')), or lint the file with lint_file(path), "
                "which honours its coding cookie" if isinstance(source, (bytes, bytearray))
                else "to lint a file, use lint_file(path) or lint_paths([path])")
        raise TypeError(f"lint_source({source!r:.60}): source must be a str (the code as text), "
                        f"got {type(source).__name__}; {hint}")
    codes = _chosen(select, ignore)
    try:
        if sys.version_info < (3, 11):  # their ast.parse crashes (SIGSEGV) on a ~100,000-deep tree
            check_depth(source)
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise LintError(path, exc.lineno or 0, f"syntax error: {exc.msg}") from exc
    except ValueError as exc:  # null bytes on Python < 3.12
        raise LintError(path, 0, f"syntax error: {exc}") from exc
    except (RecursionError, MemoryError) as exc:
        raise LintError(path, 0, f"too deeply nested to parse ({type(exc).__name__}); not linted") from exc
    try:
        ctx = FileContext(path, source, tree)
        suppressions = parse_suppressions(source)
        # ast's col_offset counts UTF-8 bytes; a non-ASCII line needs its text to count characters.
        # Python's own line ends, not str.splitlines()'s (which also splits at \f, \x1c, ...).
        lines = None if source.isascii() else _LINE_BREAK_RE.split(source)
        findings = set()
        # a step function's body read at several calls gives one finding per place: the first call's
        copied: Dict[Tuple[int, int, str], Tuple[Tuple[int, int], Finding]] = {}
        for code in codes:
            rule = RULES[code]
            # the accumulation and AMP rules read step functions' bodies at their calls
            seen = stepped_view(ctx) if code.startswith(_STEPPED) else ctx
            for hit in rule.check(seen):
                line = getattr(hit.node, "lineno", 1)
                # comment_lines may read the source (a header's `:`): only when there are comments
                if not (suppressions and any(is_suppressed(code, n, suppressions)
                                             for n in comment_lines(seen, hit.node))):
                    col = _char_col(lines, line, getattr(hit.node, "col_offset", 0)) + 1
                    message, fix = hit.message + where(hit.node), hit.fix
                    if seen is not ctx:  # a local renamed in a copy (`loss′`) is named as written
                        message, fix = plain(message), plain(fix)
                    finding = Finding(path, line, col, code, rule.severity, message, fix)
                    origin = getattr(hit.node, "inlined_from", None)
                    if origin is None:
                        findings.add(finding)
                    elif (line, col, code) not in copied or origin[1:] < copied[line, col, code][0]:
                        copied[line, col, code] = (origin[1:], finding)
        findings.update(finding for _, finding in copied.values())
    except (RecursionError, MemoryError) as exc:
        # ast.unparse/ast.dump recurse: an expression nested thousands deep exhausts the stack.
        raise LintError(path, 0, f"too deeply nested to lint ({type(exc).__name__}); not linted") from exc
    return sorted(findings, key=lambda f: (f.line, f.col, f.code))


def _char_col(lines: Optional[List[str]], line: int, offset: int) -> int:
    """The 0-based character column of ``ast``'s ``col_offset`` (UTF-8 bytes) on ``line``;
    ``lines`` is None for an ASCII source, where the two are the same."""
    if lines is None or not 0 < line <= len(lines):
        return offset
    return len(lines[line - 1].encode("utf-8")[:offset].decode("utf-8", errors="ignore"))


def lint_file(path: PathArg, *, select: Codes = None, ignore: Codes = None) -> List[Finding]:
    """Lint one file (a ``str`` or ``os.PathLike`` path; findings name it as a ``str``).

    Raises:
        LintError: The file is unreadable or not Python.
        TypeError: ``path`` is no path.
    """
    path = as_path(path, call="lint_file")
    if path.endswith(".ipynb"):
        # A notebook is JSON, which parses as one Python dict: linted as it is, it would pass clean.
        script = os.path.splitext(path)[0] + ".py"  # where nbconvert writes it
        raise LintError(path, 0, f"a Jupyter notebook, not a Python file: not linted; export its code "
                                 f"and lint that: jupyter nbconvert --to script {path} && trainkit lint {script}")
    return lint_source(read_source(path), path, select=select, ignore=ignore)


def lint_paths(paths: Union[PathArg, Collection[PathArg]], *, select: Codes = None, ignore: Codes = None) -> List[Finding]:
    """Lint files and folders (folders recursively, ``*.py`` only).

    Args:
        paths: Files or folders (``str`` or ``os.PathLike``), or one of them.
        select: Codes or prefixes to run, e.g. ``["TK1"]`` or ``"TK101,TK3"``.
        ignore: Codes or prefixes to skip.

    Returns:
        All findings, sorted by path, line, column and code.

    Raises:
        LintError: The first missing, unreadable or syntactically invalid file.
        ValueError: An unknown code in ``select`` or ``ignore``.
        TypeError: ``paths`` is neither a path nor a collection of paths.

    Example::

        findings = lint_paths(["train.py", "scripts/"], ignore="TK5")
        for f in findings:
            print(f.format())
    """
    _chosen(select, ignore)  # reject bad codes before touching the disk
    given = as_paths(paths)
    findings: List[Finding] = []
    for path in iter_python_files(given, seen=set()):  # a file named twice is linted once
        findings.extend(lint_file(path, select=select, ignore=ignore))
    return sorted(findings, key=lambda f: (f.path, f.line, f.col, f.code))
