"""``trainkit analyze LOGDIR``: print the findings; exit 0 with none, 1 with some, 2 on bad usage.

A run where nothing could be analyzed (no counted step, no trace holding a step: an empty trace,
or one still being written) gets TA110, so it exits 1, never 0 as a clean run does.

``trainkit/cli.py`` adds this as a subcommand with :func:`add_arguments` and :func:`run`;
:func:`main` runs it alone (``python -m trainkit.profiling.cli LOGDIR``).
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import List, Optional, Sequence, TextIO

from .._text import write_out
from .finding import Finding

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``analyze`` subcommand's arguments.

    Example::

        add_arguments(subparsers.add_parser("analyze", help="findings from a logdir"))
    """
    parser.add_argument("logdir", metavar="LOGDIR", help="a folder written by tk.session")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def render(findings: List[Finding]) -> str:
    """The findings as plain text, most costly first (no colour: it goes into logs and CI)."""
    if not findings:
        return "no findings: nothing in the records or traces points at lost step time\n"
    lines = []
    for f in findings:
        share = "" if f.share is None else f"{f.share:6.1%} "
        run = "" if f.run == "." else f" [{f.run}]"
        lines.append(f"{f.code} {f.severity:<6} {share}{f.title}{run}")
        lines.append(f"    evidence: {f.evidence}")
        lines.append(f"    fix:      {f.fix}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, *, out: Optional[TextIO] = None,
        err: Optional[TextIO] = None) -> int:
    """Analyze ``args.logdir`` and print the findings; returns the exit status.

    What ``tk.analyze`` warns about (a trace still being written, left out) goes to ``err``.
    """
    from .analyze import analyze

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            found = analyze(args.logdir)
        except (ValueError, TypeError) as exc:
            print(f"trainkit analyze: {exc}", file=err)
            return EXIT_USAGE
    for w in caught:
        if issubclass(w.category, UserWarning):
            print(f"trainkit analyze: {w.message}", file=err)
        else:  # not ours to reword: shown as Python would have shown it
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if getattr(args, "json", False):
        text = json.dumps([f.to_dict() for f in found], indent=2) + "\n"
    else:
        text = render(found)
    write_out(out, text)  # `trainkit analyze runs | head`: the reader may go away first
    return EXIT_FINDINGS if found else EXIT_OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``trainkit analyze`` on its own.

    Example::

        sys.exit(main(["runs/exp1"]))
    """
    parser = argparse.ArgumentParser(prog="trainkit analyze",
                                     description="Findings from a trainkit logdir's records "
                                                 "and traces. Exit 0: none, 1: findings, 2: bad usage.")
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
