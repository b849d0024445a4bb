"""``trainkit lint``: a static linter for hand-written PyTorch training loops.

Pure AST analysis (stdlib :mod:`ast` and :mod:`tokenize`): the code under
inspection is never imported or run, and torch is not needed.

Example::

    from trainkit.lint import lint_paths
    for finding in lint_paths(["train.py"], select=["TK1", "TK2"]):
        print(finding.format())
"""
from __future__ import annotations

# Importing the rule modules registers their rules in RULES.
from trainkit.lint import (  # noqa: F401
    accumulate_blocks, accumulation, amp, dataloader, deprecated, last_window, leftover_window, memory, scheduler,
    scheduler_pace, sync, zero_grad,
)
from trainkit.lint._api import iter_python_files, lint_file, lint_paths, lint_source, parse_codes
from trainkit.lint._registry import RULES, Finding, LintError, Rule, Severity

__all__ = [
    "RULES",
    "Finding",
    "LintError",
    "Rule",
    "Severity",
    "iter_python_files",
    "lint_file",
    "lint_paths",
    "lint_source",
    "parse_codes",
]
