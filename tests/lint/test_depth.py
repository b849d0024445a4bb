"""The nesting bound that keeps Python 3.9/3.10's ``ast.parse`` from crashing on a deep file."""
from __future__ import annotations

import ast

import pytest

from trainkit.lint import LintError, lint_source
from trainkit.lint._depth import LIMIT, check_depth, nesting_bound


def _depth(tree: ast.AST) -> int:
    """The tree's depth in expression nodes, without recursion."""
    deepest = 0
    todo = [(tree, 0)]
    while todo:
        node, depth = todo.pop()
        depth += isinstance(node, ast.expr)
        deepest = max(deepest, depth)
        todo.extend((child, depth) for child in ast.iter_child_nodes(node))
    return deepest


@pytest.mark.parametrize("source", [
    "x = " + "1+" * 500 + "1\n",
    "x = a" + ".b" * 400 + "\n",
    "x = a" + "[0]" * 300 + "(1)" * 300 + "\n",
    "x = " + "not " * 300 + "-" * 300 + "1\n",
    "x = " + "f(" * 150 + "1+1+1" + ")" * 150 + ", 2\n",
    "x = " + "lambda: " * 200 + "1 if a else 2 if b else 3\n",
    "x = {'k': [i ** 2 for i in range(3) if i], **y}; z = (a, (b, -c))\n",
    "def f(a: int = 1 + 2) -> int:\n    return await g(x)[y].z\n",
    "x = f'{a + b}' + f\"{c.d}\"\n",
])
def test_the_bound_is_never_below_the_depth(source: str) -> None:
    assert nesting_bound(source) >= _depth(ast.parse(source))


def test_siblings_do_not_add_up() -> None:
    # A long data table is shallow: its items are siblings, on every Python.
    source = "TABLE = [" + ", ".join(f"(-{i}, {i} + 1, f(x))" for i in range(4_000)) + "]\n"
    assert len(source) > LIMIT and nesting_bound(source) < 10
    check_depth(source)


def test_a_chain_past_the_limit_is_refused_before_the_parse() -> None:
    with pytest.raises(RecursionError):
        check_depth("x = " + "1+" * (LIMIT + 1) + "1\n")
    with pytest.raises(RecursionError):  # an f-string is one token before 3.12: its length counts
        check_depth("x = f'{" + "1+" * (LIMIT + 1) + "1}'\n")
    check_depth("x = (\n")  # not Python: left to ast.parse's syntax error


def test_a_deep_file_is_a_lint_error_on_every_python() -> None:
    # 3.11+: ast.parse's own RecursionError; 3.9/3.10: check_depth's, where ast.parse would
    # kill the process (tests/lint/test_cli.py runs the 200,000-term file in a subprocess).
    with pytest.raises(LintError, match=r"too deeply nested to parse \(RecursionError\)"):
        lint_source("x = " + "1+" * 30_000 + "1\n", "deep.py")
