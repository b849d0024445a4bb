"""Which optimizers a session had: recorded as it closes, for ``trainkit analyze``.

TA110 (no steps recorded) asks whether the optimizer is patched; when one was and never stepped
(an RL loop that learns once its replay buffer is warm, a condition a short run never met), the
answer is elsewhere: the loop never reached ``optimizer.step()``. So a session closing writes a
JSON text summary under ``trainkit/meta/optimizers``: each patched optimizer that stepped in it
or never stepped yet, its type and whether it stepped there.

TA104 (the optimizer step dominates) suggests the optimizer's fused (``fused=True``) or
multi-tensor (``foreach=True``) update; for a run that already used one, that advice is wrong.
So each entry also holds the implementation asked for (``fused``, ``foreach``: the optimizer's
``defaults``, as its constructor or the ``fused`` technique set them; a key only where it has
the option, which torch.optim's optimizers gained release by release) and the one its step
runs (``impl``), which for ``foreach=None`` torch picks at each step. Whether this torch takes
``fused=True`` at all for the optimizer's class, device and dtypes changes with the release
(torch 2.11's Adagrad refuses it on CUDA, 2.13's takes it; no release takes complex parameters):
so for one that stepped, has the option and does not run fused already, torch is asked (a
scratch twin built fused, stepped once) and the answer kept (``fused_ok``).
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional

from .patch import _patched, optimizer_patch

#: ``trainkit/meta/optimizers``: the optimizers patched when a session closed (JSON), so that
#: ``trainkit analyze`` can tell a loop that never reached ``optimizer.step()`` (TA110) from one
#: whose optimizer is not patched, and what its update already runs (TA104).
META_OPTIMIZERS = "trainkit/meta/optimizers"

#: torch.optim's optimizers whose ``foreach=None`` is the for-loop wherever the parameters are
#: (their step does not ask torch's default, as the others' do)
_NO_DEFAULT_FOREACH = ("Adafactor",)


def patched_summary(s: Any) -> str:
    """JSON: each optimizer patched now that stepped in session ``s`` or never stepped yet, its
    type and the module defining it (a third party's ``Adam`` is not torch.optim's), whether it
    stepped in ``s`` (one that stepped in another session, an earlier
    phase's, is left out: it is not this session's to step), its implementation
    (:func:`implementation`) and, for one that stepped, whether this torch takes its fused one
    (:func:`fused_accepted`)."""
    out = []
    for opt in list(_patched):
        p = optimizer_patch(opt)
        last = None if p is None or p.session is None else p.session()
        if p is None or (p.session is not None and last is not s):
            continue
        out.append({"type": type(opt).__name__, "module": type(opt).__module__,
                    "stepped": last is s, **implementation(opt),
                    **(fused_accepted(opt) if last is s else {})})
    return json.dumps(out, sort_keys=True)


def implementation(opt: Any) -> Dict[str, Any]:
    """``fused`` and ``foreach`` as ``opt.defaults`` asks them (True, False or None: torch's
    default; a key only where the optimizer has the option), and ``impl``: the implementations
    its parameter groups' steps run, sorted (``["fused"]``, ``["foreach"]``, ``["for-loop"]``;
    two where groups differ), left out where one cannot be told.

    Example::

        implementation(torch.optim.Adam(params, fused=True))
        # {"foreach": None, "fused": True, "impl": ["fused"]}
    """
    defaults = getattr(opt, "defaults", None)
    if not isinstance(defaults, dict):
        return {}
    out: Dict[str, Any] = {k: defaults[k] for k in ("fused", "foreach")
                           if k in defaults and _flag(defaults[k])}
    groups = getattr(opt, "param_groups", None) or []
    impls = {_group_impl(opt, g) for g in groups if isinstance(g, dict)}
    if impls and None not in impls:
        out["impl"] = sorted(impls)
    return out


def fused_accepted(opt: Any) -> Dict[str, Any]:
    """``fused_ok``: whether this torch takes ``fused=True`` for ``opt``'s parameters, the form
    TA104 advises (``torch.optim.Adam(params, ..., fused=True)``), as torch itself answers
    (:func:`_fused_twin_steps`); {} where there is nothing to ask or no answer: no ``fused``
    option, not torch.optim's (another library's class is not built at a close), every group
    already fused, a profiler recording (the twin's ops would land in its trace), an error
    asking, or a device that fails any op (a CUDA error earlier in the run: a refusal there
    says nothing of fused).

    Example::

        fused_accepted(torch.optim.Adam([torch.zeros(2, dtype=torch.complex64)]))
        # {"fused_ok": False}
    """
    defaults = getattr(opt, "defaults", None)
    if not isinstance(defaults, dict) or "fused" not in defaults or not _flag(defaults["fused"]):
        return {}
    try:  # (the session's close goes on whatever asking does: it only records the answer)
        import torch

        from .profiling.regions import profiler_check
        from .techniques import fused

        groups = list(opt.param_groups)
        if (fused._torch_class(type(opt)).__module__.split(".")[:2] != ["torch", "optim"]
                or all(g.get("fused") is True for g in groups) or profiler_check()()):
            return {}
        ok = _fused_twin_steps(opt)
        if not ok:  # the devices themselves answer? (else the refusal says nothing of fused)
            for dev in {p.device for g in groups for p in g["params"]}:
                torch.ones(1, device=dev).add_(1).item()
    except Exception:  # noqa: BLE001 - no answer: the key is left out
        return {}
    return {"fused_ok": ok}


def _fused_twin_steps(opt: Any) -> bool:
    """Whether a twin of ``opt`` built with ``fused=True`` steps: the torch.optim class it runs
    (``fused._torch_class``), ``opt``'s options and group options, one 1-element zero parameter
    per (device, dtype) of each group, a zero gradient, one step without torch's hooks and
    profiler range (``fused._unhooked_step``); what its constructor or step raises is torch's
    "no" (a ``differentiable`` group, complex parameters, torch 2.11's Adagrad on CUDA).

    Not ``fused._accepted``, which asks whether ``opt`` may be switched to fused where it stands
    (its twin makes its state unfused first, then switches, as the technique does): this asks
    what the advice writes, an optimizer fused from its constructor on, whose state torch makes
    fused. Nothing of ``opt`` is written; no random numbers are drawn (Adam, AdamW, SGD, Adagrad
    draw none)."""
    import torch

    from .techniques import fused

    cls, kwargs, groups, _ = fused._twin_args(opt, fused=True)
    if not groups:
        return True  # nothing to ask
    try:
        twin = cls(groups, **kwargs)
        for g in twin.param_groups:
            for p in g["params"]:
                p.grad = torch.zeros_like(p)
        fused._unhooked_step(twin)()
    except Exception:  # noqa: BLE001 - what the advised optimizer would raise: torch's "no"
        return False
    return True


def _flag(value: Any) -> bool:
    """Whether ``value`` is a ``fused``/``foreach`` as torch.optim means it (True, False, None):
    another optimizer's own kind of value (a tensor, a string) is not guessed at, nor written."""
    return value is None or isinstance(value, bool)


def _group_impl(opt: Any, group: Dict[str, Any]) -> Optional[str]:
    """The implementation torch.optim runs ``group``'s step with: ``fused=True`` the fused kernel
    (which refuses parameters it cannot take), ``foreach=True`` the multi-tensor one, either
    False the for-loop; None where that cannot be told (no such options, a ``foreach=None`` not
    torch.optim's to resolve)."""
    if "fused" not in group and "foreach" not in group:
        return None
    fused, foreach = group.get("fused"), group.get("foreach")
    if not (_flag(fused) and _flag(foreach)):
        return None
    if fused:
        return "fused"
    if foreach:
        return "foreach"
    if fused is not None or foreach is not None:  # one of them turned off: no default asked
        return "for-loop"
    cls = type(opt)
    if cls.__module__.split(".")[:2] != ["torch", "optim"]:  # Adafactor's is torch.optim
        return None
    if cls.__name__ in _NO_DEFAULT_FOREACH:
        return "for-loop"
    foreach = _default_foreach(opt, group)
    return None if foreach is None else "foreach" if foreach else "for-loop"


def _default_foreach(opt: Any, group: Dict[str, Any], *,
                     tensor_lr: Optional[bool] = None) -> Optional[bool]:
    """Whether torch.optim's step takes the multi-tensor update for a group that asked for
    neither, or None where this torch's rule cannot be read: torch's own rule (the same in
    torch 2.11 and 2.14: every parameter a plain tensor on a device with foreach kernels, CUDA
    and not the CPU, and not ``differentiable``), and Adam's (AdamW's) exception, a tensor
    ``lr`` without ``capturable``, which keeps the for-loop. ``tensor_lr``: whether to take
    ``lr`` as a tensor (the compiled step asks before it puts one there,
    trainkit/techniques/_hyper.py); by default, as the group holds it."""
    import torch

    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
    except ImportError:  # a torch that moved it: the rule is not ours to copy
        return None
    try:  # (a private function: what it raises on a group it did not foresee leaves impl out)
        _, foreach = _default_to_fused_or_foreach(list(group.get("params", [])),
                                                  bool(group.get("differentiable")),
                                                  use_fused=False)
    except Exception:  # noqa: BLE001 - the session's close goes on: it only records this
        return None
    if tensor_lr is None:
        tensor_lr = isinstance(group.get("lr"), torch.Tensor)
    if foreach and isinstance(opt, torch.optim.Adam) and tensor_lr and not group.get("capturable"):
        return False
    return foreach
