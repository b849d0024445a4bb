"""Where a file zeroes an optimizer's gradients, and which calls might do it unseen (TK113, TK114).

TK114 reports an optimizer whose gradients nothing zeroes, so it must see every way of zeroing
and stay quiet when one might be hidden. :func:`zeroed_in_file` finds, anywhere in the file
(nested functions, closures, hooks and helpers included): ``x.zero_grad(...)`` or a mention of
``x.zero_grad`` (passed as a callback), a store to or ``del`` of ``p.grad`` (``None`` or a new
tensor: either replaces what backward left), ``p.grad.zero_()`` (``fill_``, ``mul_``, ``copy_``,
``set_``, ``detach_``), ``torch._foreach_zero_``, a ``set_to_none`` keyword, ``setattr(p, "grad",
...)``, or a call named for it (``zero_grads(model)``, ``set_grads_to_none(...)``). Each counts
for the optimizer unless it surely zeroes another one's gradients (:func:`zeroes_other`).

:func:`may_zero` says whether a call of a training loop's iteration might zero gradients where
the linter cannot see: a name that speaks of zeroing or gradients, a method of the optimizer other
than the known ones, or a function of another module (or of this file's, read one level at a time,
three at most) handed the optimizer, its model, or what holds them.
"""
from __future__ import annotations

import ast
import re
from typing import FrozenSet, Iterable, List, Optional, Set, Tuple

from trainkit.lint._accumulating import is_grad
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, method_name, own_nodes, receiver
from trainkit.lint._step_bodies import functions_of

# In-place methods that overwrite a gradient: `p.grad.zero_()`, `p.grad.data.fill_(0)`, `p.grad.copy_(g)`.
_OVERWRITES = frozenset({"zero_", "fill_", "mul_", "copy_", "set_", "detach_"})
# A helper named for zeroing: `zero_grads(model)`, `set_grads_to_none`, `clear_grad`, `reset_gradients`.
_ZEROING_NAME = re.compile(r"zero(?!s)|(none|clear|reset|free|wipe|drop).*grad|grad.*(none|clear|reset|free|wipe|drop)",
                           re.IGNORECASE)
# torch's own functions whose name says "grad" but that leave the gradients alone.
_GRAD_NAMES_KEPT = frozenset({
    "clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "no_grad", "enable_grad", "set_grad_enabled",
    "is_grad_enabled", "requires_grad_", "inference_mode", "get_grad_norm", "grad_norm", "grad"})
# Builtins, and methods, that never zero a gradient whatever they are given.
_BUILTINS = frozenset({
    "print", "len", "isinstance", "hasattr", "getattr", "range", "enumerate", "zip", "float", "int", "str",
    "bool", "list", "tuple", "dict", "set", "sum", "min", "max", "abs", "round", "sorted", "any", "all", "id",
    "type", "next", "iter", "repr", "format"})
_METHODS = frozenset({
    "step", "backward", "item", "detach", "to", "cuda", "cpu", "train", "eval", "parameters", "named_parameters",
    "modules", "named_modules", "children", "state_dict", "load_state_dict", "size", "numel", "unscale_", "update",
    "get_scale", "scale", "log", "info", "debug", "warning", "add_scalar", "add_scalars", "set_postfix",
    "set_description", "write", "append", "extend", "half", "float", "double", "get_lr", "get_last_lr",
    "clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "add_param_group", "tolist", "numpy", "mean", "format"})
# Modules whose functions zero nothing unless named for it (checked first).
_KNOWN_MODULES = ("torch.", "trainkit.", "numpy.", "math.", "time.", "logging.", "random.")


def _name_of(call: ast.Call) -> str:
    """The called function's own name: ``f`` for ``f(...)``, ``m`` for ``x.m(...)``, else ``""``."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _named_for_zeroing(name: str) -> bool:
    """``zero_grad``, ``zero_grads``, ``set_to_none_grads``, ``_foreach_zero_``: not ``zeros_like``."""
    if name in _GRAD_NAMES_KEPT:
        return False
    return bool(_ZEROING_NAME.search(name))


def _grad_owner(ctx: FileContext, node: ast.AST, target: ast.expr) -> Optional[str]:
    """``model`` for ``p.grad ...`` in ``for p in model.parameters():``; None when unknown."""
    root = target.value  # type: ignore[attr-defined]
    for parent in ctx.ancestors(node):
        if isinstance(parent, (ast.For, ast.AsyncFor)) and isinstance(parent.target, ast.Name) \
                and isinstance(root, ast.Name) and parent.target.id == root.id:
            it = parent.iter
            return receiver(it) if isinstance(it, ast.Call) and method_name(it) == "parameters" else None
    return None


def zeroings(ctx: FileContext) -> List[Tuple[ast.AST, Optional[str]]]:
    """Every place the file zeroes (or replaces) gradients, as ``(node, owner)``: ``owner`` is whose
    gradients (``x`` of ``x.zero_grad()``, ``model`` of a ``p.grad`` over ``model.parameters()``), or
    None when unknown. Cached on the file."""
    cached = ctx.__dict__.get("_zeroings")
    if cached is not None:
        return cached
    out: List[Tuple[ast.AST, Optional[str]]] = []
    for node in ctx.nodes:
        if isinstance(node, ast.Attribute) and node.attr == "zero_grad":
            out.append((node, dotted(node.value)))  # a call or a callback: `hooks.append(opt.zero_grad)`
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if is_grad(target) and not isinstance(node, ast.AugAssign):
                    out.append((node, _grad_owner(ctx, node, target if target.attr == "grad" else target.value)))
        elif isinstance(node, ast.Call):
            name = _name_of(node)
            if isinstance(node.func, ast.Attribute) and name in _OVERWRITES and is_grad(node.func.value):
                out.append((node, None))
            elif name != "zero_grad" and _named_for_zeroing(name):
                out.append((node, None))
            elif name == "setattr" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value == "grad":
                out.append((node, None))
            elif any(k.arg == "set_to_none" for k in node.keywords):
                out.append((node, receiver(node)))
    ctx.__dict__["_zeroings"] = out
    return out


def zeroes_other(ctx: FileContext, owner: Optional[str], optimizer: str, others: Iterable[str]) -> bool:
    """Whether zeroing ``owner``'s gradients surely leaves ``optimizer``'s alone: ``owner`` is one of
    ``others`` (optimizers stepped beside it, so surely other objects), or a model whose parameters the
    file hands only to other optimizers (a GAN's other half). An optimizer named differently but not
    stepped beside it may be an alias (``opt = self.optimizer``) and counts."""
    if owner is None or owner == optimizer:
        return False
    if owner in others:
        return True
    if ctx.is_optimizer(owner):
        return False
    return ctx.zeroes_only_others(owner, optimizer)


def zeroed_in_file(ctx: FileContext, optimizer: str, others: Iterable[str]) -> bool:
    """Whether anything in the file may zero ``optimizer``'s gradients (see the module)."""
    others = frozenset(others) - {optimizer}
    return any(not zeroes_other(ctx, owner, optimizer, others) for _, owner in zeroings(ctx))


def related_names(ctx: FileContext, loop: TrainingLoop, optimizer: str) -> FrozenSet[str]:
    """The names a call may reach ``optimizer``'s gradients through: the optimizer, the models built
    into it (when none is known: every name whose ``.parameters()`` the file reads, and what the loop
    calls as a model, ``model(x)``), and the first part of each dotted one (``self`` of ``self.opt``)."""
    names: Set[str] = {optimizer}
    tied = {m for m, opts in ctx.parameter_optimizers.items() if optimizer in opts}
    if not tied:
        tied = {receiver(c) or "" for c in ctx.calls if method_name(c) in ("parameters", "named_parameters")}
        bound = {dotted(n) for n in loop.region if isinstance(getattr(n, "ctx", None), ast.Store)}
        tied |= {dotted(c.func) or "" for c in loop.calls
                 if isinstance(c.func, (ast.Name, ast.Attribute)) and dotted(c.func) not in bound}
        tied.discard("")
    names |= tied
    names |= {n.split(".")[0] for n in names}
    return frozenset(names)


def hands_over(arg: ast.AST, names: FrozenSet[str]) -> bool:
    """Whether passing ``arg`` hands a call one of ``names`` (or a part of it): ``model``,
    ``self.model.encoder``, ``model.parameters()``, ``[opt_a, opt_b]``, ``*models``; not what a
    call of it returns (``model(x)`` is a tensor)."""
    if isinstance(arg, ast.Starred):
        return hands_over(arg.value, names)
    if isinstance(arg, (ast.List, ast.Tuple, ast.Set)):
        return any(hands_over(e, names) for e in arg.elts)
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and not arg.args:
        return hands_over(arg.func.value, names)  # `model.parameters()`, `model.named_parameters()`
    name = dotted(arg)
    return name is not None and (name in names or any(name.startswith(n + ".") for n in names))


def may_zero(ctx: FileContext, loop: TrainingLoop, call: ast.Call, optimizer: str,
             names: FrozenSet[str], depth: int = 0) -> bool:
    """Whether ``call`` (in ``loop``'s iteration) might zero ``optimizer``'s gradients unseen (see the module)."""
    name = _name_of(call)
    if name == "zero_grad" or _named_for_zeroing(name):
        return False  # judged with the file's zeroings (:func:`zeroings`): another optimizer's, here
    if ctx.is_step(call) or ctx.is_backward(call) or (ctx.qualname(call.func) or "").startswith(_KNOWN_MODULES):
        return False
    if name.endswith(("grad", "grads", "gradients")) and name not in _GRAD_NAMES_KEPT:
        return True  # `sync_grads(model)`, `self.compute_gradients()`: what it does is not seen
    harmless = name in (_METHODS if isinstance(call.func, ast.Attribute) else _BUILTINS)
    if receiver(call) == optimizer and not harmless:
        return True  # a method of a custom optimizer (`optimizer.clear()`)
    if any(isinstance(a, ast.Name) and _named_for_zeroing(a.id) for a in call.args):
        return True  # `model.apply(zero_grads)`
    target = functions_of(ctx).resolve(loop, call)
    if target is not None:  # this file's own function: read its body (its zeroings were looked for already)
        if depth >= 3:
            return True
        own = [n for n in own_nodes(target) if isinstance(n, ast.Call)]
        body = TrainingLoop(ctx, target, own_nodes(target))  # type: ignore[arg-type]
        args = target.args
        params = frozenset(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs) | names
        return any(may_zero(ctx, body, c, optimizer, params, depth + 1) for c in own)
    if harmless:
        return False
    given: List[ast.AST] = list(call.args) + [k.value for k in call.keywords]
    if isinstance(call.func, ast.Attribute) and dotted(call.func) not in names:
        given.append(call.func.value)  # `trainer.before_step()` for `trainer.optimizer`; not `self.model(x)`
    return any(hands_over(arg, names) for arg in given)

