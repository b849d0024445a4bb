"""Command line of ``trainkit lint`` (also ``python -m trainkit.lint``).

Exit status: 0 no findings, 1 findings, 2 usage error or a file that could not
be linted (missing, unreadable, syntax error).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, FrozenSet, List, Literal, Optional, Sequence, Set

from trainkit import _usage
from trainkit._text import write_out
from trainkit.lint import _api
from trainkit.lint._registry import Finding, LintError

Format = Literal["text", "json"]
_FORMATS = ("text", "json")


def _codes_argument(option: str) -> Callable[[str], FrozenSet[str]]:
    """An argparse ``type=`` that validates codes, so a bad one is a usage error (exit 2)."""

    def parse(value: str) -> FrozenSet[str]:
        try:
            return _api.parse_codes(value, option=option) or frozenset()
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``trainkit lint``'s arguments to ``parser`` (a subcommand parser or a fresh one).

    Example::

        sub = subparsers.add_parser("lint", help="find mistakes in training loops")
        trainkit.lint.cli.add_arguments(sub)
        # later: sys.exit(trainkit.lint.cli.run(args))
    """
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders (folders: every *.py, recursively)")
    parser.add_argument(
        "--format", choices=_FORMATS, default="text", help="text (PATH:LINE: CODE [severity] message; fix: ...) or json (a list of objects)"
    )
    for option, example, verb in (("--select", "TK1,TK301", "run"), ("--ignore", "TK5", "skip")):
        parser.add_argument(
            option,
            type=_codes_argument(option),
            default=None,
            metavar="CODES",
            help=f"comma-separated codes or prefixes to {verb}, e.g. {example}",
        )


def _print_findings(findings: List[Finding], fmt: Format) -> None:
    """The findings on stdout, flushed; a reader that stops early (``| head``) ends the output."""
    if fmt == "json":
        text = json.dumps([f.to_dict() for f in findings], indent=2) + "\n"
    else:
        text = "".join(finding.format() + "\n" for finding in findings)
    write_out(sys.stdout, text)


def _print_text(findings: List[Finding], checked: int, unparsed: int = 0, unread: int = 0) -> None:
    _print_findings(findings, "text")
    files = len({f.path for f in findings})
    failed = "".join(
        f", {count} {what}" for count, what in ((unparsed, "could not be parsed"), (unread, "could not be read")) if count
    )
    print(
        f"{len(findings)} finding{'s' * (len(findings) != 1)} in {files} file{'s' * (files != 1)} "
        f"({checked} file{'s' * (checked != 1)} checked{failed})",
        file=sys.stderr,
    )


def _report_failure(exc: LintError, path: str) -> None:
    """``PATH:LINE: syntax error: ...``, or ``PATH: reason`` when there is no line."""
    hint = "" if path.endswith(".py") or "syntax error" not in exc.reason else " (not a .py file: is it Python?)"
    where = f"{exc.path}:{exc.line}" if exc.line else exc.path
    print(f"{where}: {exc.reason}{hint}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Lint ``args.paths`` and print the findings.

    Every path is linted even when another one is missing or broken, and
    ``--format json`` always prints its list.

    Args:
        args: Parsed arguments from a parser set up by :func:`add_arguments`.

    Returns:
        0 without findings, 1 with findings, 2 on a bad code or a path that
        could not be linted: missing, unreadable, a syntax error (reported on
        stderr as ``PATH:LINE: syntax error: ...``) or nested too deeply.
    """
    fmt: Format = getattr(args, "format", "text")
    select, ignore = getattr(args, "select", None), getattr(args, "ignore", None)
    try:
        # Values may be raw strings when the Namespace was built by hand.
        _api.parse_codes(select, option="--select")
        _api.parse_codes(ignore, option="--ignore")
    except ValueError as exc:
        print(f"trainkit lint: error: {exc}", file=sys.stderr)
        return 2
    findings: List[Finding] = []
    unparsed = unread = checked = missing = 0
    files: List[str] = []
    seen: Set[str] = set()  # a file given twice (``src/ src/train.py``) is linted once
    for given in args.paths:
        walk_errors: List[LintError] = []  # folders inside it that cannot be listed
        try:
            files.extend(_api.iter_python_files([given], seen, walk_errors))
        except LintError as exc:
            if exc.reason.startswith("cannot read"):  # a folder that cannot be listed
                unread += 1
            else:
                missing += 1
            _report_failure(exc, given)
        for exc in walk_errors:
            unread += 1
            _report_failure(exc, exc.path)
    for path in files:
        try:
            try:
                findings.extend(_api.lint_file(path, select=select, ignore=ignore))
            except (RecursionError, MemoryError) as exc:  # a backstop: lint_source turns these into LintError
                raise LintError(path, 0, f"too deeply nested to lint ({type(exc).__name__}); not linted") from exc
            checked += 1
        except LintError as exc:
            if exc.reason.startswith("cannot read"):
                unread += 1
            else:
                unparsed += 1
            _report_failure(exc, path)
    findings.sort(key=lambda f: (f.path, f.line, f.col, f.code))
    if fmt == "json":
        _print_findings(findings, "json")
    else:
        _print_text(findings, checked, unparsed, unread)
    if unparsed or unread or missing:
        return 2
    return 1 if findings else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m trainkit.lint``.

    Example::

        >>> main(["train.py", "--select", "TK1"])  # doctest: +SKIP
        1
    """
    parser = argparse.ArgumentParser(
        prog="trainkit lint", description="Find known mistakes in PyTorch training loops, without running them."
    )
    add_arguments(parser)
    # a Ctrl-C said in a line, as `trainkit lint` says it (python -m trainkit.lint comes here)
    return _usage.interruptible("trainkit lint", lambda: run(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
