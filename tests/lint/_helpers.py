"""Shared test helpers: fixture paths and the ``# expect: CODE`` markers planted in them."""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Set, Tuple

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
REPO_ROOT = HERE.parent.parent
BAD = sorted((FIXTURES / "bad").glob("*.py"))
CLEAN = sorted((FIXTURES / "clean").glob("*.py"))

_EXPECT_RE = re.compile(r"#\s*expect:\s*([A-Z0-9, ]+)")


def expected(path: Path) -> Set[Tuple[str, int]]:
    """The ``(code, line)`` pairs a bad fixture declares with ``# expect: TK101,TK102``."""
    out = set()
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = _EXPECT_RE.search(text)
        if match:
            out.update((code.strip(), number) for code in match.group(1).split(",") if code.strip())
    return out


def ids(paths: List[Path]) -> List[str]:
    return [p.stem for p in paths]
