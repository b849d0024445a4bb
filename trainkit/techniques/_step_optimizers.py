"""The optimizers a ``@tk.compiled_step`` function steps, found without running it: the ones it
names (globals, closure cells, default arguments) and the ones a call hands it."""
from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, Optional, Tuple


def referenced_optimizers(fn: Callable[..., Any], args: Tuple[Any, ...] = (),
                          kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
    """The optimizers a function names: its globals, closure cells and default arguments, and
    in a call's arguments (``step(model, opt, batch)``; a list of them), or an argument's
    attributes it reads (``self.opt`` in a method). Missed, an optimizer's lr and betas stayed
    Python floats in the graph: a recompile at each new value of a scheduler's, and eager once
    dynamo's limit was reached."""
    import torch

    inner = getattr(fn, "__wrapped__", fn)
    code = getattr(inner, "__code__", None)
    if code is None:
        return []
    found: List[Any] = []
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
    for obj in candidates:
        if isinstance(obj, torch.optim.Optimizer) and all(obj is not f for f in found):
            found.append(obj)
    return found


def _cell_full(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a free variable not assigned yet
        return False
    return True
