"""Where an optimizer's ``state["step"]`` counters live, by mode, and what a switched optimizer
hands to ``state_dict``: the ``fused`` technique's bookkeeping (trainkit.techniques.fused).

torch keeps a step counter where the group's update reads it (its note "special device hosting
for step"): a float32 tensor on the parameter's device for a ``fused`` or ``capturable`` group,
which the kernels read on the device; a CPU tensor of the default scalar dtype otherwise, which
the for-loop and foreach updates read with ``.item()`` (``torch.optim.optimizer._get_value``).
A counter left on a GPU under the for-loop update made that ``.item()`` a device sync per
parameter per step; fused CUDA kernels do not take one left on the CPU.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Tuple

#: A group's own ``fused`` and ``foreach`` values: what it holds unpatched.
Own = Tuple[Any, Any]


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
    after ``fused`` was switched, on or off, and after ``load_state_dict`` under the switch."""
    for g, p, state in _steps(opt):
        state["step"] = hosted(state["step"], p, on_device(g))


class OwnValues:
    """The ``fused`` and ``foreach`` values each group of a switched optimizer holds unpatched.

    Kept by group identity: the groups at the switch, those ``load_state_dict`` makes under it
    (:meth:`note`) and those ``add_param_group`` adds (:meth:`added`: the values its caller gave,
    the unpatched defaults for the others). A group added some other way (``param_groups.append``)
    took what it took; its own values are taken for the unpatched defaults where it holds the
    switched value, else for its own.
    """

    def __init__(self, opt: Any, switched: Any) -> None:
        self._groups: Dict[int, Tuple[Dict[str, Any], Own]] = {}
        self.defaults: Own = (opt.defaults.get("fused"), opt.defaults.get("foreach"))
        self.switched = switched
        self.note(opt.param_groups)

    def note(self, groups: List[Dict[str, Any]]) -> None:
        """Record ``groups``' current values as their own (before the switch is applied)."""
        for g in groups:
            self._groups[id(g)] = (g, (g.get("fused"), g.get("foreach")))

    def added(self, g: Dict[str, Any], given: Dict[str, Any]) -> None:
        """Record the own values of ``g``, a group ``add_param_group`` added: those of ``given``
        (what its caller wrote), the unpatched defaults for the others (it took the switched
        ones, ``setdefault``)."""
        self._groups[id(g)] = (g, (given.get("fused", self.defaults[0]),
                                   given.get("foreach", self.defaults[1])))

    def of(self, g: Dict[str, Any]) -> Own:
        """``g``'s own ``(fused, foreach)``."""
        kept = self._groups.get(id(g))
        if kept is not None and kept[0] is g:
            return kept[1]
        if g.get("fused") != self.switched:  # the caller's own value: kept as given
            return g.get("fused"), g.get("foreach")
        return self.defaults

    def restore(self, opt: Any) -> None:
        """Give every group of ``opt`` and its defaults their own values, and its steps the
        place their update reads them from."""
        for g in opt.param_groups:
            g["fused"], g["foreach"] = self.of(g)
        opt.defaults["fused"], opt.defaults["foreach"] = self.defaults
        host_steps(opt)

    def unswitched_group(self, g: Any) -> Any:
        """A copy of ``g`` (a live group) with its own ``fused``/``foreach``; ``g`` itself where
        it has no ``fused`` (not a group of the switch)."""
        if not isinstance(g, dict) or "fused" not in g:
            return g
        fused, foreach = self.of(g)
        return dict(g, fused=fused, foreach=foreach)

    def moved_steps(self, opt: Any) -> Dict[Any, Any]:
        """``{param: step}`` for each step counter of ``opt`` that its group's own mode hosts
        elsewhere: there (new tensors; the live state is left as it is)."""
        moved = {}
        for g, p, state in _steps(opt):
            own = on_device(g, self.of(g)[0])
            if own != on_device(g):
                moved[p] = hosted(state["step"], p, own)
        return moved

    def unswitched_state_dict(self, opt: Any, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        """``state_dict`` (``opt.state_dict()``'s result) as the unpatched ``opt`` would save it:
        each group's own ``fused``/``foreach``, and its steps hosted for that mode (new tensors:
        the live state is left as it is; the saved per-parameter dicts are copies)."""
        saved_groups = state_dict.get("param_groups", [])
        index: Dict[int, int] = {}
        for g, saved in zip(opt.param_groups, saved_groups):
            for p in g["params"]:
                index.setdefault(id(p), len(index))  # state_dict's own numbering
            if "fused" in saved:
                saved["fused"], saved["foreach"] = self.of(g)
        saved_state = state_dict.get("state", {})
        for p, step in self.moved_steps(opt).items():
            i = index.get(id(p))
            if i in saved_state and saved_state[i] is opt.state[p]:
                saved_state[i] = dict(saved_state[i], step=step)
        return state_dict


def hooks(opt: Any, saved: Callable[[Any, Dict[str, Any]], Any],
          loaded: Callable[[Any], None]) -> List[Any]:
    """Register on ``opt`` the ``state_dict`` post-hook ``saved`` (which hands over what the
    unpatched optimizer saves, :meth:`OwnValues.unswitched_state_dict`) and the
    ``load_state_dict`` post-hook ``loaded`` (a checkpoint's groups replace the switched ones);
    returns their handles (none where this torch has no such hooks).

    The load hook goes first (``prepend``): a compiled step's hook that keeps state tensors'
    identity (trainkit.techniques._state_keeper) then sees the steps where they will stay."""
    if not hasattr(opt, "register_load_state_dict_post_hook"):
        return []
    return [opt.register_state_dict_post_hook(saved),
            opt.register_load_state_dict_post_hook(loaded, prepend=True)]
