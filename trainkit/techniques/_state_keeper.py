"""A compiled optimizer step guards on its state tensors' identity: ``load_state_dict`` copies
into them while a compiled step uses the optimizer (a checkpoint loaded mid-run, a resume, was a
recompile after warm-up and its warning), and ``tk.unpatch`` gives ``load_state_dict`` back."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .. import _optstate


_KEEPER = "_trainkit_keeps_state"  # on the optimizer: [hook handles, how many compiled steps use them]


def keep_state_tensors(opt: Any) -> None:
    """Make ``opt.load_state_dict`` copy into the state tensors it replaces (same shape, dtype
    and device), while a compiled step uses ``opt``: the compiled step guards on their identity,
    so a checkpoint loaded mid-run (a resume) was a recompile after warm-up, and its warning.
    :func:`release_state_tensors` undoes it (``tk.unpatch``)."""
    keeper = opt.__dict__.get(_KEEPER)
    if keeper is not None:
        keeper[1] += 1
        return
    if not hasattr(opt, "register_load_state_dict_post_hook"):
        return
    import torch

    held: Dict[str, Any] = {}

    def pre(optimizer: Any, state_dict: Any) -> None:
        held["state"] = {p: dict(st) for p, st in optimizer.state.items()}

    def post(optimizer: Any) -> None:
        before = held.pop("state", {})
        with torch.no_grad():
            for p, st in optimizer.state.items():
                old = before.get(p, {})
                for key, value in st.items():
                    t = old.get(key)
                    if (isinstance(value, torch.Tensor) and isinstance(t, torch.Tensor)
                            and t is not value and t.shape == value.shape
                            and t.dtype == value.dtype and t.device == value.device):
                        t.copy_(value)
                        st[key] = t

    handles = (opt.register_load_state_dict_pre_hook(pre),
               opt.register_load_state_dict_post_hook(post))
    opt.__dict__[_KEEPER] = [handles, 1]
    if _optstate.leaks(opt, _KEEPER):  # its class hands its __dict__ over: not these to copies
        _optstate.guard(opt, lambda d: _unkept(d, handles), key=_KEEPER)


def _unkept(d: Dict[str, Any], handles: Tuple[Any, ...]) -> Dict[str, Any]:
    """``d``, the ``__dict__`` part of a copy of the optimizer, without what
    :func:`keep_state_tensors` added: its flag, and its hooks (local functions: ``pickle`` failed
    on them, and a deep copy kept them). The hook registries are the live ones: copied, not
    changed."""
    d.pop(_KEEPER, None)
    for handle in handles:
        name = _hooks_name(d, handle)
        if name is not None:
            d[name] = type(d[name])((k, v) for k, v in d[name].items() if k != handle.id)
    return d


def _hooks_name(d: Dict[str, Any], handle: Any) -> Optional[str]:
    """The key in ``d`` of the hook registry ``handle`` removes from (None where ``d`` lacks it)."""
    registry = handle.hooks_dict_ref()
    return None if registry is None else next((k for k, v in d.items() if v is registry), None)


def release_state_tensors(opt: Any) -> None:
    """One compiled step no longer uses ``opt``: the last one removes the hooks
    :func:`keep_state_tensors` added (``load_state_dict`` replaces state tensors again)."""
    keeper = opt.__dict__.get(_KEEPER)
    if keeper is None:
        return
    keeper[1] -= 1
    if keeper[1] <= 0:
        for handle in keeper[0]:
            handle.remove()
        del opt.__dict__[_KEEPER]
        _optstate.unguard(opt, key=_KEEPER)
