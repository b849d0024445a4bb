"""``tk.technique(name, default)``: the value in force for a technique.

The ablation switches techniques without an ``if`` in the user's loop: each technique asks for its
value here, and gets the ablation's override when one is set (in-process through
:func:`overrides`, or in a child of ``trainkit ablate`` through the ``TRAINKIT_TECHNIQUES``
environment variable, JSON), else the default it passed.
"""
from __future__ import annotations

import contextlib
import json
import numbers
import re
from typing import Any, Dict, Iterator, Mapping, Optional, Set

from . import _env
from .session import active as _active_session

BUILTIN = ("amp", "compile", "fused", "pin_memory", "num_workers", "set_to_none",
           "channels_last", "tf32", "cudnn_benchmark")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")

_in_process: Optional[Dict[str, Any]] = None  # set by the in-process ablation only
_from_env: Optional[Dict[str, Any]] = None
_env_raw: Optional[str] = None
# The names of TRAINKIT_TECHNIQUES that tk.technique has read, in a session or before one (a
# loader built before the session opens): a session's close says only the others were unused.
_env_read: Set[str] = set()


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise TypeError(f"technique({name!r}, ...): name must be a str identifier, one of the "
                        f"built-in {', '.join(BUILTIN)} or your own, e.g. tk.technique('my_hook', True)")
    return name


def _check_default(name: str, default: Any) -> None:
    """Refuse a built-in technique's default of the wrong type: ``tk.technique("fused", "maybe")``
    would switch it on (a non-empty str is true) where the ablation's override is a bool."""
    if name == "num_workers":
        if isinstance(default, bool) or not isinstance(default, numbers.Integral):
            raise TypeError(f"technique('num_workers', {default!r}): the built-in 'num_workers' "
                            f"takes an int >= 0, e.g. tk.technique('num_workers', 4)")
        if default < 0:
            raise ValueError(f"technique('num_workers', {default!r}): must be an int >= 0, e.g. "
                             f"tk.technique('num_workers', 4)")
    elif name in BUILTIN and default is not None and not isinstance(default, bool):
        raise TypeError(f"technique({name!r}, {default!r}): the built-in {name!r} takes True or "
                        f"False (or None: unset), e.g. tk.technique({name!r}, True)")


def _check_values(values: Mapping[str, Any], where: str) -> None:
    """Refuse a built-in technique's override of the wrong type: a JSON ``"false"`` is a
    non-empty string, which would switch the technique on."""
    for name, value in values.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{where}: {name!r} is no technique name (a str identifier, as "
                             f"tk.technique takes); the built-in ones are {', '.join(BUILTIN)}")
        lower = name.lower()
        if name not in BUILTIN and lower in BUILTIN:
            raise ValueError(f"{where}: {name!r} is no technique; the built-in one is "
                             f"{lower!r} (names are case-sensitive)")
        if name == "num_workers":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{where}: 'num_workers' is {value!r}; it must be an int >= 0, "
                                 f"e.g. {{\"num_workers\": 4}}")
        elif name in BUILTIN and not isinstance(value, bool):
            raise ValueError(f"{where}: {name!r} is {value!r}; it must be true or false, "
                             f"e.g. {{\"{name}\": false}}")


def _env_overrides() -> Dict[str, Any]:
    global _from_env, _env_raw
    raw = _env.get(_env.TECHNIQUES)
    if raw != _env_raw:  # parse once per distinct value
        parsed: Any = {} if raw is None else None
        if raw is not None:
            try:
                parsed = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{_env.TECHNIQUES}={raw!r} is not valid JSON ({exc.msg}); it should "
                                 f"be an object such as '{{\"amp\": false}}'") from None
            if not isinstance(parsed, dict):
                raise ValueError(f"{_env.TECHNIQUES}={raw!r} must be a JSON object such as "
                                 f"'{{\"amp\": false}}'")
            _check_values(parsed, f"{_env.TECHNIQUES}={raw!r}")
        _from_env, _env_raw = parsed, raw
        _env_read.clear()
    return _from_env or {}


def check_overrides() -> None:
    """Raise ``ValueError`` now if ``TRAINKIT_TECHNIQUES`` is set but malformed."""
    _env_overrides()


def unread(s: Any) -> Optional[str]:
    """What to say at session ``s``'s close of the ``TRAINKIT_TECHNIQUES`` names of no built-in
    technique that nothing asked for (no ``tk.technique(name, ...)`` call, in the session or
    before it), a misspelling (``{"fuse": true}``) or a technique the script never reads: they
    were ignored unsaid. None where there are none."""
    import difflib

    try:
        env = _env_overrides()
    except ValueError:  # refused at the session's start already
        return None
    names = [n for n in env if n not in BUILTIN and n not in s.techniques and n not in _env_read]
    if not names:
        return None
    near = difflib.get_close_matches(names[0].lower(), BUILTIN, n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return (f"trainkit: {_env.TECHNIQUES} sets {', '.join(map(repr, names))}, which nothing "
            f"asked for in this session (no tk.technique({names[0]!r}, ...) call){hint}, so it "
            f"changed nothing; the built-in techniques are {', '.join(BUILTIN)}")


def technique(name: str, default: Any) -> Any:
    """The value in force for technique ``name``: the ablation's override, else ``default``.

    Example::

        use_amp = tk.technique("amp", True)
        loader = DataLoader(ds, num_workers=tk.technique("num_workers", 4))
    """
    _check_name(name)
    _check_default(name, default)
    value = default
    source = _in_process if _in_process is not None else _env_overrides()
    if name in source:
        value = source[name]
        if source is _from_env:
            _env_read.add(name)
    s = _active_session()
    if s is not None:
        s.techniques[name] = value
    return value


@contextlib.contextmanager
def overrides(values: Mapping[str, Any]) -> Iterator[None]:
    """Force technique values within the block (the in-process ablation uses this).

    Example::

        with overrides({"amp": False}):
            train()
    """
    global _in_process
    if not isinstance(values, Mapping):
        raise TypeError(f"overrides({values!r}): pass a mapping such as {{'amp': False}}")
    for key in values:
        _check_name(key)
    _check_values(values, f"overrides({dict(values)!r})")
    prev = _in_process
    _in_process = dict(values)
    try:
        yield
    finally:
        _in_process = prev
