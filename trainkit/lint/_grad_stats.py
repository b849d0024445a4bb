"""Loops of backwards that read the parameters' gradients and train nothing: gradient statistics.

EWC's Fisher estimate (``loss.backward()`` on each batch, then ``fisher[n] += p.grad ** 2`` for
every parameter), a per-parameter gradient-norm probe (``norms[n].append(p.grad.norm().item())``),
a pruning saliency (``|w * w.grad|``) run a backward on every batch, often after
``model.zero_grad()``, but no optimizer steps: they read the gradients and leave the parameters
alone. Such a loop is no training loop, so TK301/TK302 do not count its iterations as training steps.

Read conservatively, since taking a training loop for one of these hides its findings. Where nothing
steps (the caller checks that, also through step functions), the loop is one when:

* each backward is a plain ``t.backward(...)`` (not ``scaler.scale(loss).backward()``, nor a
  module's ``amp.backward(loss)``), as for an attack (:mod:`trainkit.lint._input_grads`);
* it reads ``.grad`` of something (``p.grad`` used in a value: not only ``p.grad is None``, nor only
  ``p.grad.zero_()``);
* it updates no parameter by hand, as PyTorch's tutorials train without an optimizer: no ``w -=
  lr * w.grad`` (any ``-=`` on a name or attribute), no write to what it reads the gradient of
  (``w = ...``, ``w += ...``, ``w.data = ...``, ``w.data.sub_(...)``, ``w.copy_(...)``), no
  assignment to an ``x.data``, no ``sub_``, ``copy_`` or ``set_`` on anything but a gradient or an
  entry (``fisher[n].copy_(...)``), no ``add_`` with a scale (``p.add_(g, alpha=-lr)``), no
  ``torch._foreach_*`` or ``torch.optim._functional`` call, and no ``clip_grad_norm_`` (a
  clip is for a step);
* it calls nothing that may step under another name: no ``.step(`` of anything (DeepSpeed's
  ``model_engine.step()``), no ``update_params()``, ``optimizer_step()``, ``apply_gradients()``
  (a name with ``step``, ``optimi``, ``apply_grad``, or ``update`` that is not a dict's
  ``x.update(...)``);
* no code around it steps (:func:`trainkit.lint._input_grads.in_stepping_code`): a loop collecting
  per-sample gradients for the step after it (DP-SGD, gradient surgery) stays a training loop of
  its own, which the micro-batch rules leave alone as they leave any loop reading ``.grad``.
"""
from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Dict, List, Optional, Set

from trainkit.lint._input_grads import in_stepping_code, plain_backward
from trainkit.lint._nodes import dotted, method_name, receiver

if TYPE_CHECKING:
    from trainkit.lint._core import FileContext

# In-place methods that leave a tensor's values as they are, or only touch a gradient.
_HARMLESS = frozenset({"zero_", "requires_grad_", "detach_", "retain_grad"})
# A call that may step or update under a name of its own: `optimizer_step()`, `update_params()`.
_STEPPING = re.compile(r"step|optimi|apply_grad|^update|update$", re.IGNORECASE)


def _owner(name: Optional[str]) -> Optional[str]:
    """``p`` for ``p`` or ``p.data``: the tensor a write goes to."""
    if name is not None and name.endswith(".data"):
        return name[: -len(".data")]
    return name


def _used(node: ast.Attribute, parents: Dict[ast.AST, ast.AST]) -> bool:
    """Whether the ``x.grad`` read ``node`` uses the gradient's values: not ``x.grad is None`` nor
    ``x.grad.zero_()``."""
    parent = parents.get(node)
    if isinstance(parent, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in parent.ops):
        return False
    if isinstance(parent, ast.Attribute) and parent.attr in _HARMLESS:
        return False
    return True


def _updates(node: ast.AST, owners: Set[str]) -> bool:
    """Whether ``node`` may update a parameter by hand (see the module); ``owners`` are the names
    whose ``.grad`` the loop reads."""
    if isinstance(node, ast.AugAssign):
        name = _owner(dotted(node.target))
        return name is not None and (isinstance(node.op, ast.Sub) or name in owners)
    if isinstance(node, ast.Assign):
        for target in node.targets:
            name = dotted(target)
            if name is not None and (name.endswith(".data") or _owner(name) in owners):
                return True
        return False
    if not isinstance(node, ast.Call):
        return False
    full = dotted(node.func) or ""
    if "_foreach_" in full or "optim._functional" in full or "clip_grad" in full:
        return True  # `torch._foreach_add_(params, grads, alpha=-lr)`: an update by hand; a clip, for one
    method = method_name(node)
    if method is None:
        return bool(_STEPPING.search(full))
    if method == "step" or (_STEPPING.search(method) and not (method == "update" and receiver(node) != "self")):
        return True  # `model_engine.step()`, `self.update()`; a dict's `stats.update(...)` is none
    if not method.endswith("_") or method in _HARMLESS:
        return False
    name = receiver(node)
    if name is None or name.endswith(".grad"):
        return False  # `fisher[n].add_(...)`: an entry; `p.grad.mul_(...)`: a gradient, not a parameter
    if _owner(name) in owners or method in ("sub_", "copy_", "set_"):
        return True
    return method.startswith("add") and (len(node.args) > 1 or any(k.arg in ("alpha", "value") for k in node.keywords))


def gradient_statistics(ctx: "FileContext", loop: ast.AST, region: List[ast.AST], backwards: List[ast.Call]) -> bool:
    """Whether ``loop``, whose iteration (``region``) runs ``backwards`` and steps nothing, only reads
    the parameters' gradients (a Fisher estimate, a gradient-norm probe) outside code that steps:
    no training loop (see the module)."""
    if not all(plain_backward(ctx, b) for b in backwards):
        return False  # `scaler.scale(loss).backward()`, `amp.backward(loss)`: wrapped for a step
    reads = [n for n in region if isinstance(n, ast.Attribute) and n.attr == "grad"
             and isinstance(n.ctx, ast.Load) and _used(n, ctx.parents)]
    if not reads:
        return False
    owners = {name for name in (dotted(n.value) for n in reads) if name is not None}
    if any(_updates(node, owners) for node in region):
        return False
    return not in_stepping_code(ctx, loop)
