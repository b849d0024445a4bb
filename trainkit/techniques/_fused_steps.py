"""Where an optimizer's ``state["step"]`` counters live, by mode: the ``fused`` technique's
bookkeeping (trainkit.techniques.fused).

torch keeps a step counter where the group's update reads it (its note "special device hosting
for step"): a float32 tensor on the parameter's device for a ``fused`` or ``capturable`` group,
which the kernels read on the device; a CPU tensor of the default scalar dtype otherwise, which
the for-loop and foreach updates read with ``.item()`` (``torch.optim.optimizer._get_value``).
A counter left on a GPU under the for-loop update made that ``.item()`` a device sync per
parameter per step; fused CUDA kernels do not take one left on the CPU.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple


_CURRENT = object()


def on_device(group: Dict[str, Any], fused: Any = _CURRENT) -> bool:
    """Whether ``group``'s update reads its steps on the parameters' device: fused (``fused``,
    else the group's current value) or capturable."""
    if fused is _CURRENT:
        fused = group.get("fused")
    return bool(fused) or bool(group.get("capturable"))


def hosted(step: Any, param: Any, device_side: bool) -> Any:
    """``step`` where a group's update reads it: float32 on ``param``'s device when
    ``device_side`` (fused, capturable), else a CPU tensor of torch's default scalar dtype
    (float64 when that is the default dtype, else float32; ``_get_scalar_dtype()``). ``step``
    itself where it is there already; the count is kept (exact below 2**24)."""
    import torch

    if device_side:
        dtype, device = torch.float32, param.device
    else:
        default = torch.get_default_dtype()
        dtype = torch.float64 if default == torch.float64 else torch.float32
        device = torch.device("cpu")
    if step.dtype == dtype and step.device == device:
        return step
    return step.detach().to(dtype=dtype, device=device)


def _steps(opt: Any) -> Iterator[Tuple[Dict[str, Any], Any, Dict[str, Any]]]:
    """``(group, param, state)`` for each parameter of ``opt`` whose state has a step tensor."""
    import torch

    for g in opt.param_groups:
        for p in g["params"]:
            state = opt.state.get(p)
            if isinstance(state, dict) and isinstance(state.get("step"), torch.Tensor):
                yield g, p, state


def host_steps(opt: Any) -> None:
    """Put every step counter of ``opt`` where its group's update (as it stands now) reads it:
    after ``fused`` was switched, on or off, and back."""
    for g, p, state in _steps(opt):
        state["step"] = hosted(state["step"], p, on_device(g))
