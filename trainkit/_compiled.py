"""trainkit's own calls met in code ``torch.compile`` traces (a compiled model's ``forward``).

``s.log`` reads its value on the host, so there it is a graph break at the call, as ``print`` is:
traced, its appends to the buffer the writer thread empties broke dynamo's guards ("Guard failed
on the same frame it was created"). Regions and ``tk.to_device`` ask :func:`is_compiling_function`
and do only what a graph can hold. Everything here but the function markers is bound lazily:
nothing imports ``torch._dynamo`` (~1 s) for a run that does not compile.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional


def is_compiling_function(torch: Any) -> Callable[[], bool]:
    """torch's "is dynamo tracing this" function, which dynamo takes for the constant True; the
    cheapest one this torch has (``is_dynamo_compiling``: ~25 ns, ``is_compiling``: ~75 ns)."""
    return (getattr(torch.compiler, "is_dynamo_compiling", None)
            or getattr(torch.compiler, "is_compiling", None) or bool)


#: Why ``s.log`` breaks a graph ``torch.compile`` traces: dynamo shows it in its graph-break
#: reason, and in the error under ``fullgraph=True`` (where it would name only torch's own
#: ``torch.compiler.disable``).
LOG_IN_GRAPH = ("trainkit: s.log reads its value on the host, outside the graph (as print() "
                "does): a graph break at the call; under fullgraph=True, return the value from "
                "the compiled function and log it outside")


def never_traced(fn: Any, why: str) -> None:
    """Mark ``fn`` so that a call of it in code dynamo traces is a graph break at the caller's
    call site (the caller's code resumes after it, a resume function of its own per call site),
    with ``why`` as the reason. Dynamo reads these attributes; nothing is imported here."""
    fn._torchdynamo_disable = True
    fn._torchdynamo_disable_msg = why


_log_frames_skipped = False
_log_outside_graph: Any = None


def skip_log_frames() -> None:
    """Tell dynamo, once it is imported, to run ``Session.log`` and what it calls as they are.

    After the graph break at its call site, ``s.log`` runs as a frame of its own, which dynamo
    would compile too, and one resume function inside ``log`` shared by every call site would
    recompile for each kind of value and step logged (``torch._dynamo.config.recompile_limit``
    kinds at most). Cheap (a dict lookup) until torch._dynamo is imported; done at session start
    and at each pass over a patched loader, and, for a model compiled later, at the first
    compiled call (:func:`outside_graph`).
    """
    global _log_frames_skipped
    if _log_frames_skipped:
        return
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return
    _log_frames_skipped = True
    _skip_recursively(eval_frame, _log_code())


def _log_code() -> Any:
    from .session import Session

    return Session.log.__code__


def _skip_recursively(eval_frame: Any, code: Any) -> None:
    try:
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        eval_frame.set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP,
                                                                  FrameAction.SKIP))
    except (ImportError, AttributeError, TypeError):  # a torch without it: a compiled s.log
        pass  # frame logs through outside_graph's disabled log


def _log_from_compiled_frame(s: Any, name: str, value: Any, step: Optional[int]) -> None:
    """What a ``log`` frame that dynamo compiled calls, outside its graph: its frames are skipped
    from here on, and the value is logged."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is not None:
        _skip_recursively(eval_frame, _log_code())
    s.log(name, value, step=step)


def outside_graph() -> Any:
    """:func:`_log_from_compiled_frame` under ``torch.compiler.disable``, for a ``log`` frame that
    dynamo compiles because its frames were not skipped yet (a model first compiled after the
    session started, or ``torch._dynamo.reset()``). Made at its first use (it imports
    torch._dynamo, ~1 s, which a run that compiles has done already)."""
    global _log_outside_graph
    if _log_outside_graph is None:
        import torch

        try:
            _log_outside_graph = torch.compiler.disable(_log_from_compiled_frame,
                                                        reason=LOG_IN_GRAPH)
        except TypeError:  # a torch whose disable() takes no reason
            _log_outside_graph = torch.compiler.disable(_log_from_compiled_frame)
    return _log_outside_graph
