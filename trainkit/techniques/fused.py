"""The ``fused`` technique: the optimizer's single-kernel update, switched at ``tk.patch``.

``tk.patch(optimizer)`` asks ``tk.technique("fused", <current value>)``; only when the answer
differs (an ablation override) does it change ``param_groups[i]["fused"]`` and
``defaults["fused"]``, and only where that is valid: the optimizer has a ``fused`` option (Adam,
AdamW, SGD, Adagrad in torch 2.11 to 2.14) and no group is ``differentiable``; to turn it on, this
torch's own step must accept it for the optimizer's class and its parameters' devices and dtypes,
which changes with the release (torch 2.11's Adagrad refuses it on CUDA, 2.13's takes it), so
torch is asked: see :func:`_accepted`. Where it is not valid the optimizer is left as it is.
Turning it on also turns ``foreach`` off (the two cannot both be True). Either way the state's
``step`` tensors go where the switched update reads them (:mod:`._fused_steps`): float32 on the
parameter's device for fused, a CPU tensor for the for-loop update (left on a GPU, each was an
``.item()`` sync per parameter per step). Groups added with ``add_param_group`` take the switch
where their caller gave no ``fused`` (what it wrote is what ``tk.unpatch`` gives back), and where
torch's fused step takes them (:mod:`._fused_switch`: else the optimizer goes back to its own);
``optimizer.state_dict()`` saves what the unpatched optimizer would (its own ``fused`` values,
its steps hosted for them), and so do ``copy.deepcopy`` and ``pickle`` (:mod:`._fused_switch`);
``load_state_dict`` under the patch keeps the switch. ``tk.unpatch`` gives every group, those
added or loaded since too, its own values back, and the steps their place.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._fused_steps import host_steps
from ._fused_switch import Switch


def _supported_devices() -> List[str]:
    """The device types torch lists with fused optimizer kernels (CUDA; the CPU since torch 2.4).

    Only the list: an optimizer class may refuse one of them (torch 2.11's Adagrad refuses CUDA),
    which :func:`_accepted` asks the class itself."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return list(_get_fused_kernels_supported_devices())
    except ImportError:  # older torch: CUDA only
        return ["cuda"]


def _valid(opt: Any, want: bool) -> bool:
    """Whether ``fused=want`` may be set on ``opt``: it has the option, no group is
    ``differentiable`` and, to turn it on, this torch's step accepts it (:func:`_accepted`).
    Turning it off is always valid: every torch.optim optimizer with a fused update also has its
    for-loop one, for any parameter."""
    defaults = getattr(opt, "defaults", None)
    if not isinstance(defaults, dict) or "fused" not in defaults:
        return False
    if any(g.get("differentiable") for g in opt.param_groups):
        return False
    return not want or _accepted(opt)


def _torch_class(cls: type) -> type:
    """The torch.optim class whose step ``cls`` runs (``cls`` itself, or the torch base of a
    user's subclass, whose constructor may take other arguments); ``cls`` where it has none."""
    import torch

    for c in cls.__mro__:
        if c is not torch.optim.Optimizer and issubclass(c, torch.optim.Optimizer) \
                and c.__module__.startswith("torch.optim"):
            return c
    return cls


def _accepted(opt: Any) -> bool:
    """Whether this torch's step of ``opt``'s class runs ``fused=True`` for its parameters: asked
    of a scratch twin, never of ``opt`` (:func:`_refusal`).

    Which (class, device, dtype) takes a fused step is each class's own code and changes with the
    release (torch 2.11's Adagrad calls ``_device_dtype_check_for_fused(p, cuda_unsupported=True)``
    although ``_get_fused_kernels_supported_devices()`` lists "cuda"; 2.13 and 2.14 accept it).
    The twin is the class torch.optim defines, built with ``opt``'s options and groups, one
    1-element parameter per (device, dtype) of each group; stepped once first where ``opt`` has
    state there (Adagrad builds its state in the constructor, the others at their first step),
    then switched exactly as :func:`apply` switches ``opt`` (its steps hosted as fused state has
    them, :func:`._fused_steps.host_steps`) and stepped with a zero gradient.
    Any exception means no: the step would have raised the same way on ``opt``. It costs a few
    tiny allocations and kernel launches, once, at ``tk.patch`` (0.3 to 3 ms on a CPU, the first
    the most); its step skips torch's step hooks and profiler range (:func:`_unhooked_step`), so
    no user hook or trace sees it. A version table would cost nothing at run time but go stale
    with each release; the device list is what went wrong.
    """
    return _refusal(opt) is None


def _refusal(opt: Any, groups: Optional[List[Dict[str, Any]]] = None,
             defaults: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """What :func:`_accepted` asks, of ``groups`` (``opt``'s own groups, or others of its
    parameters: those added or loaded under the switch, with their own values) and ``defaults``
    (``opt.defaults``): None where the fused step takes them, else why not (what it raised)."""
    import torch

    try:
        cls, kwargs, groups, stateful = _twin_args(opt, groups=groups, defaults=defaults)
    except (TypeError, ValueError) as exc:  # a constructor whose signature cannot be read
        return f"the signature of {type(opt).__name__}'s constructor cannot be read: {exc}"
    if not groups:
        return None  # nothing to ask: torch checks the parameters added later at its step
    try:
        twin = cls(groups, **kwargs)
        step = _unhooked_step(twin)
        if stateful:  # the state opt has, made as it made it: by its own (unfused) step
            for p in stateful.values():
                p.grad = torch.zeros_like(p)
            step()
        for g in twin.param_groups:
            for p in g["params"]:
                p.grad = torch.zeros_like(p)
        _set_fused(twin, True)
        host_steps(twin)
        step()
    except Exception as exc:  # noqa: BLE001 - what the step raises on opt: torch's "no"
        return f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return None


def _twin_args(opt: Any, *, fused: bool = False, groups: Optional[List[Dict[str, Any]]] = None,
               defaults: Optional[Dict[str, Any]] = None) -> Tuple[
                   type, Dict[str, Any], List[Dict[str, Any]], Dict[int, Any]]:
    """What a scratch twin of ``opt`` is built from: the torch.optim class its step runs
    (:func:`_torch_class`, whose constructor may take other arguments than a user's subclass),
    the options of ``opt.defaults`` that constructor takes, and for each of ``opt``'s groups its
    options (unknown keys too: ``add_param_group`` keeps them) with one 1-element zero parameter
    per (device, dtype) of its parameters; and those twin parameters, by id, whose (group,
    device, dtype) has state in ``opt``. ``fused``: the options and groups ask ``fused=True``
    (``foreach`` off), as a constructor written that way does. ``groups`` and ``defaults`` stand
    in for ``opt``'s own where given. Raises TypeError or ValueError where the constructor's
    signature cannot be read."""
    import torch

    cls = _torch_class(type(opt))
    accepts = inspect.signature(cls.__init__).parameters
    any_kw = any(a.kind is inspect.Parameter.VAR_KEYWORD for a in accepts.values())
    kwargs = {k: v for k, v in (opt.defaults if defaults is None else defaults).items()
              if k != "params" and (any_kw or k in accepts)}
    twin_groups: List[Dict[str, Any]] = []
    stateful: Dict[int, Any] = {}
    for g in opt.param_groups if groups is None else groups:
        twins: Dict[Tuple[Any, Any], Any] = {}
        for p in g["params"]:
            key = (p.device, p.dtype)
            if key not in twins:
                twins[key] = torch.zeros(1, device=p.device, dtype=p.dtype)
            if opt.state.get(p):
                stateful[id(twins[key])] = twins[key]
        if twins:
            twin_groups.append({**{k: v for k, v in g.items() if k != "params"},
                                "params": list(twins.values())})
    if fused:
        for options in (kwargs, *twin_groups):
            options["fused"] = True
            if options.get("foreach"):  # (the two cannot both be True)
                options["foreach"] = False
    return cls, kwargs, twin_groups, stateful


def _unhooked_step(opt: Any) -> Callable[[], Any]:
    """``opt.step`` without torch's wrapper (global and per-optimizer hooks, the
    ``Optimizer.step#...`` profiler range); the wrapped one where this torch has no such wrapper."""
    step = type(opt).step
    inner = getattr(step, "__wrapped__", None) if getattr(step, "hooked", False) else None
    if inner is None:
        return opt.step
    return lambda: inner(opt)


def _set_fused(opt: Any, want: bool) -> None:
    """Set ``fused`` to ``want`` in every group and the defaults, ``foreach`` off with it on."""
    for g in opt.param_groups:
        g["fused"] = want
        if want and g.get("foreach"):
            g["foreach"] = False
    opt.defaults["fused"] = want
    if want and opt.defaults.get("foreach"):
        opt.defaults["foreach"] = False


def apply(opt: Any) -> Optional[Switch]:
    """Apply the ``fused`` technique to ``opt``; returns the switch (whose ``undo()`` undoes it),
    or None when nothing changed.

    Example::

        with tk.switches.overrides({"fused": True}):
            tk.patch(optimizer)      # Adam(..., fused=True) from here on
    """
    from .. import switches

    current = opt.defaults.get("fused") if hasattr(opt, "defaults") else None
    if current is not None and not isinstance(current, bool):
        return None  # another optimizer's own kind of value (a str, a tensor): not guessed at
    want = switches.technique("fused", current)
    if bool(want) == bool(current) or not _valid(opt, bool(want)):
        return None
    return Switch(opt, bool(want), _set_fused, _refusal)
