"""Groups that reach an optimizer after the ``fused`` switch: added with ``add_param_group``.

A group added under the switch takes the switched ``defaults`` (``setdefault``), and
``tk.unpatch`` gives each group its own values back: those its caller wrote, the unpatched
defaults for the others.
"""
from __future__ import annotations

from typing import Any, Iterator, List, Tuple

import pytest
import torch

import trainkit as tk
from trainkit import switches
from trainkit.techniques import fused


@pytest.fixture(autouse=True)
def cpu_fused() -> Iterator[None]:
    if "cpu" not in fused._supported_devices():
        pytest.skip("fused optimizer kernels on the CPU need torch >= 2.4")
    yield


def _param(dtype: torch.dtype = torch.float32) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.ones(3, dtype=dtype))


def _switched(want: bool, **kwargs: Any) -> Any:
    opt = torch.optim.Adam([_param()], lr=0.05, **kwargs)
    with switches.overrides({"fused": want}):
        tk.patch(opt)
    return opt


def _values(opt: Any) -> List[Tuple[Any, Any]]:
    return [(g["fused"], g["foreach"]) for g in opt.param_groups]


def test_unpatch_gives_an_added_group_the_values_its_caller_wrote() -> None:
    """Before the fix a group added with ``fused=True`` under a ``fused=True`` override (the
    value the switch had put in the defaults) was taken for one that had used the default, and
    ``tk.unpatch`` gave it the optimizer's unpatched default (None): it ran unfused from there."""
    opt = _switched(True)
    opt.add_param_group({"params": [_param()], "fused": True, "foreach": False})
    opt.add_param_group({"params": [_param()], "foreach": True})  # fused from the switch
    opt.add_param_group({"params": [_param()]})
    # foreach=True goes off with the switch, as at the patch
    assert _values(opt) == [(True, None), (True, False), (True, False), (True, None)]
    tk.unpatch(opt)
    assert _values(opt) == [(None, None), (True, False), (None, True), (None, None)]
    assert opt.defaults["fused"] is None and "add_param_group" not in opt.__dict__


def test_switched_off_an_explicit_false_is_kept_at_unpatch() -> None:
    """The other way: an optimizer built ``fused=True`` switched off, a group added with
    ``fused=False`` (the switched value) was given ``fused=True`` back at unpatch."""
    opt = _switched(False, fused=True)
    opt.add_param_group({"params": [_param()], "fused": False})
    opt.add_param_group({"params": [_param()]})
    assert _values(opt) == [(False, None)] * 3
    tk.unpatch(opt)
    assert _values(opt) == [(True, None), (False, None), (True, None)]
