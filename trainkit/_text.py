"""Text for error messages."""
from __future__ import annotations

from typing import Any


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
