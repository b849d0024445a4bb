"""``trainkit analyze LOGDIR``: print the findings; exit 0 with none, 1 with some, 2 on bad usage.

A run where nothing could be analyzed (no counted step, no trace holding a step: an empty trace,
or one still being written) gets TA110, so it exits 1, never 0 as a clean run does.

Each run's trace findings are of the few steps its traces hold: a ``traces:`` line per run says
which (``traces: steps 3-5, 9-11 (2 traces)``, in trainkit's step numbering), with findings or
without, so that they can be found in TensorBoard's step times. ``--json`` prints the list of
findings as before, each with its run's ``profiled`` steps added; as an empty list has no place
for them, the ``traces:`` lines go to stderr there, beside what ``tk.analyze`` warns about.

``trainkit/cli.py`` adds this as a subcommand with :func:`add_arguments` and :func:`run`;
:func:`main` runs it alone (``python -m trainkit.profiling.cli LOGDIR``).
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import TYPE_CHECKING, List, Optional, Sequence, TextIO

from .. import _usage
from .._text import write_out
from .finding import Finding, sort_key

if TYPE_CHECKING:  # imported by run() alone, as the analysis is: not to set up the parser
    from .analyze import RunReport

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``analyze`` subcommand's arguments.

    Example::

        add_arguments(subparsers.add_parser("analyze", help="findings from a logdir"))
    """
    parser.add_argument("logdir", metavar="LOGDIR", help="a folder written by tk.session")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def render(findings: List[Finding], reports: Sequence["RunReport"] = ()) -> str:
    """The findings as plain text, most costly first (no colour: it goes into logs and CI), then
    which steps each run's traces hold (:func:`traced`)."""
    lines = [] if findings else \
        ["no findings: nothing in the records or traces points at lost step time"]
    for f in findings:
        share = "" if f.share is None else f"{f.share:6.1%} "
        lines.append(f"{f.code} {f.severity:<6} {share}{f.title}{_tag(f.run)}")
        lines.append(f"    evidence: {f.evidence}")
        lines.append(f"    fix:      {f.fix}")
    lines.extend(traced(r) for r in reports)
    return "\n".join(lines) + "\n"


def _tag(run: str) -> str:
    return "" if run == "." else f" [{run}]"


def traced(report: "RunReport") -> str:
    """One line: the steps the run's analyzed traces hold, e.g. ``traces: steps 3-5, 9-11
    (2 traces)``; ``traces: none`` for a run without any."""
    p = report.profiled
    if not p.traces:
        n = len(report.traces) + len(report.writing)
        said = f"no profiled step in the run's {n} trace(s)" if n else "none"
        return f"traces: {said}{_tag(report.run)}"
    parts = []
    if p.steps:
        spans = [str(a) if a == b else f"{a}-{b}" for a, b in p.ranges()]
        parts.append(("step " if len(p.steps) == 1 else "steps ") + ", ".join(spans))
    if p.unnumbered:
        parts.append(f"{p.unnumbered} without ProfilerStep marks, each taken whole as one step")
    count = f"{p.traces} trace" + ("" if p.traces == 1 else "s")
    return f"traces: {'; '.join(parts)} ({count}){_tag(report.run)}"


def run(args: argparse.Namespace, *, out: Optional[TextIO] = None,
        err: Optional[TextIO] = None) -> int:
    """Analyze ``args.logdir`` and print the findings; returns the exit status.

    What ``tk.analyze`` warns about (a trace still being written, left out) goes to ``err``.
    """
    from .analyze import analyze_runs

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            reports = analyze_runs(args.logdir)
        except (ValueError, TypeError) as exc:
            print(f"trainkit analyze: {exc}", file=err)
            return EXIT_USAGE
    for w in caught:
        if issubclass(w.category, UserWarning):
            print(f"trainkit analyze: {w.message}", file=err)
        else:  # not ours to reword: shown as Python would have shown it
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    found = sorted((f for r in reports for f in r.findings), key=sort_key)
    if getattr(args, "json", False):
        profiled = {r.run: r.profiled.to_dict() for r in reports}
        text = json.dumps([dict(f.to_dict(), profiled=profiled[f.run]) for f in found],
                          indent=2) + "\n"
        for r in reports:
            print(f"trainkit analyze: {traced(r)}", file=err)
    else:
        text = render(found, reports)
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
    return _usage.interruptible("trainkit analyze", lambda: run(args))  # as `trainkit analyze`


if __name__ == "__main__":
    sys.exit(main())
