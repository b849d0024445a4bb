"""Groups that reach an optimizer after the ``fused`` switch: added with ``add_param_group``.

A group added under the switch takes the switched ``defaults`` (``setdefault``), and
``tk.unpatch`` gives each group its own values back: those its caller wrote, the unpatched
defaults for the others.
"""
from __future__ import annotations

import warnings
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


def _train(opt: Any, steps: int = 2) -> List[torch.Tensor]:
    params = [p for g in opt.param_groups for p in g["params"]]
    for i in range(steps):
        for p in params:
            p.grad = torch.full_like(p, 0.1 * (i + 1))
        opt.step()
    return [p.detach().clone() for p in params]


def test_an_added_group_the_fused_step_refuses_switches_the_optimizer_back() -> None:
    """Asked at the patch only, a group added later that torch's fused step refuses (complex
    parameters here) was given ``fused=True`` and the next step raised torch's error, where the
    unpatched optimizer runs. Now it is asked on arrival: refused, the optimizer goes back to
    its own values, as one refused at the patch is left as it is, and a warning says so."""
    opt, ref = _switched(True), torch.optim.Adam([_param()], lr=0.05)
    _train(opt), _train(ref)
    assert opt.param_groups[0]["fused"] is True
    ok = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt.add_param_group({"params": [ok]})  # taken: the switch stays
    ref.add_param_group({"params": [_param(torch.float64)]})
    assert _values(opt)[1] == (True, None)
    with pytest.warns(RuntimeWarning, match=r"fused=True override no longer applies to Adam.*"
                      r"add_param_group \(RuntimeError: .*complex64.*own optimizer|optimizer of"):
        opt.add_param_group({"params": [_param(torch.complex64)]})
    ref.add_param_group({"params": [_param(torch.complex64)]})
    assert _values(opt) == [(None, None)] * 3 and opt.defaults["fused"] is None
    assert "_step_supports_amp_scaling" not in opt.__dict__
    for a, b in zip(_train(opt), _train(ref)):  # before: RuntimeError at this step
        torch.testing.assert_close(a, b)
    tk.unpatch(opt)
    assert _values(opt) == [(None, None)] * 3 and "add_param_group" not in opt.__dict__


def test_a_group_given_its_own_fused_is_not_asked() -> None:
    """What the caller wrote is kept as given, as unpatched torch would run it: not asked."""
    opt = _switched(True)
    opt.add_param_group({"params": [_param(torch.complex64)], "fused": False})
    assert _values(opt) == [(True, None), (False, None)]
    tk.unpatch(opt)


def test_a_loaded_group_the_fused_step_refuses_switches_the_optimizer_back() -> None:
    """A checkpoint's groups replace the switched ones, their options with them: one saved with
    ``differentiable=True`` was switched to fused on load, and the next step raised ("does not
    support differentiable"). Asked at the load, refused: the optimizer keeps the checkpoint's
    own values."""
    opt = _switched(True)
    _train(opt)
    saved = opt.state_dict()
    saved["param_groups"][0]["differentiable"] = True
    with pytest.warns(RuntimeWarning, match="groups loaded with load_state_dict.*differentiable"):
        opt.load_state_dict(saved)
    assert _values(opt) == [(None, None)] and opt.param_groups[0]["differentiable"] is True
    _train(opt)  # before: RuntimeError
    plain = torch.optim.Adam([_param()], lr=0.05)
    opt.load_state_dict(plain.state_dict())  # switched back for good: no warning, no switch
    assert _values(opt) == [(None, None)]
    tk.unpatch(opt)
    assert _values(opt) == [(None, None)]


def test_switched_back_where_warnings_are_errors_the_add_and_the_load_complete() -> None:
    """Under ``python -W error`` the switch-back's warning was raised out of the hook that gives
    it: ``add_param_group`` raised with the group added (torch's own retry then refused the
    parameters as in two groups), and ``load_state_dict`` raised with the checkpoint loaded and
    the post-hooks after trainkit's (a compiled step's, your own) not run. It is shown, not
    raised: both complete as unpatched, and the optimizer runs its own values."""
    opt = _switched(True)
    ran: List[Any] = []
    opt.register_load_state_dict_post_hook(ran.append)  # after trainkit's (prepended) one
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")
        opt.add_param_group({"params": [_param(torch.complex64)]})
        assert len(opt.param_groups) == 2 and _values(opt) == [(None, None)] * 2
        assert "add_param_group" in str(shown[-1].message)
        opt = _switched(True)
        opt.register_load_state_dict_post_hook(ran.append)
        _train(opt)
        saved = opt.state_dict()
        saved["param_groups"][0]["differentiable"] = True
        opt.load_state_dict(saved)
    assert ran == [opt] and _values(opt) == [(None, None)]
    assert "load_state_dict" in str(shown[-1].message)
    assert all(w.category is RuntimeWarning for w in shown) and len(shown) == 2
    assert all(w.filename == __file__ for w in shown)  # at the user's call, past torch's
    _train(opt)
    tk.unpatch(opt)
