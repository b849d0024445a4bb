"""torch < 2.4: a compiled optimizer step leaves ``capturable=True`` in every param group.

torch 2.3's dynamo sets ``group["capturable"] = True`` on every group that has the key, the CPU's
too, each time it traces an optimizer (``OptimizerVariable.__init__``), and leaves it there. An
eager step of that optimizer on the CPU then raises "If capturable=True, params and state_steps
must be CUDA or XLA tensors": after ``tk.unpatch(opt)``, in a ``copy.deepcopy`` or pickled copy,
and in a plain optimizer that loaded its ``state_dict`` (a checkpoint). torch 2.4 and later set it
only on CUDA/XPU groups whose state does not exist yet (``_set_capturable``), where it works.

The compiled graph guards on the value: put back to ``False`` after a call, the next call
recompiled, every call. So, on such a torch, :func:`turn_on` sets it for the call and
:func:`put_back` puts the user's value back after it: between calls ``param_groups`` (and so
``state_dict``, copies and ``tk.unpatch``) hold what the user set. Two dict writes per group and
call, on torch < 2.4 only (decided when the compiled step is made: nothing on a newer torch).
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Tuple

from ._torch_version import torch_before

#: The first torch whose dynamo leaves a CPU group's ``capturable`` as the user set it.
USER_CAPTURABLE_KEPT = (2, 4)


@functools.lru_cache(maxsize=None)
def dynamo_sets_capturable() -> bool:
    """Whether this torch's dynamo sets ``capturable=True`` on every group it traces. Asked when
    a compiled step is made (not at ``import trainkit``, which stays without torch)."""
    return torch_before(USER_CAPTURABLE_KEPT)


#: What :func:`turn_on` changed: a group and the ``capturable`` its user had set there.
Held = List[Tuple[Dict[str, Any], Any]]


def turn_on(opt: Any, held: Held) -> None:
    """Set ``capturable=True`` in each of ``opt``'s groups that has the key (where dynamo sets
    it: a group without it is left without it), noting the user's value in ``held``.

    A group on CUDA (its first parameter, for speed) is left to dynamo, as before: there the
    flag works eagerly too, and newer torch leaves it set alike; turned off again, the step
    tensors the compiled step made on the GPU would cost the eager step a sync per parameter.
    """
    for group in opt.param_groups:
        value = group.get("capturable", True)
        if value is not True:
            params = group["params"]
            if params and params[0].is_cuda:
                continue
            held.append((group, value))
            group["capturable"] = True


def put_back(held: Held) -> None:
    """Put the user's ``capturable`` back in the groups :func:`turn_on` changed."""
    for group, value in held:
        group["capturable"] = value
    held.clear()
