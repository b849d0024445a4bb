"""Text for error messages and warnings (and where a warning points), and output to a reader
that went away."""
from __future__ import annotations

import os
import sys
from typing import Any, List, Optional, TextIO, Tuple

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def brief(obj: Any, width: int = 80) -> str:
    """``repr(obj)`` on one line of at most ``width`` characters, for an error message.

    A model's or an optimizer's repr spans many lines; cutting it at a width leaves half a line
    and a dangling bracket in the message, so only its first line is kept, closed with ``(...)``.

    Example::

        brief(torch.optim.SGD(params, lr=0.1))  # 'SGD(...)'
    """
    try:
        text = repr(obj)
    except Exception:  # a broken __repr__ must not hide the error being reported
        return f"<{type(obj).__name__}>"
    lines = text.splitlines() or [""]
    first = lines[0].rstrip()
    if len(lines) > 1:
        first = first.rstrip(" (") + "(...)"
    if len(first) > width:
        first = first[:width - 3] + "..."
    return first


def write_out(out: TextIO, text: str) -> None:
    """Write a command's output ``text`` to ``out`` and flush it; a reader that went away first
    (``trainkit lint src/ | head``) ends the output there, quietly (:func:`reader_gone`). One
    that cannot be written (``> /dev/full``, a full disk) is said in a line, not a traceback, and
    the command exits 1."""
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        reader_gone(out)
    except OSError as exc:
        reader_gone(out)  # what is still buffered goes nowhere: Python's exit flush is quiet
        sys.stderr.write(f"trainkit: could not write the output ({exc.strerror or exc}); "
                         f"nothing is lost but that output: run the command again with room "
                         f"to write it\n")
        raise SystemExit(1) from None


def reader_gone(out: TextIO) -> None:
    """After a ``BrokenPipeError`` on ``out`` (``trainkit lint src/ | head``): point its file
    descriptor at the null device, so that nothing more goes there and Python's own flush at exit
    does not fail again ("Exception ignored ... BrokenPipeError").

    Example::

        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            reader_gone(sys.stdout)
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no file descriptor (a StringIO)
        pass


def user_stacklevel(*, past_torch: bool = False) -> int:
    """The ``stacklevel`` for a warning issued by the caller of this function that points at the
    first frame outside trainkit (and outside torch, ``past_torch``: an LR scheduler's wrapper of
    ``optimizer.step``, the profiler calling its trace handler): the user's ``with`` block or
    ``step()`` call, not trainkit's own line. Call it in the function that warns, not through a
    helper of its own (each frame between shifts the level by one).

    Example::

        warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
    """
    skip: Any = _PACKAGE
    if past_torch:
        import torch

        skip = (_PACKAGE, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    frame, level = sys._getframe(2), 2  # the caller of the function that warns
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skip):
        frame, level = frame.f_back, level + 1
    return level


def say(message: str, category: type, stacklevel: int = 2) -> None:
    """``warnings.warn(message, category, stacklevel=stacklevel)`` for what must not stop the
    training (a write that failed, a run folder made again): where the warning filters make it an
    error (``python -W error``), it is shown, not raised. Raised, it ended the writer thread or
    the write it was said in, or came out of the user's ``s.flush()``.

    Example::

        say("trainkit: ... the training goes on", RuntimeWarning)
    """
    import warnings

    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    except Warning:  # made an error
        try:
            frame = sys._getframe(stacklevel)  # where warn() pointed
            where = (frame.f_code.co_filename, frame.f_lineno)
        except ValueError:  # the stack is not that deep: warn() points at sys too
            where = ("sys", 1)
        warnings.showwarning(message, category, *where)


def say_all(said: List[Tuple[Optional[str], type]], stacklevel: int = 2, *,
            shown: bool = False) -> None:
    """``warnings.warn`` each ``(message, category)`` of ``said`` in turn (a None message: none),
    once the work they report on is done (a session's close: threads stopped, files closed,
    handlers restored).
    Where the warning filters make them errors (``python -W error``), the first is raised, after
    every later one is shown (:func:`say`): raised as it came, it skipped the rest unsaid. With
    ``shown`` all are shown, none raised: for a caller nobody can catch them from (an atexit
    callback, whose exception Python prints as "Exception ignored in atexit callback" with a
    traceback; a SIGTERM handler that ends the process by the signal right after).

    Example::

        said.append((message, RuntimeWarning))
        ...  # the rest of the close
        say_all(said, stacklevel=user_stacklevel())
    """
    import warnings

    first: Optional[Warning] = None
    for message, category in said:
        if message is None:
            continue
        if first is not None or shown:
            say(message, category, stacklevel=stacklevel + 1)
            continue
        try:
            warnings.warn(message, category, stacklevel=stacklevel + 1)
        except Warning as exc:  # made an error: raised once the others are shown
            first = exc
    if first is not None:
        raise first


def show_over(said: Warning, exc: BaseException, frame: Any) -> None:
    """Show ``said``, a warning the filters made an error, raised while ``exc`` propagates from
    the user's ``frame`` (a ``with`` block's exit): the user's exception goes on, and the warning
    is shown where it pointed, through :func:`warnings.showwarning` (which pytest records).

    Example::

        except Warning as said:
            show_over(said, exc, sys._getframe(1))
    """
    show_instead(said, frame, f"the {type(exc).__name__} under way goes on")


def show_instead(said: Warning, frame: Any, why: str) -> None:
    """Show ``said``, a warning the filters made an error, at the user's ``frame`` instead of
    raising it, saying ``why`` (what raising it would have broken), through
    :func:`warnings.showwarning` (which pytest records).

    Example::

        except Warning as said:
            show_instead(said, sys._getframe(1), "the step it reports on was taken")
    """
    import warnings

    warnings.showwarning(f"{said} (shown, not raised: the warning filters make it an error, "
                         f"and {why})", type(said), frame.f_code.co_filename, frame.f_lineno)


def close_over(close: Any, exc: BaseException, frame: Any) -> None:
    """Call ``close()`` while ``exc`` propagates from the user's ``frame`` (a ``with`` block's
    exit, a session's failed start): a warning it raises where the filters make warnings errors
    (``python -W error``, pytest's ``error``) is shown there (:func:`show_over`), so ``exc``
    goes on; raised, it replaced ``exc`` (``sys.exit(3)`` exited 1, a start's own error was
    lost).

    Example::

        except BaseException as exc:
            close_over(self.close, exc, sys._getframe(1))
            raise
    """
    try:
        close()
    except Warning as said:
        show_over(said, exc, frame)
