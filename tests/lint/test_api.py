"""The Python API: selection, suppression comments, errors, discovery, the registry."""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from tests.lint._helpers import REPO_ROOT
from trainkit.lint import RULES, Finding, LintError, iter_python_files, lint_paths, lint_source, parse_codes

FLUSHING_LOOP = textwrap.dedent(
    """\
    import gc
    import torch
    for x in loader:
        loss = model(x)
        loss.backward()
        optimizer.step(); optimizer.zero_grad()
        gc.collect()
        print(loss.item())
    """
)


def _codes(source: str, **kwargs: object) -> list:
    return [(f.code, f.line) for f in lint_source(source, **kwargs)]  # type: ignore[arg-type]


def test_flush_fixes_fit_the_call() -> None:
    src = FLUSHING_LOOP.replace("gc.collect()", "gc.collect(); torch.cuda.empty_cache()")
    fixes = {f.message.split("`")[1]: f.fix for f in lint_source(src) if f.code == "TK301"}
    assert "caching allocator" in fixes["torch.cuda.empty_cache()"]
    assert "Python's collector" in fixes["gc.collect()"] and "allocator" not in fixes["gc.collect()"]


def test_select_and_ignore_take_codes_and_family_prefixes() -> None:
    assert _codes(FLUSHING_LOOP) == [("TK301", 7), ("TK302", 8)]
    assert _codes(FLUSHING_LOOP, select=["TK301"]) == [("TK301", 7)]
    assert _codes(FLUSHING_LOOP, select="tk3", ignore="TK302") == [("TK301", 7)]
    assert _codes(FLUSHING_LOOP, ignore="TK3") == []
    assert _codes(FLUSHING_LOOP, select="TK1,TK2") == []


@pytest.mark.parametrize("option", ["select", "ignore"])
def test_unknown_code_names_the_value_and_lists_valid_codes(option: str) -> None:
    with pytest.raises(ValueError, match=r"unknown rule code 'TK999' in " + option) as info:
        lint_source("x = 1\n", **{option: ["TK101", "TK999"]})  # type: ignore[arg-type]
    assert "TK101, TK102" in str(info.value)


def test_parse_codes_splits_strings_instead_of_iterating_letters() -> None:
    assert parse_codes("TK1, tk301", option="--select") == frozenset({"TK1", "TK301"})
    with pytest.raises(ValueError, match="''"):
        parse_codes("TK1,,", option="--select")


@pytest.mark.parametrize(
    ("comment", "left"),
    [
        ("# trainkit: ignore[TK301]", [("TK302", 8)]),
        ("# trainkit: ignore[TK3]", [("TK302", 8)]),
        ("# trainkit: ignore", [("TK302", 8)]),
        ("# TRAINKIT: IGNORE[tk301, TK302]", [("TK302", 8)]),
        ("# noqa  # trainkit: ignore[TK302]", [("TK301", 7), ("TK302", 8)]),
    ],
)
def test_ignore_comment_silences_its_own_line_only(comment: str, left: list) -> None:
    source = FLUSHING_LOOP.replace("gc.collect()", f"gc.collect()  {comment}")
    assert _codes(source) == left


def test_ignore_with_two_codes_and_a_hash_inside_a_string() -> None:
    source = FLUSHING_LOOP.replace("print(loss.item())", 'print("# trainkit: ignore", loss.item())')
    assert _codes(source) == [("TK301", 7), ("TK302", 8)]
    source = FLUSHING_LOOP.replace("gc.collect()", "gc.collect(); loss.cpu()  # trainkit: ignore[TK301,TK302]")
    assert _codes(source) == [("TK302", 8)]


def test_syntax_error_raises_lint_error_with_line() -> None:
    with pytest.raises(LintError) as info:
        lint_source("for x in y:\n    pass\ndef broken(:\n", "bad.py")
    assert (info.value.path, info.value.line) == ("bad.py", 3)
    assert "syntax error" in info.value.reason


def test_missing_path_raises_lint_error(tmp_path: Path) -> None:
    with pytest.raises(LintError, match="no such file"):
        lint_paths([str(tmp_path / "nope.py")])


def test_folders_skip_hidden_pycache_and_virtualenvs(tmp_path: Path) -> None:
    for rel in ["a.py", "pkg/b.py", "pkg/notes.txt", ".hidden/c.py", "__pycache__/d.py", "site-packages/e.py", "myenv/f.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    found = [Path(p).relative_to(tmp_path).as_posix() for p in iter_python_files([str(tmp_path)])]
    assert found == ["a.py", "pkg/b.py"]


def test_lint_paths_lints_a_file_named_twice_once(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FLUSHING_LOOP)
    once = lint_paths([str(tmp_path)], select="TK301")
    assert once and lint_paths([str(tmp_path), str(tmp_path / "train.py")], select="TK301") == once


def test_lint_paths_reports_paths_as_given(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FLUSHING_LOOP)
    findings = lint_paths([str(tmp_path)], select="TK301")
    assert findings == [
        Finding(
            path=str(tmp_path / "train.py"),
            line=7,
            col=5,
            code="TK301",
            severity="warning",
            message=findings[0].message,
            fix=findings[0].fix,
        )
    ]
    assert "gc.collect()" in findings[0].message and findings[0].fix


def test_registry_codes_severities_and_texts() -> None:
    assert sorted(RULES) == [
        "TK101", "TK102", "TK103", "TK104", "TK105", "TK106", "TK107", "TK108", "TK109", "TK110", "TK111", "TK112",
        "TK113", "TK114", "TK201", "TK202", "TK301", "TK302", "TK401", "TK402", "TK501", "TK502",
    ]
    for code, rule in RULES.items():
        assert re.fullmatch(r"TK\d{3}", code) and rule.code == code
        assert rule.severity in ("error", "warning", "advice")
        assert rule.summary and rule.name
    assert {c for c, r in RULES.items() if r.severity == "error"} == {"TK101", "TK102", "TK103", "TK104", "TK105", "TK106",
                                                                          "TK107", "TK108", "TK109", "TK111", "TK113",
                                                                          "TK114", "TK201", "TK202"}
    assert {c for c, r in RULES.items() if r.severity == "advice"} == {"TK402", "TK501", "TK502"}
    assert {c for c, r in RULES.items() if r.severity == "warning"} == {"TK110", "TK112", "TK301", "TK302", "TK401"}


def test_docs_have_a_paragraph_per_rule() -> None:
    docs = (REPO_ROOT / "docs" / "lint.md").read_text(encoding="utf-8")
    for code in RULES:
        assert re.search(rf"^#+ {code}\b", docs, re.MULTILINE), f"docs/lint.md has no section for {code}"


def test_docs_lines_fit_in_100_characters() -> None:
    # outside code blocks and table rows, which Markdown cannot wrap
    fenced = False
    long = []
    for number, line in enumerate((REPO_ROOT / "docs" / "lint.md").read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.lstrip().startswith("|") and len(line) > 100:
            long.append(number)
    assert long == [], f"docs/lint.md lines over 100 characters: {long}; rewrap them"


def test_linter_never_imports_torch() -> None:
    # The linter must run where torch is absent: check its own imports statically.
    package = REPO_ROOT / "trainkit" / "lint"
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] == "torch" for n in names), f"{path.name} imports torch"


@pytest.mark.parametrize("module", ["_api", "_registry", "_suppress", "cli"])
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"trainkit.lint.{module}"), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
