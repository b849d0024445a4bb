"""The examples' argparse types: a bad count or run folder is a usage error (exit 2, one line
naming the value) before any data or model is made, not a traceback once training starts.

Each example imports them (``python examples/NAME.py`` puts this folder on ``sys.path``); a loop
copied out of an example needs only ``type=int`` and ``tk.session(logdir=...)``'s own checks.
"""
from __future__ import annotations

import argparse
import os


def positive_int(text: str) -> int:
    """argparse's type for a count: 0, -1 or 1.5 is said as a usage error (exit 2) up front,
    not as a traceback (or an empty run) once training starts."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int (1 or more), not {text!r}")
    return value


def run_folder(text: str) -> str:
    """argparse's type for --logdir: a file, a folder that cannot be written, or the root or home
    folder itself (which the session refuses), is said as a usage error (exit 2) up front, not as
    the session's traceback once the data is made."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty, e.g. --logdir runs/exp1")
    there = os.path.abspath(os.path.expanduser(text))
    everything = (os.path.realpath(os.sep), os.path.realpath(os.path.expanduser("~")))
    if os.path.realpath(there) in everything:
        raise argparse.ArgumentTypeError(f"{text!r} is the filesystem root or your home folder: "
                                         f"give the run a folder of its own, e.g. "
                                         f"--logdir runs/exp1")
    while not os.path.lexists(there):  # the folder the session will make it in
        there = os.path.dirname(there)
    if not os.path.isdir(there):
        raise argparse.ArgumentTypeError(f"{text!r}: {there!r} is not a folder; give a folder "
                                         f"(made if missing), e.g. --logdir runs/exp1")
    if not os.access(there, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: {there!r} is not writable; give a folder "
                                         f"you can write to, e.g. --logdir runs/exp1")
    return text
