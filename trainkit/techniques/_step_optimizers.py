"""The optimizers a ``@tk.compiled_step`` function steps, found without running it: the ones it
names (globals, closure cells, default arguments) and the ones a call hands it; and the LR
schedulers it may step, found the same way."""
from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, Optional, Tuple


def referenced_optimizers(fn: Callable[..., Any], args: Tuple[Any, ...] = (),
                          kwargs: Optional[Dict[str, Any]] = None,
                          through: Optional[List[Any]] = None) -> List[Any]:
    """The optimizers a function names: its globals, closure cells and default arguments, and
    in a call's arguments (``step(model, opt, batch)``; a list of them), or an argument's
    attributes it reads (``self.opt`` in a method). Missed, an optimizer's lr and betas stayed
    Python floats in the graph: a recompile at each new value of a scheduler's, and eager once
    dynamo's limit was reached.

    Of accelerate's wrapper, the optimizer it wraps (trainkit._wrapped), as ``tk.patch`` takes:
    the wrapper itself has no hook registries nor state of its own, and the first call raised
    AttributeError (``_optimizer_load_state_dict_pre_hooks``). Those are appended to ``through``
    too, where given: the wrapper's calls are not all steps of theirs."""
    import torch

    from .._wrapped import inner_optimizer

    found: List[Any] = []
    for obj in _named(fn, args, kwargs):
        if isinstance(obj, torch.optim.Optimizer):
            inner = inner_optimizer(obj)
            if inner is not None and through is not None:
                through.append(inner)
            obj = inner or obj
            if all(obj is not f for f in found):
                found.append(obj)
    return found


def referenced_schedulers(fn: Callable[..., Any], args: Tuple[Any, ...],
                          kwargs: Dict[str, Any], opts: List[Any]) -> List[Any]:
    """The LR schedulers of ``opts`` that ``fn`` names, or a call hands it, as for optimizers
    (:func:`referenced_optimizers`): the objects there with a ``_last_lr`` list and one of
    ``opts`` for their ``optimizer`` (torch's LRScheduler and ReduceLROnPlateau, and look-alikes
    of theirs)."""
    found: List[Any] = []
    for obj in _named(fn, args, kwargs):
        if isinstance(getattr(obj, "_last_lr", None), list) \
                and any(getattr(obj, "optimizer", None) is o for o in opts) \
                and all(obj is not f for f in found):
            found.append(obj)
    return found


def _named(fn: Callable[..., Any], args: Tuple[Any, ...],
           kwargs: Optional[Dict[str, Any]]) -> List[Any]:
    """What ``fn`` names, and what a call hands it (see :func:`referenced_optimizers`)."""
    import torch

    inner = getattr(fn, "__wrapped__", fn)
    code = getattr(inner, "__code__", None)
    if code is None:
        return []
    glb = getattr(inner, "__globals__", {})
    candidates = [glb.get(n) for n in code.co_names]
    candidates += [c.cell_contents for c in (inner.__closure__ or ()) if _cell_full(c)]
    candidates += list(inner.__defaults__ or ())
    for arg in itertools.chain(args, (kwargs or {}).values()):
        if isinstance(arg, (list, tuple)):
            candidates += arg[:16]
        elif not isinstance(arg, torch.Tensor) and hasattr(arg, "__dict__"):
            attrs = vars(arg)  # an object whose attributes the function reads (self.opt)
            candidates += [attrs[n] for n in code.co_names if n in attrs]
        candidates.append(arg)
    return candidates


def _cell_full(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a free variable not assigned yet
        return False
    return True
