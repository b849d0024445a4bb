"""The ``trainkit`` command: demo, lint, analyze.

Exit status: 0 success, 1 findings or a failed check, 2 bad usage (argparse's own convention).
Each subcommand's module is imported only when that subcommand runs, so ``trainkit --help`` and
``trainkit lint`` never import torch.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import signal
import sys
from typing import Callable, Dict, List, Optional, Tuple

from . import _usage
from ._text import reader_gone

# name -> (module with add_arguments(parser) and run(args) -> int, one-line help)
_SUBCOMMANDS: Dict[str, Tuple[str, str]] = {
    "demo": ("trainkit.cli", "train the built-in workload under trainkit and write a TensorBoard run"),
    "lint": ("trainkit.lint.cli", "find known training-loop mistakes in Python files (no code is run)"),
    "analyze": ("trainkit.profiling.cli", "findings from a session's records and traces"),
}


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--logdir", metavar="DIR",
                   help="run folder (default: runs/demo-<date>-<time>, a new one each run); a "
                        "folder that holds an earlier run gets this one beside it, and "
                        "TensorBoard shows the two as one run")
    p.add_argument("--epochs", type=int, default=2, metavar="N",
                   help="passes over the data (default: 2)")
    p.add_argument("--train-size", type=int, default=6400, metavar="N",
                   help="training images, any number: more than fit in memory are made as they "
                        "are used (default: 6400)")
    p.add_argument("--max-seconds", type=float, default=50.0, metavar="SECONDS",
                   help="stop training after this long (default: 50)")
    p.add_argument("--batch-size", type=int, default=64, metavar="N",
                   help="batch size (default: 64; under torchrun, each rank's)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (else a bar on a terminal; into a file or a pipe, a line "
                        "each epoch and every 10 s)")


def _demo_run(args: argparse.Namespace) -> int:
    """``trainkit demo``: its options checked, then the run (which says a Ctrl-C, a SIGTERM or a
    SIGHUP itself). One before it (torch still importing) ends the process by its signal too,
    without a traceback: nothing was recorded yet."""
    try:
        with _usage.sigterm_raises():
            return _demo_checked(args)
    except KeyboardInterrupt:
        _say_nothing_recorded("interrupted")
        _usage.die_by(signal.SIGINT)
        return 130  # where a process cannot end by its own SIGINT
    except _usage.Terminated as stop:
        _say_nothing_recorded(f"terminated ({stop.name})")
        _usage.die_by(stop.signum)
        return 128 + stop.signum  # where a process cannot end by its own signal


def _say_nothing_recorded(how: str) -> None:
    if not _usage.quiet_rank():
        print(f"trainkit demo: {how} before training began; nothing was recorded",
              file=sys.stderr)


def _demo_checked(args: argparse.Namespace) -> int:
    from . import demo, switches

    try:
        # a malformed TRAINKIT_TECHNIQUES: said as a bad option is, before anything is made
        switches.check_overrides()
        config = demo.DemoConfig(logdir=args.logdir, epochs=args.epochs, train_size=args.train_size,
                                 batch_size=args.batch_size, max_seconds=args.max_seconds,
                                 progress=not args.no_progress)
        demo.check_memory(config)  # a --batch-size that cannot fit: said before anything is made
        if args.logdir is not None:  # --logdir / or ~: refused before a folder is made or written
            from ._logdir import check_not_everything

            check_not_everything(args.logdir, option="--logdir")
    except ValueError as exc:
        return _usage.leave(f"trainkit demo: {exc}\n")
    # The default folder is fixed (and made) here, so it is checked like a given one and the run
    # says it.
    logdir = demo.default_logdir() if args.logdir is None else args.logdir
    config = dataclasses.replace(config, logdir=logdir)
    from ._logdir import check_logdir

    try:  # a bad folder is refused here, not after a traceback, as the option it came by
        check_logdir(logdir, option="--logdir")
    except ValueError as exc:
        hint = "" if args.logdir is not None else (
            " (the default run folder, under the current directory: choose another with --logdir DIR)")
        return _usage.leave(f"trainkit demo: {exc}{hint}\n")
    return demo.main(config)


def _hooks(name: str) -> Tuple[Callable[[argparse.ArgumentParser], None],
                               Callable[[argparse.Namespace], int]]:
    if name == "demo":
        return _demo_arguments, _demo_run
    module = importlib.import_module(_SUBCOMMANDS[name][0])
    return module.add_arguments, module.run


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    return _build(only)[0]


def _build(only: Optional[str]
           ) -> Tuple[argparse.ArgumentParser, Dict[str, argparse.ArgumentParser]]:
    """The ``trainkit`` parser, and its subcommands' parsers by name (only the subcommand
    ``only`` gets its options, so that its module alone is imported)."""
    parser = argparse.ArgumentParser(
        prog="trainkit",
        description="Make hand-written PyTorch training loops fast, and show what made them fast.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"trainkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subs = {}
    for name, (_, help_text) in _SUBCOMMANDS.items():
        subs[name] = sub.add_parser(name, help=help_text, description=help_text)
        if only == name:  # `trainkit --help` imports no subcommand
            _hooks(name)[0](subs[name])
    return parser, subs


#: The commands whose Ctrl-C is said in one line from the start, their parser's imports included
#: (``trainkit lint``'s rules take ~0.2 s to import): they keep nothing a Ctrl-C could lose.
_SAID_INTERRUPTED = ("lint", "analyze")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``trainkit`` console script.

    Example::

        trainkit demo --epochs 1
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in _SAID_INTERRUPTED:
        # From here, not from the run alone: a Ctrl-C while the subcommand's module imports
        # printed a KeyboardInterrupt traceback. (Before main, while `import trainkit` runs,
        # nothing of trainkit's can catch it.)
        return _usage.interruptible(f"trainkit {command}", lambda: _main(argv, command))
    return _main(argv, command)


def _parse(parser: argparse.ArgumentParser, subs: Dict[str, argparse.ArgumentParser],
           argv: List[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an argument the subcommand does not take is said by the
    subcommand's parser: the top-level parser said it with its own usage, ``trainkit [-h]
    [--version] COMMAND ...``, for ``trainkit analyze runs/a runs/b`` or ``trainkit demo
    --steps 10``, which shows none of the options the command does take."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        # one given before the command (`trainkit --bogus demo`) is the top-level parser's
        before = argv[:argv.index(args.command)] if args.command in argv else argv
        said_by = parser if not args.command or set(extra) & set(before) else subs[args.command]
        said_by.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _main(argv: List[str], command: Optional[str]) -> int:
    """:func:`main` once its Ctrl-C is handled: the parser built, the arguments read, the
    subcommand run."""
    parser, subs = _build(command if command in _SUBCOMMANDS else None)
    said = io.StringIO()  # on a quiet rank, what argparse says (its usage error, --help)
    quiet = contextlib.ExitStack()
    if _usage.quiet_rank():  # the first rank says it (argparse prints it)
        quiet.enter_context(contextlib.redirect_stdout(said))
        quiet.enter_context(contextlib.redirect_stderr(said))
    try:
        with quiet:
            args = _parse(parser, subs, argv)
    except SystemExit as exc:
        if exc.code == 2 and _usage.ranked():  # said once under torchrun, every rank exits 2
            return _usage.leave(said.getvalue())
        raise
    if args.command is None:  # the help, once under torchrun, and every rank exits 2
        try:
            return _usage.leave(parser.format_help(), sys.stdout)
        except BrokenPipeError:  # `trainkit | head` whose reader went away first
            reader_gone(sys.stdout)
            return 2
    # `trainkit demo` says its own Ctrl-C; analyze and lint have nothing kept
    return _usage.interruptible(f"trainkit {args.command}", lambda: _hooks(args.command)[1](args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
