"""TA104's fix (the optimizer step dominates), fitted to what the run's optimizers already ran.

The session's close records each patched optimizer (``trainkit/meta/optimizers``,
:mod:`trainkit._optinfo`): its type and module, the ``fused``/``foreach`` it asked for, the
implementation its steps ran (``impl``) and, for one that could run fused and did not, whether
the run's own torch takes ``fused=True`` for it (``fused_ok``: torch 2.11's Adagrad refuses it on
CUDA, no release takes complex parameters). The fix never advises what the run already ran, nor
``fused=True`` where ``fused_ok`` is recorded False; a run recorded before ``fused_ok`` was gets
the advice it got then.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Set, Tuple

from ...recorder import CLOSURE_MS, COMPILE_SECONDS
from ..runs import Run

if TYPE_CHECKING:
    from .records import Steps

#: torch.optim's optimizers with a fused implementation (``fused=True``)
_FUSED = ("Adam", "AdamW", "SGD", "Adagrad")
#: and those with a multi-tensor one only (``foreach=True``)
_FOREACH = ("ASGD", "Adadelta", "Adafactor", "Adamax", "NAdam", "RAdam", "RMSprop", "Rprop")
#: the implementations a close records (``impl``, trainkit/_optinfo.py), as a fix names them
_IMPLS = {"foreach": "the multi-tensor update (foreach)", "for-loop": "the for-loop update"}
#: why a fused form is not advised where the run's torch refused it (``fused_ok`` False)
_REFUSED = "which the run's torch refuses for its parameters"


class Stepped(NamedTuple):
    """The optimizers a run stepped, as :func:`_stepped` reads them."""

    #: the type's name where one type of torch.optim's stepped, else None
    name: Optional[str]
    #: the implementations their steps ran (``{"fused"}``...; empty where not recorded)
    ran: Set[str]
    #: the options among ``fused`` and ``foreach`` that type has (empty where not recorded)
    options: Set[str]
    #: the types whose fused form the run's torch refused (``fused_ok`` False), sorted
    refused: Tuple[str, ...] = ()
    #: whether every one stepped was refused it (so none is left to take a fused form)
    all_refused: bool = False


def _optimizers(run: Run) -> List[Dict[str, Any]]:
    """Each optimizer patched in the session shown, as its close recorded it: ``type``,
    ``stepped`` (True if it stepped there, False if not) and, in runs since they were recorded,
    its ``fused``, ``foreach``, ``impl`` and ``fused_ok`` (trainkit/_optinfo.py); [] where it
    recorded none, or something else."""
    from ..._optinfo import META_OPTIMIZERS

    text = run.meta.get(META_OPTIMIZERS)
    try:
        got = json.loads(text) if text else []
    except ValueError:
        return []
    if not isinstance(got, list) or any(not isinstance(o, dict) for o in got):
        return []
    return got


def _names(names: Tuple[str, ...]) -> str:
    """``"Adam"``, ``"Adam and SGD"``, ``"Adam, SGD and X"``."""
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]


def _stepped(run: Run) -> Stepped:
    """The optimizers the run stepped, as its close recorded them: the type's name where one
    type of torch.optim's stepped (None where several types did, or another library's: a
    third party's ``Adam`` has torch.optim's options or not; a run recorded before modules
    were has torch.optim's names), the implementations their steps ran, whatever their types
    (``{"fused"}``...; empty where one's is not recorded: a run from before they were), the
    options among ``fused`` and ``foreach`` that type has (empty where not recorded) and the
    types whose fused form the run's torch refused (``fused_ok`` False: one refused is enough,
    as the fix names the type, not each optimizer)."""
    stepped = [o for o in _optimizers(run) if o.get("stepped") is True]
    impls = [o.get("impl") for o in stepped]
    ran = (set() if not stepped or any(not isinstance(i, list) for i in impls)
           else {str(v) for i in impls for v in i})
    names = {str(o.get("type", "optimizer")) for o in stepped}
    refused = tuple(sorted({str(o.get("type", "optimizer")) for o in stepped
                            if o.get("fused_ok") is False}))
    all_refused = bool(stepped) and all(o.get("fused_ok") is False for o in stepped)
    torch_optim = all(str(o.get("module", "torch.optim")).split(".")[:2] == ["torch", "optim"]
                      for o in stepped)
    if len(names) != 1 or not torch_optim:
        return Stepped(None, ran, set(), refused, all_refused)
    options = {k for k in ("fused", "foreach") if all(k in o for o in stepped)}
    return Stepped(names.pop(), ran, options, refused, all_refused)


def _faster_update(st: Stepped) -> str:
    """What makes the update of the optimizer the run stepped (:func:`_stepped`) faster: its
    fused (or multi-tensor) form, named for it, and never the one it already ran nor a fused
    one the run's torch refused; "" where it already ran the fastest form left. For another
    optimizer, or a run that did not record it, the optimizers that have a fused form."""
    name, ran, options = st.name, st.ran, st.options
    if ran == {"fused"}:
        return ""
    # A run recorded before the options were has none: torch.optim's then tell (a torch that
    # records options without ``fused`` predates that optimizer's fused form).
    has_fused = name in _FUSED and ("fused" in options or not options)
    if has_fused and not st.refused:
        return f"its fused implementation, torch.optim.{name}(params, ..., fused=True)"
    if name in _FUSED + _FOREACH:
        if ran == {"foreach"}:
            return ""
        why = f"its fused one, {_REFUSED}" if has_fused else "it has no fused one"
        return (f"its multi-tensor implementation, torch.optim.{name}(params, ..., foreach=True) "
                f"({why})")
    if st.all_refused:  # (several types, or a subclass: each refused its fused form)
        if ran == {"foreach"}:
            return ""
        return (f"a multi-tensor implementation where the optimizer has one (foreach=True; not "
                f"a fused one: the run's {_names(st.refused)}, {_REFUSED})")
    refused = (f"; not for the run's {_names(st.refused)}, {_REFUSED}" if st.refused else "")
    forms = (f"a fused implementation where the optimizer has one (torch.optim.Adam, AdamW, SGD, "
             f"Adagrad: fused=True{refused})")
    return forms if ran == {"foreach"} else forms + " or a multi-tensor one (foreach=True)"


def _optimizer_fix(st: "Steps") -> str:
    """The fix for TA104, for what the run already does: a closure optimizer, a fused update, a
    compiled step, an optimizer already on the multi-tensor update that has no fused one (or
    one the run's torch refuses)."""
    if st.run.scalars.get(CLOSURE_MS):
        return ("the update between closure calls dominates (LBFGS: max_iter, history_size and "
                "line_search_fn set its work); time the closure apart with a profiler, and consider "
                "fewer iterations per step or a first-order optimizer if the loss allows")
    stepped = _stepped(st.run)
    name, ran = stepped.name, stepped.ran
    faster = _faster_update(stepped)
    if ran == {"fused"}:
        # Compiling adds nothing to a fused update (Adam over 4M parameters on a 2-core CPU,
        # torch 2.14: 2.60 ms fused, 2.63 ms fused and compiled): what is left is the amount of
        # work in it, and how often it runs.
        asked = f"torch.optim.{name}(..., fused=True)" if name in _FUSED else "fused=True"
        return (f"the update already runs fused ({asked}), which "
                f"compiling does not speed up: it reads and writes every parameter, its gradient "
                f"and its optimizer state each step, so spread it over more samples (a larger "
                f"batch, or tk.accumulate(n, optimizer) to step once every n batches) or train "
                f"fewer parameters")
    if st.run.scalars.get(COMPILE_SECONDS):
        use = f"use {faster}, " if faster else "use "
        return (f"the step is already compiled: {use}fewer and larger parameter tensors, or "
                f"compile mode='max-autotune'; on a CPU the update is memory-bound and scales "
                f"with the parameter count")
    if not faster:  # (torch.optim's, named, or every one refused fused by the run's torch)
        if stepped.refused:
            whose = (f"torch.optim.{name}'s fused one" if name
                     else f"the fused form of the run's {_names(stepped.refused)}")
            why = f"the run's torch refuses {whose} for its parameters"
        else:
            why = f"torch.optim.{name} has no fused one"
        return (f"the update already runs multi-tensor (foreach), and {why}: compile the step, "
                f"tk.patch(optimizer, compile=True) / @tk.compiled_step, which fuses it into a "
                f"few kernels")
    # What it ran eagerly, where one is told (a compiled step's is compiled away): torch's
    # default differs between the CPU (the for-loop) and CUDA (multi-tensor).
    now = _IMPLS.get(min(ran)) if len(ran) == 1 else None
    said = f"it ran {now}: " if now else ""
    return (f"{said}use {faster}, or compile the step: tk.patch(optimizer, compile=True) / "
            f"@tk.compiled_step")
