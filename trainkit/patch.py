"""``tk.patch`` / ``tk.unpatch`` for optimizers (in place) and data loaders (wrapped, by
:mod:`trainkit.loader`).

A patched ``optimizer.step`` is one pipeline, each technique a stage, all meeting here:

    accumulation gate  ->  timing start  ->  core step (eager, or compiled)  ->  timing end

* the gate (``tk.accumulate``) decides whether this call really steps (``gate.should_step()``)
  and whether ``zero_grad`` is held (``gate.hold_zero_grad()``);
* the core is the optimizer's own step, or a compiled one (``tk.patch(opt, compile=True)``);
* the timers record ``update_ms``, ``closure_ms`` and, for the first optimizer that steps in a
  session, ``step_time_ms`` (wall time between consecutive real steps).

The patch only adds instance attributes (``step``, ``zero_grad``, the state; ``add_param_group``
under the fused switch), which ``Optimizer.__getstate__`` leaves out, so ``state_dict``, pickle
and ``copy.deepcopy`` see an unpatched optimizer (trainkit/_optstate.py: an instance one for a
class returning its ``__dict__``, or a switched optimizer). The new ``step`` is a bound method,
as LR schedulers (which wrap ``optimizer.step.__func__``) expect, made before or after the patch.
"""
from __future__ import annotations

import importlib
import types
import weakref
from typing import Any, Callable, Optional

from . import _optstate, timing
from ._optcalls import ZERO_GRAD_SIGNATURE, closure_of as _closure_of, ran_closure as _ran_closure, \
    first_parameter as _first_parameter, rebind, referent, run_closure as _run_closure, \
    timed_closure as _timed_closure, unbind
from ._optstep import step_function
from ._text import brief
from ._wrapped import inner_optimizer, repoint_saved_step
from .recorder import CLOSURE_MS, UPDATE_MS
from .profiling.regions import profiler_enabled, record_function

# The session module itself (``trainkit.session`` the attribute is the function ``tk.session``):
# the hot paths read ``_S._active`` instead of calling ``active()``.
_S = importlib.import_module(__package__ + ".session")

_ATTR = "_trainkit_patch"
_MISSING = object()
#: Optimizers patched in this process. While there are none (or each last stepped in another
#: session, see :func:`stepped_elsewhere`), a patched loader's batches are the session's steps:
#: an evaluation or inference loop has no optimizer of its own to count steps.
_patched: "weakref.WeakSet[Any]" = weakref.WeakSet()


class OptimizerPatch:
    """The state of one patched optimizer, kept in its ``__dict__`` under ``_trainkit_patch``."""

    def __init__(self, opt: Any) -> None:
        d = opt.__dict__
        self.saved_step = d.get("step", _MISSING)  # an instance attribute, e.g. an LR scheduler's
        self.saved_zero_grad = d.get("zero_grad", _MISSING)
        # The optimizer's own step and zero_grad, kept as functions: bound methods of it, held
        # in its own __dict__, were a reference cycle that kept it (and its state) alive after
        # the loop dropped it, until a full collection. ``orig_step`` binds on each lookup.
        self._orig_step = unbind(opt.step, opt)
        self._orig_zero_grad = unbind(opt.zero_grad, opt)
        self._core: Optional[Callable[..., Any]] = None  #: a step replacing its own (compiled)
        #: False once unpatched: a step kept from before (an LR scheduler's wrapper) falls through
        self.live = True
        #: the accumulation gate, set by ``tk.accumulate`` while its block runs.
        self.gate: Any = None
        #: the ``set_to_none`` technique's value for ``zero_grad()`` calls without arguments.
        self.set_to_none: Optional[bool] = None
        #: the arguments of the last ``zero_grad`` call the gate held
        self.held_zero_grad: Any = ((), {})
        self.compiled = False
        #: what the ``fused`` technique switched (trainkit.techniques.fused), if anything.
        self.fused_switch: Any = None
        self._cuda: Optional[bool] = None
        #: the CUDA device index of its parameters (where its step's events go), once known
        self._device: Optional[int] = None
        self._opt = weakref.ref(opt)
        #: the session this optimizer last stepped in (a weak reference), None before its first
        self.session: Any = None
        #: that session's step count right after this optimizer's last step there
        self.seen_step = 0
        self.first = _first_parameter(self._orig_step)  #: tells a closure from other arguments

    orig_step = property(lambda self: rebind(self._orig_step, self._opt))
    orig_zero_grad = property(lambda self: rebind(self._orig_zero_grad, self._opt))

    @property
    def core(self) -> Callable[..., Any]:
        """The step that updates the parameters: its own, or a compiled one."""
        return self.orig_step if self._core is None else self._core

    @core.setter
    def core(self, fn: Callable[..., Any]) -> None:
        own = self._orig_step
        self._core = None if own[1] and getattr(fn, "__func__", None) is own[0] else fn

    def patched(self) -> bool:
        """Whether its optimizer is alive and still patched by this patch."""
        opt = self._opt()
        return opt is not None and opt.__dict__.get(_ATTR) is self

    def cuda(self) -> bool:
        if self._cuda is not None:
            return self._cuda
        # Decided at the first step: the parameters are on their device by then.
        opt = self._opt()
        params = [p for g in opt.param_groups for p in g["params"]] if opt is not None else []
        self._cuda = bool(params) and params[0].is_cuda and timing.cuda_in_use()
        if self._cuda:
            self._device = params[0].get_device()
        return self._cuda

    def step(self, *args: Any, **kwargs: Any) -> Any:
        s = _S._active
        if s is not None and (s._batches_are_steps or s._batch_pending):
            s.optimizer_steps_from_here()  # also for an optimizer patched inside the loop
        gate = self.gate
        if gate is not None:
            closure = _closure_of(args, kwargs, self.first)
            if closure is None:
                if not gate.should_step():
                    return None  # inside an accumulation window: gradients keep adding up
            else:
                # Each step(closure) call is a micro-batch, and the closure its forward and
                # backward: it runs here, before the gate decides, so a window's last
                # micro-batch is in the sum the gate divides; a real step gets its loss back.
                loss = _run_closure(closure, s)
                if not gate.should_step():
                    return loss
                ran = _ran_closure(closure, loss)
                if "closure" in kwargs:
                    kwargs["closure"] = ran
                else:
                    args = (ran,) + args[1:]
        if s is None:
            return self.core(*args, **kwargs)
        here = self.session is not None and self.session() is s
        if not here:
            self.session = weakref.ref(s)
        # The session's step count at this optimizer's last step here (None: none here yet).
        seen = self.seen_step if here else None
        closure_ms = [0.0]
        closure = _closure_of(args, kwargs, self.first)
        if closure is not None:
            timed = _timed_closure(closure, closure_ms)
            if "closure" in kwargs:
                kwargs["closure"] = timed
            else:
                args = (timed,) + args[1:]
        gpu = self.cuda()
        device = self._device
        ev0 = timing.cuda_event(device) if gpu and closure is None else None
        t0 = timing.now()
        if profiler_enabled():  # name the step in traces; the unprofiled path stays bare
            with record_function("trainkit/optimizer_step"):
                out = self.core(*args, **kwargs)
        else:
            out = self.core(*args, **kwargs)
        t1 = timing.now()
        first = s._primary
        if first is None or (first is not self and (
                seen == s.step or not first.patched() or s._batch_step == s.step)):
            # The first to step makes the steps; another takes over once that one is unpatched,
            # or (a new optimizer for a second phase, while the old one is still alive) once it
            # steps with no step of the first since the patched loader's last batch, or twice
            # here with no step of the first in between. A GAN's second optimizer steps after
            # the first one ended the batch's step.
            s._primary = first = self
        primary = first is self
        if not primary:
            self.seen_step = s.step
        # A second optimizer (a GAN's) adds its update time to a step, and makes none. It steps
        # after the first one in an iteration: its time belongs to the step of the batch it
        # trained on (a patched loader's), else to the step the first optimizer just ended.
        step = s.step if primary else (s._batch_step if s._batch_step is not None
                                       else max(s.step - 1, 1))
        buf = s._buf
        if gpu and primary:
            s._cuda_device = device  # the steps' device: the loader's and regions' events go there
        if ev0 is not None:
            end: Any = timing.cuda_event(device)
            # a step's end is the next step's start: that step's interval gives it back
            buf.append((UPDATE_MS, step, timing.PendingInterval(ev0, end, release_end=not primary)))
        else:
            end = timing.cuda_event(device) if gpu and primary else t1
            buf.append((UPDATE_MS, step, (t1 - t0) * 1e3 - closure_ms[0]))
        if closure is not None:
            buf.append((CLOSURE_MS, step, closure_ms[0]))
        if primary:
            s.step_done(end)
            self.seen_step = s.step
        return out

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        gate = self.gate
        if gate is not None and gate.hold_zero_grad():
            self.held_zero_grad = (args, kwargs)
            return None  # inside an accumulation window: keep the gradients
        return self.orig_zero_grad(*args, **self.zero_grad_kwargs(args, kwargs))

    def zero_grad_kwargs(self, args: Any, kwargs: Any) -> Any:
        """``kwargs`` with the ``set_to_none`` technique's value when the call gives none."""
        if self.set_to_none is not None and not args and "set_to_none" not in kwargs:
            return dict(kwargs, set_to_none=self.set_to_none)
        return kwargs


def stepped_elsewhere(s: Any) -> bool:
    """Whether every patched optimizer last stepped in a session other than ``s`` (and so far
    none in ``s``): then ``s`` looks like an evaluation, and its loader's batches its steps.

    The writer thread asks too (:meth:`StepCounter._steps_coming`), while the training thread
    may patch and unpatch: it reads a copy of the set (a C copy, which no other thread changes
    midway), and an optimizer unpatched or freed since is left out."""
    try:
        refs = _patched.data.copy()
    except RuntimeError:  # changed meanwhile: an optimizer patched or freed just now
        return False
    for ref in refs:
        opt = ref()
        p = optimizer_patch(opt) if opt is not None else None
        if p is None:
            continue
        last = p.session
        if last is None or last() is s:
            return False
    return True


def _patched_zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
    p = self.__dict__.get(_ATTR)
    if p is None:
        opt = referent(self)
        return type(opt).zero_grad(opt, *args, **kwargs)
    return p.zero_grad(*args, **kwargs)


_patched_zero_grad.__signature__ = ZERO_GRAD_SIGNATURE  # type: ignore[attr-defined]


def wrap_zero_grad(opt: Any) -> None:
    """Route ``opt.zero_grad`` through its patch (the accumulation gate, ``set_to_none``).

    Done only when something needs it: a wrapper on every ``zero_grad()`` is a cost per step.
    """
    current = opt.__dict__.get("zero_grad")
    if getattr(current, "__func__", None) is not _patched_zero_grad:
        opt.zero_grad = types.MethodType(_patched_zero_grad, weakref.proxy(opt))  # no cycle


def optimizer_patch(opt: Any) -> Optional[OptimizerPatch]:
    """The patch state of ``opt``, or None when it is not patched."""
    return opt.__dict__.get(_ATTR) if hasattr(opt, "__dict__") else None


def _patch_optimizer(opt: Any, *, compile: bool, mode: Optional[str] = None,
                     fullgraph: bool = False) -> Any:
    p = optimizer_patch(opt)
    fresh = p is None
    if fresh:
        from .switches import check_overrides

        check_overrides()  # a malformed TRAINKIT_TECHNIQUES fails here, before the patch
        p = OptimizerPatch(opt)  # reads the optimizer, changes nothing
    core = None
    if compile and not p.compiled:  # before any change: a torch that cannot compile raises here
        from .techniques.compiled_step import compile_core

        core = compile_core(opt, p.orig_step, mode=mode, fullgraph=fullgraph)
    if fresh:
        opt.__dict__[_ATTR] = p
        # Bound to a weak proxy: a bound method in its own __dict__ would keep it alive.
        opt.step = types.MethodType(step_function(p), weakref.proxy(opt))
        _patched.add(opt)
        # Technique switches acting at the patch (trainkit.techniques.fused; set_to_none).
        from .switches import technique
        from .techniques import fused

        p.set_to_none = bool(technique("set_to_none", True))
        if not p.set_to_none:  # True is zero_grad's own default: nothing to wrap for it
            wrap_zero_grad(opt)
        p.fused_switch = fused.apply(opt)
        if p.fused_switch is not None or _optstate.leaks(opt, _ATTR):  # neither reaches a copy
            _optstate.guard(opt, lambda d, p=p: _unpatched_state(p, d))
    if core is not None:
        p.core = core
        p.compiled = True
    return opt


def _unpatch_optimizer(opt: Any) -> Any:
    p = opt.__dict__.get(_ATTR)
    if p is None:
        return opt
    if p.gate is not None:  # unpatched, its step would step every micro-batch, undivided
        raise ValueError(f"unpatch({brief(opt)}) inside tk.accumulate(...) on it: the block "
                         f"holds its window's gradients and steps it every n-th call through "
                         f"the patch; unpatch after the block, e.g. with tk.accumulate(4, opt): "
                         f"... then tk.unpatch(opt)")
    del opt.__dict__[_ATTR]
    p.live = False
    _restore_methods(opt.__dict__, p)
    _optstate.unguard(opt)
    _patched.discard(opt)
    if p.fused_switch is not None:
        p.fused_switch.undo()
    compiled = getattr(p.core, "trainkit_compiled", None)
    if compiled is not None:  # its load_state_dict hooks (techniques._state_keeper)
        compiled.release(opt)
    return opt


def _restore_methods(d: dict, p: OptimizerPatch) -> None:
    """Put back in ``d`` (an optimizer's ``__dict__``, or a copy of it) the ``step`` and
    ``zero_grad`` it had before the patch ``p``, where they are still the patch's own."""
    for name, saved in (("step", p.saved_step), ("zero_grad", p.saved_zero_grad)):
        current = getattr(d.get(name), "__func__", None)
        ours = current is _patched_zero_grad or getattr(current, "__wrapped_step__", False)
        if ours:  # else an LR scheduler created since wraps us, and our step falls through
            if saved is _MISSING:
                del d[name]
            else:
                d[name] = saved


def _unpatched_state(p: OptimizerPatch, d: dict) -> dict:
    """``d``, the ``__dict__`` part of a copy of the optimizer patched by ``p``, as it would be
    unpatched: what its instance ``__getstate__`` hands to ``pickle`` and ``copy``
    (trainkit._optstate), its ``fused`` switch left out too (techniques._fused_switch)."""
    d.pop(_ATTR, None)
    _restore_methods(d, p)
    return d if p.fused_switch is None else p.fused_switch.unswitched(d)


def patch(obj: Any, *, compile: bool = False) -> Any:
    """Instrument an optimizer (in place) or a data loader (returns a wrapping iterable).

    An optimizer: every real ``step()`` is timed and counted (``trainkit/step_time_ms``,
    ``trainkit/update_ms``, ``trainkit/closure_ms``); ``compile=True`` runs its step under
    ``torch.compile`` without recompiles under LR schedulers. Idempotent. A loader (any iterable):
    ``trainkit/data_wait_ms`` and items per batch, hence ``trainkit/samples_per_s``.

    Example::

        tk.patch(optimizer)
        loader = tk.patch(loader)
    """
    import torch

    from ._loader_kinds import check_loader, refuse_optimizers_in_a_sequence, wrap
    from .loader import PatchedLoader

    if not isinstance(compile, bool):
        raise TypeError(f"patch(..., compile={compile!r}): compile must be True or False, e.g. "
                        f"tk.patch(optimizer, compile=True)")
    if isinstance(obj, torch.optim.Optimizer):
        inner = inner_optimizer(obj)  # accelerate's wrapper: its calls are not all steps
        if inner is not None:
            _patch_optimizer(inner, compile=compile)
            repoint_saved_step(obj, inner)
            return obj
        return _patch_optimizer(obj, compile=compile)
    if isinstance(obj, PatchedLoader):
        return obj
    # A GAN's pair, tk.patch([opt_g, opt_d]): iterable, so it became a "loader" of optimizers,
    # and neither optimizer was patched (no step counted, nothing said).
    refuse_optimizers_in_a_sequence(obj, "patch")
    check_loader(obj)
    if compile:
        raise TypeError("patch(loader, compile=True): compile applies to optimizers only, "
                        "e.g. tk.patch(optimizer, compile=True)")
    from .techniques.loader_options import rebuild  # pin_memory / num_workers overrides

    source = rebuild(obj)
    return wrap(source, obj)


def unpatch(obj: Any) -> Any:
    """Undo :func:`patch`: the optimizer is restored in place; a loader's original is returned.

    One never patched is returned as it is; what ``patch`` refuses (an int, None) raises TypeError.

    Example::

        tk.unpatch(optimizer); loader = tk.unpatch(loader)
    """
    from ._loader_kinds import check_unpatchable, refuse_optimizers_in_a_sequence
    from .loader import PatchedLoader

    if isinstance(obj, PatchedLoader):
        return obj.original
    refuse_optimizers_in_a_sequence(obj, "unpatch")  # it returned the list, each still patched
    if hasattr(obj, "__dict__") and _ATTR in obj.__dict__:
        return _unpatch_optimizer(obj)
    inner = inner_optimizer(obj)
    if inner is not None and _ATTR in inner.__dict__:
        _unpatch_optimizer(inner)
        repoint_saved_step(obj, inner)
        return obj
    check_unpatchable(obj)  # 3, None, a str: a mistake; an optimizer or iterable: a no-op
    return obj
