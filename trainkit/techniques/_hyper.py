"""Scheduled hyper-parameters (``lr``, Adam's ``betas``) held as tensors in a compiled step.

An LR scheduler changes ``lr`` between steps; a Python float in the graph would make every new
value a recompile. :class:`HyperTensors` swaps persistent tensors in for the call and the floats
back after it (:mod:`trainkit.techniques.compiled_step`).
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, List, Tuple

from ._torch_version import torch_before


def _takes_tensor(opt: Any, group: Dict[str, Any], key: str) -> bool:
    """Whether this group's step accepts ``key`` as a tensor (read from torch/optim's sources)."""
    import torch

    if group.get("differentiable"):
        return False
    if key == "betas":  # only Adam/AdamW take tensor betas; the fused kernels read them with .item()
        if not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)) or group.get("fused"):
            return False
    if group.get("capturable") or (key == "lr" and group.get("fused")):
        return True
    params = group["params"]
    first = params[0].device if params else None
    if first is not None and first.type != "cpu" and any(p.device != first for p in params):
        # The tensor is made on the first parameter's device (swap_in): on a GPU, the step's
        # for-loop could not use it on the group's parameters elsewhere (floats, as before).
        return False
    foreach = group.get("foreach")
    if foreach is None:
        foreach = _foreach_default(opt, group, key)
    if not foreach:
        return True  # the single-tensor loops take tensor lr/betas
    # foreach without capturable rejects tensors; dynamo sets capturable=True itself for CUDA
    # and XPU parameters whose state does not exist yet (torch/_dynamo/variables/optimizer.py,
    # the same in torch 2.11 and 2.14).
    return all(p.is_cuda or p.is_xpu for p in params) \
        and not any(opt.state.get(p) for p in params)


def _foreach_default(opt: Any, group: Dict[str, Any], key: str) -> bool:
    """Whether torch's step of ``group`` (``foreach=None``) takes the multi-tensor update, with
    ``lr`` a tensor where it is the one asked about or already is one: torch's own rule
    (trainkit/_optinfo.py): every parameter on a device with foreach kernels (CUDA, XPU...),
    and Adam's (AdamW's) exception, a tensor ``lr`` without ``capturable`` keeps the for-loop,
    which takes it. The first parameter alone, on CUDA alone, missed the exception: an Adam
    whose state existed before its first compiled step (resumed from a checkpoint) kept a float
    ``lr``, a recompile at each new value. Where this torch's rule cannot be read: every
    parameter on CUDA."""
    import torch

    from .._optinfo import _default_foreach

    tensor_lr = key == "lr" or isinstance(group.get("lr"), torch.Tensor)
    foreach = _default_foreach(opt, group, tensor_lr=tensor_lr)
    if foreach is None:
        params = group["params"]
        return bool(params) and all(p.is_cuda for p in params)
    return foreach


#: The first torch whose compiled Adam/AdamW step takes tensor betas on the CPU: at the step
#: where they start to move, 2.3's fails ("If capturable=True, params and state_steps must be
#: CUDA or XLA tensors"), and 2.4's ("expected dtype float for `weight` but got dtype double").
TENSOR_BETAS_ON_CPU = (2, 5)


def _check_tensor_betas(opt: Any, device: Any,
                        saved: List["Saved"]) -> None:
    """Refuse, clearly and with the group's values restored, what this torch would fail on."""
    import torch

    if torch.device(device).type != "cpu" or not torch_before(TENSOR_BETAS_ON_CPU):
        return
    HyperTensors.restore(saved)
    need = ".".join(map(str, TENSOR_BETAS_ON_CPU))
    name = type(opt).__name__
    raise RuntimeError(
        f"compiled_step({name}): an LR scheduler moves its betas (OneCycleLR, or CyclicLR with "
        f"cycle_momentum=True), which the compiled step holds as tensors, and this torch's "
        f"({torch.__version__}) {name} step fails on tensor betas on the CPU: that needs torch "
        f">= {need}. Upgrade torch (pip install 'torch>={need}'), keep the betas constant "
        f"(e.g. OneCycleLR(..., cycle_momentum=False)), or step this optimizer uncompiled")


def _lr_shape(opt: Any, wide: bool) -> Tuple[int, ...]:
    """The lr tensor's shape: one element either way (torch's steps squeeze it to a scalar).

    SGD in float64 with more than one param group (its momentum on, say) failed its first compiled
    step with a 0-d float64 lr (dynamo's ``SpeculationLogDivergence``, torch 2.14; raw
    ``torch.compile`` with a 0-d float64 lr alike); a ``(1,)`` one compiles and stays exact.
    """
    import torch

    return (1,) if wide and isinstance(opt, torch.optim.SGD) else ()


class HyperTensors:
    """Persistent tensors standing in for one optimizer's scheduled Python hyper-parameters.

    ``lr`` is held as a tensor from the first call: every LR scheduler changes it, and a tensor
    lr costs nothing in the compiled step. ``betas`` become tensors only once they change between
    two calls (OneCycleLR or CyclicLR cycling momentum): tensor betas cost Adam's compiled step
    ~17% on a CPU (measured on 10 x Linear(1024, 1024)), a price only a schedule that moves them
    should pay. That switch is one compile, which ``expect_compile`` marks as expected.
    """

    KEYS = ("lr", "betas")

    def __init__(self, opt: Any) -> None:
        # Weakly: this lives in the optimizer's patch (a strong one was a reference cycle, and
        # the optimizer and its state outlived `del optimizer` until the cyclic collector ran)
        self._opt = weakref.ref(opt)
        self._tensors: Dict[Tuple[int, str], Any] = {}
        self._filled: Dict[Tuple[int, str], float] = {}  # the value each tensor holds
        self._betas_seen: Dict[int, Any] = {}  # group -> betas at the previous call
        self._betas_moving: Dict[int, bool] = {}
        #: True after a call that switched some group's betas to tensors (one compile expected).
        self.expect_compile = False
        self._momentum_seen: Dict[int, Any] = {}  # group -> SGD nesterov momentum last call
        #: True once a nesterov SGD group's momentum moved: its compiled step is wrong (stale).
        self.needs_eager = False

    def _tensor(self, gi: int, key: str, value: float, device: Any, wide: bool = False,
                shape: Tuple[int, ...] = ()) -> Any:
        import torch

        t = self._tensors.get((gi, key))
        if t is None:
            # Betas on the CPU in float64: Adam computes 1 - beta**step from them, and float32
            # drifts from eager's Python doubles (rel err ~1e-5 after a few dozen steps; float64:
            # ~3e-7). On CUDA float32, what the capturable foreach kernels take. Everything in
            # float64 for float64 parameters (``wide``): eager's lr is a Python double, and a
            # float32 one is off by ~1e-8 relative.
            dtype = (torch.float64 if wide or (key.startswith("beta")
                                               and torch.device(device).type == "cpu")
                     else torch.float32)
            t = self._tensors[(gi, key)] = torch.zeros(shape, dtype=dtype, device=device)
        # A plain copy outside the graph (dynamo never sees the float), and only of a new value:
        # on a GPU each fill_ is a kernel launch, a step's worth of host time for a small model
        # (tk.compiled_step at 0.85x of raw torch.compile on an H100 with a fill_ every call).
        # Nothing else writes these tensors. 0.0 is filled every time (-0.0 == 0.0).
        last = self._filled.get((gi, key))
        if last is None or value != last or value == 0.0:
            t.fill_(value)
            self._filled[(gi, key)] = value
        return t

    @property
    def opt(self) -> Any:
        """The optimizer (None once it was freed)."""
        return self._opt()

    def swap_in(self) -> List["Saved"]:
        """Put tensors holding the current values into ``param_groups``; returns what to restore."""
        import torch

        saved: List[Saved] = []
        self.expect_compile = False
        opt = self.opt
        if opt is None:
            return saved
        for gi, group in enumerate(opt.param_groups):
            params = group["params"]
            self._watch_nesterov_momentum(opt, gi, group)
            device = params[0].device if params else "cpu"
            wide = bool(params) and params[0].dtype == torch.float64
            for key in self.KEYS:
                value = group.get(key)
                if key == "lr" and isinstance(value, (float, int)) and value.__class__ is not bool:
                    # An int too (SGD(..., lr=1)): a scheduler's first float for it (StepLR's
                    # 0.5) was a recompile after warm-up, the int a constant of the graph.
                    new: Any = self._tensor(gi, "lr", value, device, wide, _lr_shape(opt, wide))
                elif (key == "betas" and isinstance(value, tuple) and len(value) == 2
                      and all(isinstance(b, float) for b in value)):
                    if not self._betas_moving.get(gi):
                        seen = self._betas_seen.get(gi)
                        if seen not in (None, value) and _takes_tensor(opt, group, key):
                            _check_tensor_betas(opt, device, saved)
                        self._betas_seen[gi] = value
                        if seen is None or seen == value:
                            continue  # constant so far: left a Python float, folded by inductor
                        self._betas_moving[gi] = True
                        self.expect_compile = _takes_tensor(opt, group, key)
                    new = (self._tensor(gi, "beta1", value[0], device, wide),
                           self._tensor(gi, "beta2", value[1], device, wide))
                else:
                    continue  # absent, or already a tensor (the user's own recipe)
                if not _takes_tensor(opt, group, key):
                    continue
                saved.append((group, key, value, new, _versions(new), self, gi))
                group[key] = new
        return saved

    def _watch_nesterov_momentum(self, opt: Any, gi: int, group: Dict[str, Any]) -> None:
        """Note a moving ``momentum`` (OneCycleLR, CyclicLR) of a nesterov SGD group that steps
        with torch's single-tensor loop (the CPU's default).

        Once it moves dynamo makes it a dynamic float, and inductor's graph for that step reuses
        a stale value (pytorch/pytorch#194976; torch 2.14: parameters 12-40% off eager's after
        a few steps); specialised, every new value would be a recompile."""
        import torch

        if self.needs_eager or not isinstance(opt, torch.optim.SGD) or not group.get("nesterov") \
                or group.get("foreach") or group.get("fused"):
            return
        value = group.get("momentum")
        seen = self._momentum_seen.get(gi)
        self._momentum_seen[gi] = value
        if seen is not None and seen != value:
            self.needs_eager = True

    @staticmethod
    def restore(saved: List[Saved]) -> List[Dict[str, Any]]:
        """Put the Python values back in ``param_groups``: those from before the call, or what
        code run in the call set there (an LR scheduler stepped in the compiled function, as in
        torch's recipe ``def step(): opt.step(); sched.step()``), as floats. It fills the tensor
        it finds in a group (a scheduler's ``_update_lr``), or sets a new value (a hand-written
        schedule's ``group["lr"] = ...``); the old float put back lost the new lr, which then
        went missing from ``state_dict`` and the checkpoint, and a resumed run diverged.
        Returns the groups whose lr code in the call set (see :func:`last_lr_floats`)."""
        lr_set: List[Dict[str, Any]] = []
        for group, key, value, put, versions, owner, gi in saved:
            written = _versions(put) != versions
            if key == "lr" and (written or group.get(key) is not put):
                lr_set.append(group)
            if written:  # filled in place in the call: what its tensors hold is not known here
                for name in (("lr",) if key == "lr" else ("beta1", "beta2")):
                    owner._filled.pop((gi, name), None)  # so the next call fills them again
            now = group.get(key)
            # Nothing in the call wrote it: the value from before. Else the call's value (in
            # place, or set anew), with any tensor of ours in it read back as a float.
            group[key] = value if now is put and not written else _floats(now, put)
        return lr_set


def last_lr_floats(schedulers: List[Any], lr_set: List[Dict[str, Any]]) -> None:
    """Python floats in the ``_last_lr`` of LR schedulers stepped in a compiled call, for the
    groups whose lr the call set (``lr_set``, from :meth:`HyperTensors.restore`), as in
    ``param_groups`` by then: a scheduler keeps ``[group["lr"] for group in param_groups]``,
    which were the call's lr tensors, so ``get_last_lr()`` gave 0-d tensors (its state_dict, and
    a checkpoint, too) where eager gives floats. A user's own tensor lr is left as it is.

    Older torch's schedulers (2.3) set a new lr, not fill the group's: a 0-d tensor computed from
    ours, in both the group and ``_last_lr``. That one object in both is the scheduler's value
    (the group held a float before the call: ``lr_set`` holds only groups trainkit swapped), so
    it is read back as a float there too (one sync on a GPU, at such a call only)."""
    import torch

    def set_here(v: Any, group: Dict[str, Any]) -> bool:
        return isinstance(v, torch.Tensor) and any(group is g for g in lr_set) \
            and (isinstance(group.get("lr"), float) or group.get("lr") is v)

    for sched in schedulers:
        last, groups = sched._last_lr, sched.optimizer.param_groups
        if len(last) == len(groups) and any(set_here(v, g) for v, g in zip(last, groups)):
            for v, g in zip(last, groups):
                if set_here(v, g) and g["lr"] is v:
                    g["lr"] = float(v.reshape(()).item())
            sched._last_lr = [g["lr"] if set_here(v, g) else v for v, g in zip(last, groups)]


#: what :meth:`HyperTensors.swap_in` changed in one group: the group, the key, the value before,
#: what was put in, its tensors' versions then, the :class:`HyperTensors` and the group's index
Saved = Tuple[Dict[str, Any], str, Any, Any, Tuple[int, ...], "HyperTensors", int]


def _versions(put: Any) -> Tuple[int, ...]:
    """The version counters of the tensor(s) put in a group: an in-place write bumps them."""
    return tuple(t._version for t in (put if isinstance(put, tuple) else (put,)))


def _floats(value: Any, put: Any) -> Any:
    """``value`` with each tensor of ours in it (``put``'s) read back as a float (one sync on a
    GPU, only when the call wrote a value there)."""
    ours = put if isinstance(put, tuple) else (put,)

    def read(v: Any) -> Any:
        return float(v.reshape(()).item()) if any(v is t for t in ours) else v

    return tuple(read(v) for v in value) if isinstance(value, tuple) else read(value)
