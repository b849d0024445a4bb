"""When torch.profiler records: a small frozen configuration."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ProfileSchedule:
    """Profile ``active`` steps after ``wait`` idle and ``warmup`` steps, ``repeat`` times.

    Steps are the patched optimizer's real steps: no ``prof.step()`` in the loop. Each cycle
    writes one trace (``*.pt.trace.json``, or ``*.pt.trace.json.gz`` with ``gzip=True``, about
    10x smaller) into the session's logdir. A trace holds ``active`` steps, so ``active`` bounds
    its size: keep it small (2-5 steps show a steady state).

    Example::

        with tk.session(logdir="runs/p", profile=tk.ProfileSchedule(wait=10, warmup=2, active=3)):
            ...
    """

    wait: int
    warmup: int
    active: int
    repeat: int = 1
    gzip: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.gzip, bool):
            raise TypeError(f"ProfileSchedule(gzip={self.gzip!r}): gzip must be True or False, "
                            f"e.g. ProfileSchedule(wait=10, warmup=2, active=3, gzip=True)")
        for name, minimum in (("wait", 0), ("warmup", 0), ("active", 1), ("repeat", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(
                    f"ProfileSchedule({name}={value!r}): {name} must be an int >= {minimum}, "
                    f"e.g. ProfileSchedule(wait=10, warmup=2, active=3, repeat=1)")


def check_session_profile(profile: Any) -> Any:
    """``tk.session(profile=...)``: None, or a :class:`ProfileSchedule` while no profiler of the
    user's records (refused before anything starts)."""
    if profile is None:
        return None
    if not isinstance(profile, ProfileSchedule):
        raise TypeError(f"session(profile={profile!r}): profile must be a tk.ProfileSchedule or None, "
                        f"e.g. profile=tk.ProfileSchedule(wait=10, warmup=2, active=3)")
    from .trace import check_no_profiler

    check_no_profiler(profile)  # a profiler of the user's records: refused before anything starts
    return profile
