"""``Finding``: one thing ``tk.analyze`` found, with its evidence and its fix."""
from __future__ import annotations

import dataclasses
import math
from typing import Literal, Optional, Tuple

Severity = Literal["high", "medium", "low"]
SEVERITIES: Tuple[str, ...] = ("high", "medium", "low")


@dataclasses.dataclass(frozen=True)
class Finding:
    """A cause of lost step time, read from a run's records and traces.

    Attributes:
        code: stable identifier, e.g. ``"TA101"`` (data-loader bound).
        title: one line, e.g. ``"data-loader bound"``.
        evidence: the numbers behind it, in words.
        share: the fraction of step time it costs (0..1), or None when it cannot be put as one.
        count: how many times it was seen (steps, events or files).
        fix: what to change, with code.
        severity: ``"high"``, ``"medium"`` or ``"low"``.
        run: the run it was found in, relative to the analyzed folder (``"."`` for the folder).

    Example::

        for f in tk.analyze("runs/exp1"):
            print(f.code, f.title, f"{f.share:.0%}" if f.share is not None else "", f.fix)
    """

    code: str
    title: str
    evidence: str
    share: Optional[float]
    count: int
    fix: str
    severity: Severity
    run: str = "."

    def __post_init__(self) -> None:
        for name in ("code", "title", "evidence", "fix", "run"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"Finding({name}={getattr(self, name)!r}): must be a non-empty str")
        if self.share is not None and (isinstance(self.share, bool)
                                       or not isinstance(self.share, (int, float))
                                       or not math.isfinite(self.share) or self.share < 0):
            raise ValueError(f"Finding(share={self.share!r}): must be a fraction >= 0 or None")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ValueError(f"Finding(count={self.count!r}): must be an int >= 0")
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding(severity={self.severity!r}): must be one of {SEVERITIES}")

    def to_dict(self) -> dict:
        """A JSON-ready dict (the TensorBoard tab's report)."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        share = "" if self.share is None else f" ({self.share:.0%} of step time)"
        return f"{self.code} [{self.severity}] {self.title}{share}: {self.evidence}\n    fix: {self.fix}"


def severity_for(share: float, *, high: float = 0.3, medium: float = 0.1) -> Severity:
    """``"high"`` from ``high`` of step time, ``"medium"`` from ``medium``, else ``"low"``."""
    return "high" if share >= high else "medium" if share >= medium else "low"


def sort_key(f: Finding) -> Tuple[int, float, int, str]:
    """Most costly first: by share (unknown shares after known ones), then severity."""
    return (0 if f.share is not None else 1, -(f.share or 0.0), SEVERITIES.index(f.severity), f.code)
