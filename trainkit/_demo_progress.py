"""``trainkit demo``'s progress: rich's bar on a terminal, plain lines where stderr is none.

Piped or redirected (``trainkit demo 2>&1 | tee log``, CI) or on a dumb terminal, rich's bar
draws nothing until it stops: a run of up to a minute said nothing that told it from a hung one.
There the demo writes a line at each epoch's end and at least every :data:`EVERY` seconds, with
no control characters.
"""
from __future__ import annotations

import datetime
import sys
import time
from typing import Any, Optional, TextIO

#: Seconds between two plain progress lines within an epoch.
EVERY = 10.0


class NoBar:
    """No progress at all: ``--no-progress``, and the ranks other than 0 under torchrun."""

    def add_task(self, *a: Any, **k: Any) -> int:
        return 0

    def advance(self, *a: Any, **k: Any) -> None:
        pass

    def __enter__(self) -> "NoBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class Lines(NoBar):
    """Progress as lines, ``training: epoch 1/2, 100/200 steps, 0:00:12``, for a log file.

    Example::

        with Lines(sys.stderr, epochs=2) as bar:
            task = bar.add_task("training", total=200)
            bar.advance(task)
    """

    def __init__(self, out: TextIO, epochs: int, every: float = EVERY) -> None:
        self._out, self._epochs, self._every = out, epochs, every
        self._description, self._total, self._done, self._said = "", 0, 0, 0
        self._start = self._next = 0.0

    def add_task(self, description: str, total: int, **k: Any) -> int:
        self._description, self._total = description, total
        self._start = time.monotonic()
        self._next = self._start + self._every
        return 0

    def advance(self, *a: Any, **k: Any) -> None:
        self._done += 1
        per_epoch = max(1, self._total // self._epochs)
        if self._done % per_epoch == 0 or time.monotonic() >= self._next:
            self._say()

    def __exit__(self, *exc: Any) -> None:
        if self._done != self._said and exc[0] is None:  # a run ended by --max-seconds
            self._say()

    def _say(self) -> None:
        now = time.monotonic()
        self._next, self._said = now + self._every, self._done
        per_epoch = max(1, self._total // self._epochs)
        epoch = min(self._epochs, -(-self._done // per_epoch))
        elapsed = datetime.timedelta(seconds=int(now - self._start))
        try:
            self._out.write(f"{self._description}: epoch {epoch}/{self._epochs}, "
                            f"{self._done}/{self._total} steps, {elapsed}\n")
            self._out.flush()
        except (OSError, ValueError):  # stderr gone (a closed pipe): progress is not the run
            self._every = float("inf")
            self._out = _Nowhere()


class _Nowhere:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def progress(enabled: bool, epochs: int, out: Optional[TextIO] = None) -> Any:
    """The demo's progress on ``out`` (stderr): rich's bar where it is a terminal that draws
    one, else :class:`Lines`; :class:`NoBar` where not ``enabled``.

    Example::

        with progress(True, epochs=2) as bar:
            task = bar.add_task("training", total=200)
    """
    out = sys.stderr if out is None else out
    if not enabled or out is None:  # `trainkit demo 2>&-`: Python's stderr is None
        return NoBar()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=out)
    if not console.is_interactive:  # redirected, piped, TERM=dumb: rich would draw at the end
        return Lines(out, epochs)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=False)
