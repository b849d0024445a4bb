"""Findings, rules and the registry every rule module adds itself to."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Iterable, Literal

if TYPE_CHECKING:
    from trainkit.lint._core import FileContext

Severity = Literal["error", "warning", "advice"]


@dataclass(frozen=True)
class Finding:
    """One mistake found in one place.

    Attributes:
        path: The file, as it was given or found under a given folder.
        line: 1-based line of the offending expression.
        col: 1-based column (editors count from 1, :mod:`ast` from 0).
        code: Rule code such as ``"TK101"``.
        severity: ``"error"`` (wrong results), ``"warning"`` (slow) or ``"advice"``.
        message: What was found, naming the code it saw.
        fix: How to fix it, pointing at trainkit's helper where there is one.

    Example::

        >>> f = Finding("t.py", 3, 5, "TK301", "warning", "gc.collect() every step", "remove it")
        >>> f.format()
        't.py:3: TK301 [warning] gc.collect() every step; fix: remove it'
    """

    path: str
    line: int
    col: int
    code: str
    severity: Severity
    message: str
    fix: str

    def format(self) -> str:
        """Render as the ``PATH:LINE: CODE [severity] message; fix: ...`` text line."""
        return f"{self.path}:{self.line}: {self.code} [{self.severity}] {self.message}; fix: {self.fix}"

    def to_dict(self) -> Dict[str, object]:
        """Return the JSON-ready mapping used by ``--format json``."""
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class Hit:
    """What a rule check yields: the node to point at, the message and the fix."""

    node: ast.AST
    message: str
    fix: str


@dataclass(frozen=True)
class Rule:
    """A registered lint rule.

    Example::

        >>> from trainkit.lint import RULES
        >>> RULES["TK101"].severity
        'error'
    """

    code: str
    name: str
    severity: Severity
    summary: str
    check: Callable[["FileContext"], Iterable[Hit]]


RULES: Dict[str, Rule] = {}


def rule(
    code: str, *, name: str, severity: Severity, summary: str
) -> Callable[[Callable[["FileContext"], Iterable[Hit]]], Callable[["FileContext"], Iterable[Hit]]]:
    """Register a check function under ``code``.

    Example::

        @rule("TK999", name="demo", severity="advice", summary="demo rule")
        def _check(ctx: FileContext) -> Iterator[Hit]:
            yield from ()
    """

    def register(check: Callable[[FileContext], Iterable[Hit]]) -> Callable[[FileContext], Iterable[Hit]]:
        if code in RULES:
            raise ValueError(f"rule code {code!r} is registered twice; pick a new code")
        RULES[code] = Rule(code=code, name=name, severity=severity, summary=summary, check=check)
        return check

    return register


class LintError(Exception):
    """A file that could not be linted: missing, unreadable, or not valid Python.

    Attributes:
        path: The file or path given.
        line: 1-based line of a syntax error, or 0 when there is no line.
        reason: What went wrong.
    """

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason
