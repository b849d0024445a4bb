"""When torch.profiler records: a small frozen configuration."""
from __future__ import annotations

import dataclasses
import operator
import sys
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
        # Checked and converted before anything is set: a refusal changes nothing. numpy integers
        # are taken as tk.session(log_every=...) takes them, and stored as plain ints.
        gzip = self.gzip
        if not isinstance(gzip, bool) and not _is_numpy_bool(gzip):
            raise TypeError(f"ProfileSchedule(gzip={gzip!r}): gzip must be True or False, "
                            f"e.g. ProfileSchedule(wait=10, warmup=2, active=3, gzip=True)")
        values = {"gzip": bool(gzip)}
        for name, minimum in (("wait", 0), ("warmup", 0), ("active", 1), ("repeat", 1)):
            value = getattr(self, name)
            example = "e.g. ProfileSchedule(wait=10, warmup=2, active=3, repeat=1)"
            try:
                if isinstance(value, bool) or _is_numpy_bool(value):
                    raise TypeError
                number = operator.index(value)  # int and numpy integers; not 1.5, "1" or None
            except TypeError:
                raise TypeError(f"ProfileSchedule({name}={value!r}): {name} must be an int "
                                f"(a count of steps), not {type(value).__name__}, "
                                f"{example}") from None
            if number < minimum:
                raise ValueError(f"ProfileSchedule({name}={number!r}): {name} must be an int >= "
                                 f"{minimum}, {example}")
            values[name] = number
        for name, value in values.items():
            object.__setattr__(self, name, value)


def _is_numpy_bool(value: Any) -> bool:
    np = sys.modules.get("numpy")  # not imported: the value cannot be one of its booleans
    return np is not None and isinstance(value, np.bool_)


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
