"""``tk.compiled_step``: the optimizer step under ``torch.compile``, without recompiles.

Raw ``torch.compile(opt.step)`` guards every Python float in ``param_groups`` as a constant, so
each time an LR scheduler writes a new ``lr`` (or OneCycleLR new ``betas``) dynamo recompiles,
until it reaches ``torch._dynamo.config.recompile_limit`` and silently runs the step eagerly.
PyTorch's recipe is a tensor ``lr``; but schedulers write Python floats back
(ReduceLROnPlateau: ``group["lr"] = new_lr``), and users and ``state_dict`` expect floats.

So around every compiled call, the scheduled hyper-parameters (``lr``; ``betas`` of Adam/AdamW)
are copied into persistent tensors with ``fill_`` (outside the graph: no guard sees the value),
the tensors are put into ``param_groups`` for the call, and the Python values are put back
afterwards: schedulers, ``state_dict`` and the user see exactly what they would without us.
Compile time and recompiles are recorded (``trainkit/compile/seconds``,
``trainkit/compile/recompiles``; the steps that compiled also count it in their step and update
times, which are wall time), and a recompile after warm-up gets one warning naming the guard that
failed.
"""
from __future__ import annotations

import functools
import logging
import sys
import time
import warnings
import weakref
from typing import Any, Callable, Dict, List, Literal, Optional, Tuple, overload

from ..session import active as _active_session  # the module name is rebound by __init__
from .._text import brief, show_instead, show_over, user_stacklevel
from .._optcalls import gone, rebind, unbind, uncounted
from ..recorder import COMPILE_RECOMPILES, COMPILE_SECONDS
from ._capturable import Held, dynamo_sets_capturable, put_back as put_back_capturable, turn_on
from ._compiled_optimizer import compile_optimizer
from ._dynamo_marks import QUIET, dynamo_marks, latest_guard_failure
from ._hyper import HyperTensors, Saved, last_lr_floats
from ._step_optimizers import referenced_optimizers, referenced_schedulers
from ._state_keeper import keep_state_tensors, release_state_tensors
from ._zero_lr import held_at_zero_lr, put_back

Mode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
#: Calls that may compile without a warning: the first step creates the optimizer's state,
#: which changes what dynamo guards on, so the second call may legitimately compile again.
WARMUP_CALLS = 2
_FALLBACK_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


# -- validation ------------------------------------------------------------------------------------
def _allowed_modes() -> Tuple[str, ...]:
    try:
        from torch._inductor import list_mode_options

        return tuple(list_mode_options())
    except Exception:  # a torch whose inductor lacks the helper
        return _FALLBACK_MODES


def _check_options(mode: Any, fullgraph: Any) -> None:
    if mode is not None:
        allowed = _allowed_modes()
        if not isinstance(mode, str) or mode not in allowed:
            raise ValueError(f"compiled_step(mode={mode!r}): mode must be None or one of "
                             f"{', '.join(repr(m) for m in allowed)} (torch.compile's modes), "
                             f"e.g. @tk.compiled_step(mode='max-autotune-no-cudagraphs')")
    if not isinstance(fullgraph, bool):
        raise TypeError(f"compiled_step(fullgraph={fullgraph!r}): fullgraph must be True or False, "
                        f"e.g. @tk.compiled_step(fullgraph=True)")


class _Compiled:
    """A compiled callable plus the hyper-parameter swap, compile timing and recompile watch."""

    def __init__(self, fn: Callable[..., Any], optimizers: Callable[[], List[Any]], *,
                 mode: Optional[str], fullgraph: bool, name: str) -> None:
        import torch

        for where in ("ctx_manager", "torch"):  # its logger (torch <= 2.6: ...variables.torch)
            logging.getLogger("torch._dynamo.variables." + where).addFilter(QUIET)  # a set
        self.compiled = torch.compile(fn, mode=mode, fullgraph=fullgraph)
        self.mode, self.fullgraph = mode, fullgraph  # a second compiled_step(opt)'s check
        self.fn = fn  # run as it is where torch's compiled step would be wrong (_hyper)
        self.eager = False
        #: torch < 2.4: capturable set for each call and put back after it (_capturable)
        self.sets_capturable = dynamo_sets_capturable()
        self.optimizers = optimizers
        self.name = name
        self.calls = 0
        self.recompiles = 0
        self.compile_seconds = 0.0
        self.warned = False
        self._hyper: Dict[int, HyperTensors] = {}

    def _hyper_for(self, opt: Any) -> HyperTensors:
        h = self._hyper.get(id(opt))
        if h is None or h.opt is not opt:
            h = self._hyper[id(opt)] = HyperTensors(opt)
            keep_state_tensors(opt)
        return h

    def release(self, opt: Any) -> None:
        """Forget ``opt`` (``tk.unpatch``): what this step changed on it for compiling is undone."""
        h = self._hyper.pop(id(opt), None)
        if h is not None and h.opt is opt:
            release_state_tensors(opt)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(self.optimizers(args, kwargs), args, kwargs)

    def run(self, opts: List[Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """The call, with ``opts`` the optimizers it steps (found by the caller already)."""
        saved: List[Saved] = []
        frames0, fails0 = dynamo_marks()
        t0 = time.perf_counter()
        expected = False
        held: List[Tuple[Any, Any]] = []  # Adam/AdamW at lr 0: what NaN the step leaves (_zero_lr)
        capturable: Held = []  # torch < 2.4: the user's capturable, set for the call (_capturable)
        raised: Optional[BaseException] = None
        ran = False  # the step was called: a call refused before it (-W error) is no call
        try:
            for opt in opts:
                held.extend(held_at_zero_lr(opt))
                hyper = self._hyper_for(opt)
                if self.sets_capturable:  # before swap_in: its tensor-or-float choice reads it
                    turn_on(opt, capturable)
                saved.extend(hyper.swap_in())
                expected = expected or hyper.expect_compile
                if hyper.needs_eager and not self.eager:
                    self._go_eager()  # raised (-W error): before the step, nothing changed
            if self.eager:  # with the Python values: as an uncompiled step, bit for bit
                HyperTensors.restore(saved)
                if capturable:
                    put_back_capturable(capturable)
                saved = []
            ran = True
            out = (self.fn if self.eager else self.compiled)(*args, **kwargs)
            put_back(held)
            return out
        except BaseException as exc:
            raised = exc
            raise
        finally:
            if capturable:  # (empty on torch >= 2.4: no call)
                put_back_capturable(capturable)
            lr_set = HyperTensors.restore(saved)
            if lr_set:  # an LR scheduler stepped in the call: its _last_lr in floats too
                last_lr_floats(referenced_schedulers(self.fn, args, kwargs, opts), lr_set)
            self.calls += ran
            frames1, fails1 = dynamo_marks()
            if frames1 != frames0:  # this call compiled: its time is compile time, not step time
                try:
                    self._compiled(time.perf_counter() - t0, fails1 > fails0, fails0,
                                   expected=expected)
                except Warning as said:  # -W error: said after the call's update was taken
                    if raised is not None:  # raised, it took the place of the call's own error
                        show_over(said, raised, sys._getframe(user_stacklevel(past_torch=True) - 1))
                    else:  # raised, the call failed with its update taken, its step uncounted
                        show_instead(said, sys._getframe(user_stacklevel(past_torch=True) - 1),
                                     "the step it reports on was taken")
            raised = None  # its traceback holds this frame: kept, a cycle kept it all till a GC

    def _go_eager(self) -> None:
        """Run the step eagerly from this call on, and say so. Said first: where the warning
        filters make it an error (``python -W error``) it is raised before the step, with nothing
        changed (the step not taken, the next call asks again), as torch raises before a step.
        Switched first, the call raised with its update not taken, and every later call ran
        eagerly without a word."""
        import torch

        warnings.warn(
            f"trainkit.compiled_step({self.name}): an LR scheduler moves the momentum of this "
            f"nesterov SGD (OneCycleLR, or CyclicLR with cycle_momentum=True), and torch's "
            f"compiled SGD step then reuses a stale momentum (pytorch/pytorch#194976; torch "
            f"{torch.__version__}): the step runs eagerly from here, equal to an "
            f"uncompiled one. To keep it compiled: SGD(..., foreach=True), or "
            f"OneCycleLR(..., cycle_momentum=False)", RuntimeWarning,
            stacklevel=user_stacklevel(past_torch=True))  # past a scheduler's step wrapper
        self.eager = True

    def _compiled(self, seconds: float, recompiled: bool, fails0: int, *,
                  expected: bool = False) -> None:
        self.compile_seconds += seconds
        # Warm-up compiles, and the one compile of switching moving betas to tensors, are
        # expected: only other recompiles cost a healthy run.
        late = self.calls > WARMUP_CALLS and not expected
        if recompiled and late:  # warm-up compiles are expected: only these cost a healthy run
            self.recompiles += 1
        s = _active_session()
        if s is not None:
            s.record(COMPILE_SECONDS, seconds)
            s.record(COMPILE_RECOMPILES, float(self.recompiles))
        if recompiled and late and not self.warned:
            self.warned = True
            guard = latest_guard_failure(fails0)
            warnings.warn(
                f"trainkit.compiled_step({self.name}): torch.compile recompiled the optimizer step "
                f"at call {self.calls}, after warm-up; the guard that failed: {guard}. Each "
                f"recompile costs seconds and after torch._dynamo.config.recompile_limit the step "
                f"silently runs eagerly. Fix: keep the value that guard names constant between "
                f"steps, or make it a tensor when you create the optimizer (e.g. "
                f"lr=torch.tensor(0.01)); trainkit holds lr and Adam/AdamW betas as tensors "
                f"itself. torch._logging.set_logs(recompiles=True) shows every recompile.",
                RuntimeWarning, stacklevel=user_stacklevel(past_torch=True))


# -- public ------------------------------------------------------------------------------------------
def compile_core(opt: Any, step: Callable[..., Any], *, mode: Optional[str] = None,
                 fullgraph: bool = False) -> Callable[..., Any]:
    """The core step of a patched optimizer: ``step`` compiled, or ``step`` when compile is off.

    A call with a closure (LBFGS, ``step(closure)``) runs eagerly: dynamo cannot keep the
    closure's forward/backward and the update in one graph, and results must equal eager.
    """
    from ..switches import technique

    _check_options(mode, fullgraph)
    if not technique("compile", True):
        return step
    inner, count = uncounted(opt, step)  # an older torch's LR scheduler count, kept out of it
    # Nothing here holds the optimizer: this core lives in its patch, and a reference to it (the
    # bound step compiled, the step kept for closures) was a cycle that kept the optimizer and
    # its state (Adam's moments, on the GPU) past `del optimizer` until the cyclic collector ran.
    # So the step's function is compiled and given the optimizer at each call (dynamo keeps no
    # reference to the arguments of the frames it compiles).
    ref = weakref.ref(opt)
    eager = unbind(step, opt)  # for a call with a closure
    func, with_opt = unbind(inner, opt)
    compiled = _Compiled(func, lambda *_: [o for o in (ref(),) if o is not None], mode=mode,
                         fullgraph=fullgraph, name=type(opt).__name__)

    def core(*args: Any, **kwargs: Any) -> Any:
        # step(None) is no closure: accelerate's wrapper passes its own on, None or not, and
        # every step through it ran eagerly, compiled in name only.
        if (len(args) == 1 and args[0] is None and not kwargs) or (
                not args and list(kwargs.items()) == [("closure", None)]):
            args, kwargs = (), {}
        if args or kwargs:
            return rebind(eager, ref)(*args, **kwargs)
        if count is not None:
            count()
        if not with_opt:
            return compiled()
        o = ref()
        return compiled(o) if o is not None else gone(func)

    core.trainkit_compiled = compiled  # type: ignore[attr-defined]
    return core


def _decorate(fn: Callable[..., Any], *, mode: Optional[str], fullgraph: bool) -> Callable[..., Any]:
    from ..patch import optimizer_patch
    from ..switches import technique

    if not technique("compile", True):
        return fn
    # Looked up at each call, by the wrapper (cheap: a few dict reads): the optimizer may be
    # created, or reassigned, after the function is decorated, or come with the call.
    compiled = _Compiled(fn, functools.partial(referenced_optimizers, fn), mode=mode,
                         fullgraph=fullgraph, name=getattr(fn, "__qualname__", repr(fn)))
    #: optimizer -> its own step compiled, for calls inside tk.accumulate (made at the first)
    own_cores: "weakref.WeakKeyDictionary[Any, Callable[..., Any]]" = weakref.WeakKeyDictionary()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        through: List[Any] = []  # optimizers stepped through accelerate's wrapper
        opts = referenced_optimizers(fn, args, kwargs, through)  # once a call: run() gets them
        patches = [(o, p) for o in opts if (p := optimizer_patch(o)) is not None]
        if not patches:
            return compiled.run(opts, args, kwargs)
        if any(p.gate is not None or any(o is t for t in through) for o, p in patches):
            # Inside tk.accumulate the function may run a micro-batch's forward and backward
            # too: they must run at every call, and before the gate divides (and clips) the
            # window's gradients at its last one, so no one graph can hold them with the update.
            # Through accelerate's wrapper, a call steps the optimizer at real steps only: run
            # as one patched step, each call counted as one (each micro-batch).
            # The function runs as it is, its optimizers' steps gated, each real step compiled.
            cores = [p.core for _o, p in patches]
            for o, p in patches:
                if not p.compiled:
                    core = own_cores.get(o)
                    if core is None:
                        core = own_cores[o] = compile_core(o, p.orig_step, mode=mode,
                                                           fullgraph=fullgraph)
                    p.core = core
            try:
                return fn(*args, **kwargs)
            finally:
                for (_o, p), core in zip(patches, cores):
                    p.core = core
        # A patched optimizer's gate and timers stay outside the graph: the first patched
        # optimizer's pipeline runs the whole compiled function as its core, and inside it every
        # patched optimizer's step is its own step (the same object each call: no guard fails).
        opt0, p0 = patches[0]
        saved_core = p0.core

        def core(*_a: Any, **_k: Any) -> Any:
            before = [o.__dict__.get("step") for o, _p in patches]  # ours, or a scheduler's wrapper
            for o, p in patches:
                o.__dict__["step"] = p.orig_step
            try:
                return compiled.run(opts, args, kwargs)
            finally:
                for (o, _p), prev in zip(patches, before):
                    o.__dict__["step"] = prev

        p0.core = core
        try:
            return p0.step()
        finally:
            p0.core = saved_core

    wrapper.trainkit_compiled = compiled  # type: ignore[attr-defined]
    return wrapper


@overload
def compiled_step(target: Callable[..., Any], *, mode: Optional[Mode] = None,
                  fullgraph: bool = False) -> Callable[..., Any]: ...
@overload
def compiled_step(target: None = None, *, mode: Optional[Mode] = None,
                  fullgraph: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def compiled_step(target: Any = None, *, mode: Optional[Mode] = None,
                  fullgraph: bool = False) -> Any:
    """Run an optimizer step under ``torch.compile`` with no recompiles under LR schedulers.

    Three forms: ``@tk.compiled_step`` or ``@tk.compiled_step(mode=..., fullgraph=...)`` on a
    function that steps the optimizer(s) it names (globals, closure cells or default
    arguments); and ``tk.compiled_step(optimizer)``, which compiles that optimizer's own step in
    place (the same as ``tk.patch(optimizer, compile=True)``: of accelerate's wrapper, the
    optimizer it wraps, :mod:`._compiled_optimizer`) and returns the optimizer; asked
    again with the same options it returns it as it is, with other ``mode``/``fullgraph`` it
    raises ValueError (``tk.unpatch(optimizer)`` first to compile it again).

    ``lr`` and Adam/AdamW ``betas`` are handed to the compiled code as tensors refreshed before
    each call, so schedulers (LinearLR, OneCycleLR, ReduceLROnPlateau...) cause no recompile;
    ``param_groups`` hold the Python values between calls. Compile time and recompiles are
    recorded as ``trainkit/compile/seconds`` and ``trainkit/compile/recompiles``. With
    ``tk.technique("compile")`` switched off it returns the function (or optimizer) as it is.
    Inside ``tk.accumulate`` a decorated function runs as it is at every micro-batch (it may hold
    the forward and backward too, which must run before the window's gradients are divided),
    and each optimizer's real step is compiled on its own.

    Args:
        target: the step function, or an optimizer, or None (decorator with options).
        mode: ``torch.compile``'s mode: None, ``"default"``, ``"reduce-overhead"``,
            ``"max-autotune"`` or ``"max-autotune-no-cudagraphs"``.
        fullgraph: as in ``torch.compile``: raise on a graph break instead of splitting.

    Example::

        @tk.compiled_step
        def step():
            opt.step()

        for x, y in loader:
            loss_fn(model(x), y).backward(); step(); sched.step(); opt.zero_grad()
    """
    import torch

    _check_options(mode, fullgraph)
    if isinstance(target, torch.optim.Optimizer):  # (or accelerate's wrapper of one)
        return compile_optimizer(target, mode, fullgraph)
    if target is None:
        return functools.partial(_decorate_checked, mode=mode, fullgraph=fullgraph)
    return _decorate_checked(target, mode=mode, fullgraph=fullgraph)


def _decorate_checked(fn: Any, *, mode: Optional[str], fullgraph: bool) -> Callable[..., Any]:
    import torch

    if isinstance(fn, torch.nn.Module):
        # Callable, so it was taken for a step function: a plain function came back, which
        # compiled the forward (its compile time filed as the optimizer step's), and
        # `model = tk.compiled_step(model)` failed later at model.parameters().
        raise TypeError(f"compiled_step({type(fn).__name__}(...)): this is a model (nn.Module); "
                        f"compiled_step compiles an optimizer's step. Compile the model with "
                        f"torch.compile(model), and the step with tk.compiled_step(optimizer) "
                        f"or @tk.compiled_step on `def step(): opt.step()`")
    if not callable(fn) or isinstance(fn, type):
        raise TypeError(f"compiled_step({brief(fn)}): expected a function that steps the optimizer "
                        f"or a torch.optim.Optimizer; e.g. @tk.compiled_step on `def step(): "
                        f"opt.step()`, or tk.compiled_step(optimizer)")
    return _decorate(fn, mode=mode, fullgraph=fullgraph)
