"""One optimizer's ``fused`` switch (trainkit.techniques.fused): made at ``tk.patch``, kept on the
groups added or loaded later, left out of what ``state_dict`` saves and of copies, undone at
``tk.unpatch``.

A group ``add_param_group`` adds takes the switched ``defaults`` (``setdefault``), so after it
nothing tells a value its caller wrote from one it took: the switch sets an instance
``add_param_group`` (:meth:`Switch.add_param_group`) that notes what the caller wrote, which
``tk.unpatch`` gives back (a group added with ``fused=True`` under a ``fused=True`` override was
given the optimizer's unpatched default, None).

Whether torch's fused step takes the groups is asked at the patch (trainkit.techniques.fused
``_accepted``), and asked again of each group that arrives under ``fused=True``: added with
``add_param_group`` (unless its caller wrote its ``fused``) or loaded with ``load_state_dict``.
Unasked, a group the kernel refuses (complex parameters, ``differentiable=True``, a device
without fused kernels) failed at the next step with torch's error, where the unpatched optimizer
ran. Refused, the optimizer goes back to its own values, as one refused at the patch is left as
it is (a mix of fused and unfused groups would fail under a GradScaler, which leaves the
unscaling to the kernel of every group), and a RuntimeWarning says so.

A copy (``copy.deepcopy``, ``pickle``) is made from the optimizer's ``__getstate__``, which hands
over its live ``param_groups``, ``defaults`` and ``state``: a copy of a switched optimizer was
switched too (``fused=True`` in its groups and defaults, its steps hosted for the fused update),
and stayed so, with no patch to undo it. The patch gives a switched optimizer an instance
``__getstate__`` (trainkit._optstate.guard) that hands over, through :meth:`Switch.unswitched`,
what the unpatched optimizer would: copies of its groups and defaults with their own values, its
steps hosted for them. A shallow ``copy.copy`` so gets groups and defaults of its own (sharing the
parameters and the moments) where the unpatched one's shares the original's, on purpose:
``copy.copy`` takes the same instance ``__getstate__`` as ``pickle`` (it looks ``__copy__`` up on
the class, torch's), so it cannot be handed the live groups alone; and a copy sharing them is an
optimizer switched with no patch of its own, fused for good once the original is gone.
"""
from __future__ import annotations

import copy
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

from .._optcalls import rebind, unbind
from .._text import brief, say, user_stacklevel
from ._fused_steps import OwnValues, host_steps, hooks

_AMP = "_step_supports_amp_scaling"
_ADD = "add_param_group"
#: The hook registries of an optimizer's ``__dict__`` the switch adds to (:func:`hooks`).
_HOOKS = ("_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_post_hooks")


class Switch:
    """``fused=want`` set on ``opt``'s groups and defaults, its steps hosted for it, and what
    undoes it (:meth:`undo`). Holds ``opt`` weakly: it lives in the optimizer's patch."""

    def __init__(self, opt: Any, want: bool, set_fused: Callable[[Any, bool], None],
                 refusal: Callable[..., Optional[str]]) -> None:
        self.want = want
        self.on = True
        self.own = OwnValues(opt, want)
        self._set_fused = set_fused
        self._refusal = refusal  # fused._refusal: why torch's fused step refuses groups, if it does
        self._had = opt.__dict__.get(_AMP, None)
        self._ref = weakref.ref(opt)
        self._switch(opt)
        # What the constructor sets with fused=True: GradScaler then leaves unscaling to the kernel.
        setattr(opt, _AMP, want)
        self._handles: List[Any] = hooks(opt, self._saved, self._loaded)
        # Its own add_param_group, kept unbound (bound, held here, it was a reference cycle).
        self._add = unbind(opt.add_param_group, opt)
        self._add_attr = unbind(opt.__dict__[_ADD], opt) if _ADD in opt.__dict__ else None
        opt.__dict__[_ADD] = self.add_param_group

    def add_param_group(self, param_group: Any) -> None:
        """The optimizer's own ``add_param_group``; the group it adds takes the switch where its
        caller gave no ``fused`` (as the groups at the patch took it), and keeps as its own
        values (:meth:`OwnValues.added`) what its caller wrote."""
        given = {k: param_group[k] for k in ("fused", "foreach")
                 if isinstance(param_group, dict) and k in param_group}
        opt = self._ref()
        before = len(opt.param_groups) if opt is not None else 0
        rebind(self._add, self._ref)(param_group)
        if opt is None or not self.on:
            return
        added = opt.param_groups[before:]
        for g in added:
            self.own.added(g, given)
        if "fused" in given:  # the caller's own value: kept as given
            return
        why = self._refused(opt, added)
        if why is not None:
            self._off(opt, why, "the group added with add_param_group")
            return
        for g in added:
            if self.want and g.get("foreach"):
                g["foreach"] = False  # (the two cannot both be True), as at the patch

    def _refused(self, opt: Any, groups: List[Dict[str, Any]]) -> Optional[str]:
        """Why torch's fused step refuses ``groups`` (of ``opt``) with their own values, as at
        the patch; None where it takes them, or where the switch turns fused off."""
        if not self.want or not groups:
            return None
        own = [dict(g, fused=self.own.of(g)[0], foreach=self.own.of(g)[1]) for g in groups]
        fused, foreach = self.own.defaults
        return self._refusal(opt, own, dict(opt.defaults, fused=fused, foreach=foreach))

    def _off(self, opt: Any, why: str, what: str) -> None:
        """Switch ``opt`` back to its own values and say so: torch's fused step refuses ``what``
        (groups that arrived) for ``why``, and an optimizer it refuses at the patch is left as it
        is. The hooks stay (torch may be running them, from their registry): they pass through.

        Shown, never raised, where the warning filters make it an error (``python -W error``):
        raised out of ``add_param_group`` it said the group was not added when it was, and out
        of ``load_state_dict``'s hook it skipped the hooks after this one (a compiled step's
        state keeper, the user's own) with the checkpoint loaded."""
        self._restore(opt)
        say(
            f"trainkit: the fused=True override no longer applies to {brief(opt)}: torch's "
            f"fused step refuses {what} ({why}), so its groups run their own update from here "
            f"on, as unpatched (from here the run measures no fused update). To measure fused, "
            f"give those parameters an optimizer of their own",
            RuntimeWarning, stacklevel=user_stacklevel(past_torch=True))

    def _switch(self, opt: Any) -> None:
        self._set_fused(opt, self.want)
        host_steps(opt)  # where the switched update reads them: no per-step sync, no failure

    def _saved(self, opt: Any, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        return self.own.unswitched_state_dict(opt, state_dict) if self.on else state_dict

    def _loaded(self, opt: Any) -> None:
        if not self.on:
            return
        self.own.note(opt.param_groups)  # the checkpoint's values are the groups' own
        why = self._refused(opt, opt.param_groups)  # (its differentiable, capturable...)
        if why is not None:
            self._off(opt, why, "the groups loaded with load_state_dict")
        else:
            self._switch(opt)

    def undo(self) -> None:
        """Give every group (those added or loaded since too) and the defaults their own values,
        the steps their place, and remove the hooks (``tk.unpatch``)."""
        opt = self._ref()
        if opt is None:
            return
        for h in self._handles:
            h.remove()
        self._handles = []
        self._unwrap(opt.__dict__)
        self._restore(opt)

    def _restore(self, opt: Any) -> None:
        if not self.on:
            return
        self.on = False
        self.own.restore(opt)
        if self._had is None:
            opt.__dict__.pop(_AMP, None)
        else:
            setattr(opt, _AMP, self._had)

    def _unwrap(self, d: Dict[str, Any]) -> None:
        """Put back in ``d`` (the optimizer's ``__dict__``, or a copy's) the ``add_param_group``
        it had, where it is still ours (else what wrapped it since passes through ours)."""
        if d.get(_ADD) == self.add_param_group:
            if self._add_attr is None:
                del d[_ADD]
            else:
                d[_ADD] = rebind(self._add_attr, self._ref)

    def unswitched(self, d: Dict[str, Any]) -> Dict[str, Any]:
        """``d``, the ``__dict__`` part of the optimizer's ``__getstate__`` (a copy), as the
        unpatched optimizer hands it over: its groups and defaults copies with their own values,
        its state a copy with the steps its own mode hosts elsewhere (trainkit._optstate)."""
        self._unwrap(d)
        opt = self._ref()
        if opt is None or not self.on:
            return d
        if isinstance(d.get("param_groups"), list):
            d["param_groups"] = [self.own.unswitched_group(g) for g in d["param_groups"]]
        defaults = d.get("defaults")
        if isinstance(defaults, dict) and "fused" in defaults:
            d["defaults"] = dict(defaults, fused=self.own.defaults[0])
            if "foreach" in defaults:
                d["defaults"]["foreach"] = self.own.defaults[1]
        state = d.get("state")
        moved = self.own.moved_steps(opt)
        if moved and isinstance(state, dict):
            d["state"] = state = copy.copy(state)  # a defaultdict stays one
            for p, step in moved.items():
                if isinstance(state.get(p), dict):
                    state[p] = dict(state[p], step=step)
        # What a class whose __getstate__ returns its whole __dict__ hands over too.
        if _AMP in d:
            if self._had is None:
                del d[_AMP]
            else:
                d[_AMP] = self._had
        ours = {h.id for h in self._handles}
        for key in _HOOKS:
            if isinstance(d.get(key), dict) and ours & d[key].keys():
                d[key] = OrderedDict((k, v) for k, v in d[key].items() if k not in ours)
        return d
