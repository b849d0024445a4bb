"""The ``(code, line)`` pairs the linter reports on a snippet, for the test_loop_analysis_*.py
files (which loops accumulate, which branches exclude each other, which conditions are real)."""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


# TK112 (a short last window never stepped) fires on most of the loops in those files; it has its
# own tests (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str, **kwargs: object) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), **{"ignore": "TK112", **kwargs})]  # type: ignore[arg-type]

