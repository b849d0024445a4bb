"""A compiled optimizer step guards on its state tensors' identity: ``load_state_dict`` copies
into them while a compiled step uses the optimizer (a checkpoint loaded mid-run, a resume, was a
recompile after warm-up and its warning), and ``tk.unpatch`` gives ``load_state_dict`` back."""
from __future__ import annotations

from typing import Any, Dict


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

    opt.__dict__[_KEEPER] = [(opt.register_load_state_dict_pre_hook(pre),
                              opt.register_load_state_dict_post_hook(post)), 1]


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
