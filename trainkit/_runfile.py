"""What a session's event file starts with (the versions that recorded it), and what is said
when it cannot be written."""
from __future__ import annotations

from ._tags import PREFIX

#: the text summary each session's event file starts with: the versions that recorded it
META_VERSIONS = PREFIX + "meta/versions"


def versions() -> str:
    """JSON: trainkit's, Python's and (when imported: never imported for this) torch's versions."""
    import json
    import platform
    import sys

    from . import __version__

    got = {"trainkit": __version__, "python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        got["torch"] = str(getattr(torch, "__version__", "?"))
    return json.dumps(got, sort_keys=True)


def warn_lost(path: str, exc: BaseException, what: str) -> None:
    """Say that the event file cannot be written (once per session): a warning, since the
    training itself is fine and must go on (and a user's own exception must not be replaced).
    Never raised, also where the warning filters make warnings errors (``python -W error``)."""
    from ._text import say

    if isinstance(exc, OSError):  # the disk or the folder
        fix = "Free some space (or fix the folder) and start a new tk.session to record again"
    else:  # no file system's: trainkit's own failure
        fix = ("This is a trainkit bug: please report it with this message; a new tk.session "
               "records again")
    message = (f"trainkit: writing the run to {path!r} failed ({type(exc).__name__}: {exc}); "
               f"{what}, the training goes on. {fix}")
    # Never raised (say): made an error, it ended the writer thread (whose records then piled
    # up for the rest of the run), came out of s.flush() and the SIGTERM handler into the
    # training, and out of the close over the user's own exception.
    say(message, RuntimeWarning, stacklevel=2)
