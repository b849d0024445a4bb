"""Backend switches: ``tf32``, ``cudnn_benchmark`` and ``channels_last``.

``tf32`` and ``cudnn_benchmark`` are process-wide flags. They are changed only when something
asks for them (an ablation override, or an explicit ``apply(session, tf32=True)``), at session
start, and restored when the session closes (``s.on_close``). ``channels_last`` is a memory
format, so it is applied where the model and inputs are: :func:`channels_last` is the identity
when the technique is off, so the call site stays the same.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import switches
from .._text import brief

_UNSET = object()


def _override(name: str) -> Any:
    """The ablation's value for ``name``, or ``_UNSET`` when none is in force."""
    source = switches._in_process if switches._in_process is not None else switches._env_overrides()
    return source.get(name, _UNSET)


def _flags(torch: Any) -> Dict[str, List[Tuple[Any, str]]]:
    return {
        "tf32": [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32")],
        "cudnn_benchmark": [(torch.backends.cudnn, "benchmark")],
    }


def apply(session: Any, *, tf32: Optional[bool] = None,
          cudnn_benchmark: Optional[bool] = None) -> Dict[str, bool]:
    """Set the backend flags asked for (explicitly, or by an override) until ``session`` closes.

    An explicit value wins over an ablation override; a technique neither asks for is left
    alone. Returns the values set. Sessions call this at start.

    Example::

        with tk.session("runs/exp1") as s:
            tk.techniques.backends.apply(s, tf32=True, cudnn_benchmark=True)
    """
    # The session first: the flags are process-wide, and one set for no session (None), or for a
    # closed one (whose close has run), stayed on for the rest of the process.
    if not callable(getattr(session, "on_close", None)):
        raise TypeError(f"apply({brief(session)}, ...): expected the tk.session the flags last "
                        f"for, e.g. with tk.session(logdir='runs/exp1') as s: "
                        f"tk.techniques.backends.apply(s, tf32=True)")
    if getattr(session, "closed", False):
        raise ValueError("apply(<a closed session>, ...): its close has run, so flags set now "
                         "would never be restored; call it inside the with tk.session(...) block")
    asked: Dict[str, Any] = {}
    for name, value in (("tf32", tf32), ("cudnn_benchmark", cudnn_benchmark)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"apply(session, {name}={value!r}): must be True, False or None")
        if value is None:
            value = _override(name)
        if value is not _UNSET:
            asked[name] = bool(switches.technique(name, value))
    if not asked:
        return {}  # no torch import: sessions call this on every start
    import torch

    saved: List[Tuple[Any, str, Any]] = []
    for name, value in asked.items():
        for obj, attr in _flags(torch)[name]:
            saved.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, value)
    session.on_close(_restorer(saved))
    return asked


def _restorer(saved: List[Tuple[Any, str, Any]]) -> Callable[[], None]:
    def undo() -> None:
        for obj, attr, old in reversed(saved):
            setattr(obj, attr, old)

    return undo


def channels_last(obj: Any) -> Any:
    """A model or 4-D/5-D tensor in channels-last memory format; the identity when switched off.

    The ``channels_last`` technique (default True here: calling this asks for it) is read at each
    call. Tensors of other ranks are returned unchanged.

    Example::

        model = tk.channels_last(model.to(device))
        x = tk.channels_last(x)
    """
    import torch

    if not isinstance(obj, (torch.nn.Module, torch.Tensor)):
        raise TypeError(f"channels_last({brief(obj)}): expected an nn.Module or a tensor, got "
                        f"{type(obj).__name__}; e.g. model = tk.channels_last(model)")
    if not switches.technique("channels_last", True):
        return obj
    if isinstance(obj, torch.nn.Module):
        return obj.to(memory_format=torch.channels_last)
    if obj.dim() == 4:
        return obj.contiguous(memory_format=torch.channels_last)
    if obj.dim() == 5:
        return obj.contiguous(memory_format=torch.channels_last_3d)
    return obj
