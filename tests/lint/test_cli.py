"""``python -m trainkit.lint`` in real subprocesses: output formats and exit codes."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from tests.lint._helpers import FIXTURES, REPO_ROOT
from trainkit.lint import cli

BAD = "tests/lint/fixtures/bad"
CLEAN = "tests/lint/fixtures/clean"
LINE_RE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): (?P<code>TK\d{3}) \[(error|warning|advice)\] .+; fix: .+$")


def lint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainkit.lint", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


def test_clean_folder_exits_0_with_summary() -> None:
    result = lint(CLEAN)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""
    assert re.match(r"^0 findings in 0 files \(\d+ files checked\)$", result.stderr.strip())


def test_findings_exit_1_in_path_line_code_format() -> None:
    result = lint(f"{BAD}/tk101_divide_after_backward.py", f"{BAD}/efficient_template.py")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert all(LINE_RE.match(line) for line in lines), lines
    heads = [line.split(" [")[0] for line in lines]
    assert f"{BAD}/tk101_divide_after_backward.py:8: TK101" in heads
    assert f"{BAD}/efficient_template.py:26: TK101" in heads
    assert "tk.accumulate(n, optimizer)" in lines[heads.index(f"{BAD}/efficient_template.py:26: TK101")]
    assert result.stderr.strip() == f"{len(lines)} findings in 2 files (2 files checked)"


def test_json_format_parses_with_all_fields() -> None:
    result = lint("--format", "json", f"{BAD}/tk201_scaler_step_without_update.py")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data == [
        {
            "path": f"{BAD}/tk201_scaler_step_without_update.py",
            "line": 11,
            "col": 9,
            "code": "TK201",
            "severity": "error",
            "message": data[0]["message"],
            "fix": data[0]["fix"],
        }
    ]
    assert "scaler.update()" in data[0]["fix"]
    assert lint("--format", "json", CLEAN).stdout.strip() == "[]"


def test_select_and_ignore_options() -> None:
    target = f"{BAD}/efficient_template.py"
    codes = lambda r: sorted({line.split(": ")[1].split()[0] for line in r.stdout.splitlines()})  # noqa: E731
    assert codes(lint("--select", "TK1,TK301", target)) == ["TK101", "TK301"]
    assert codes(lint("--ignore", "TK4,TK5", target)) == ["TK101", "TK301"]
    result = lint("--select", "TK5", "--ignore", "TK501", target)
    assert (result.returncode, codes(result)) == (1, ["TK502"])
    assert lint("--select", "TK2", target).returncode == 0


@pytest.mark.parametrize("option", ["--select", "--ignore"])
def test_unknown_code_is_a_usage_error(option: str) -> None:
    result = lint(option, "TK101,TK999", CLEAN)
    assert result.returncode == 2
    assert "'TK999'" in result.stderr and "TK101, TK102" in result.stderr


def test_ignore_comment_via_cli(tmp_path: Path) -> None:
    source = (FIXTURES / "bad" / "tk301_flush_every_step.py").read_text(encoding="utf-8")
    target = tmp_path / "train.py"
    target.write_text(source.replace("empty_cache()  # expect: TK301", "empty_cache()  # trainkit: ignore[TK301]"))
    result = lint(str(target))
    assert result.returncode == 1
    assert [line.split(" [")[0] for line in result.stdout.splitlines()] == [f"{target}:15: TK301"]


def test_syntax_error_exits_2_with_line_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("import gc\nfor x in d:\n    x.backward()\n    gc.collect()\n")
    (tmp_path / "broken.py").write_text("x = 1\n\nif x\n    pass\n")
    result = lint(str(tmp_path))
    assert result.returncode == 2
    assert re.search(rf"^{re.escape(str(tmp_path / 'broken.py'))}:3: syntax error: ", result.stderr, re.MULTILINE)
    # The readable file is still linted.
    assert result.stdout.startswith(f"{tmp_path / 'ok.py'}:4: TK301 ")
    assert result.stderr.strip().endswith("(1 file checked, 1 could not be parsed)")
    assert "not a .py file" not in result.stderr


def test_a_named_file_that_is_not_python_says_so(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("# Notes\n\nIt's a 'quote\n")
    result = lint(str(tmp_path / "notes.md"))
    assert result.returncode == 2
    assert "syntax error" in result.stderr and "(not a .py file: is it Python?)" in result.stderr
    assert "(0 files checked, 1 could not be parsed)" in result.stderr


def test_missing_path_exits_2(tmp_path: Path) -> None:
    result = lint(str(tmp_path / "missing.py"))
    assert result.returncode == 2
    assert "missing.py: no such file or directory" in result.stderr


def test_no_paths_is_a_usage_error() -> None:
    assert lint().returncode == 2


def test_add_arguments_and_run_work_on_a_subcommand_parser(capsys: pytest.CaptureFixture) -> None:
    # How trainkit's own CLI mounts the linter.
    parser = argparse.ArgumentParser(prog="trainkit")
    sub = parser.add_subparsers(dest="command").add_parser("lint")
    cli.add_arguments(sub)
    args = parser.parse_args(["lint", "--select", "TK402", str(FIXTURES / "bad" / "tk402_jit.py")])
    assert cli.run(args) == 1
    out: List[str] = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[1].split()[0] for line in out] == ["TK402"] * 3
    # A hand-built Namespace with a raw, bad string is still rejected.
    bad = argparse.Namespace(paths=[CLEAN], format="text", select="NOPE", ignore=None)
    assert cli.run(bad) == 2
    assert "'NOPE'" in capsys.readouterr().err


def test_main_without_subprocess(capsys: pytest.CaptureFixture) -> None:
    assert cli.main([str(FIXTURES / "clean")]) == 0
    assert "0 findings" in capsys.readouterr().err


def _deep_sources(tmp_path: Path) -> None:
    (tmp_path / "deep.py").write_text("x = " + "1+" * 200_000 + "1\n")  # the parser's own limit
    (tmp_path / "chain.py").write_text("x = a" + ".b" * 2_000 + "\n")  # deeper than Python's recursion limit
    (tmp_path / "ok.py").write_text("import gc\nfor x in d:\n    x.backward()\n    gc.collect()\n")


def test_deeply_nested_file_is_a_per_file_error_not_a_crash(tmp_path: Path) -> None:
    _deep_sources(tmp_path)
    result = lint(str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{tmp_path / 'deep.py'}: too deeply nested to parse (RecursionError); not linted" in result.stderr
    # The others are still linted: a long attribute chain is fine, the flush is found.
    assert result.stdout.startswith(f"{tmp_path / 'ok.py'}:4: TK301 ")
    assert result.stderr.strip().endswith("(2 files checked, 1 could not be parsed)")


def test_missing_path_does_not_stop_the_others_and_json_still_prints(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("import gc\nfor x in d:\n    x.backward()\n    gc.collect()\n")
    result = lint("--format", "json", str(tmp_path / "missing.py"), str(tmp_path / "ok.py"))
    assert result.returncode == 2
    assert [f["code"] for f in json.loads(result.stdout)] == ["TK301"]
    assert f"{tmp_path / 'missing.py'}: no such file or directory" in result.stderr


def test_unreadable_file_says_so_without_a_line_zero(tmp_path: Path) -> None:
    (tmp_path / "latin.py").write_bytes(b"# caf\xe9\nx = 1\n")  # not UTF-8 and no coding cookie
    result = lint(str(tmp_path / "latin.py"))
    assert result.returncode == 2
    assert f"{tmp_path / 'latin.py'}:1: cannot read: byte 0xe9 (column 6) is not valid UTF-8" in result.stderr
    assert ":0:" not in result.stderr
    assert result.stderr.strip().endswith("(0 files checked, 1 could not be read)")


def test_a_trailing_comma_in_select_is_accepted() -> None:
    result = lint("--select", "TK3,", f"{BAD}/efficient_template.py")
    assert result.returncode == 1, result.stderr
    assert {line.split(": ")[1].split()[0] for line in result.stdout.splitlines()} == {"TK301"}


def test_a_file_given_twice_is_linted_once(capsys: pytest.CaptureFixture) -> None:
    """``trainkit lint src/ src/train.py`` (a folder and a file in it, or one path two ways)."""
    bad = FIXTURES / "bad"
    one = bad / "tk101_divide_after_backward.py"
    assert cli.main([str(one)]) == 1
    alone = capsys.readouterr()
    assert cli.main([str(bad), str(one), str(bad / ".." / "bad" / one.name)]) == 1
    both = capsys.readouterr()
    mine = [line for line in both.out.splitlines() if one.name in line]
    assert mine and len(mine) == len(alone.out.splitlines())
    checked = int(re.search(r"\((\d+) files checked\)", both.err).group(1))
    assert checked == len(list(bad.rglob("*.py")))


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_reader_that_went_away_is_no_traceback(fmt: str) -> None:
    """``trainkit lint src/ | head`` (or ``| grep -q``): the pipe closes before the output ends."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first finding is written
    try:
        result = subprocess.run(
            [sys.executable, "-m", "trainkit.lint", "--format", fmt, f"{BAD}/tk302_host_sync.py"],
            cwd=REPO_ROOT, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert result.returncode == 1


def test_a_notebook_is_refused_with_the_export_command_not_passed_clean(tmp_path: Path) -> None:
    """A notebook's JSON parses as one Python dict: linted as it was, it "passed" with 0 findings."""
    notebook = tmp_path / "train.ipynb"
    cell = "for i, (x, y) in enumerate(loader):\n    loss = f(x)\n    loss.backward()\n    loss = loss / 4\n"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [cell]}], "nbformat": 4}))
    result = lint(str(notebook))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Jupyter notebook" in result.stderr
    assert f"jupyter nbconvert --to script {notebook}" in result.stderr
    assert f"trainkit lint {tmp_path / 'train.py'}" in result.stderr
