"""The project's own examples must lint clean: they are what users copy."""
from __future__ import annotations

import pytest

from tests.lint._helpers import REPO_ROOT
from trainkit.lint import lint_paths

EXAMPLES = REPO_ROOT / "examples"


@pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"{EXAMPLES} does not exist in this checkout yet")
def test_examples_have_no_findings() -> None:
    assert [f.format() for f in lint_paths([str(EXAMPLES)])] == []
