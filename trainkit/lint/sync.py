"""TK302: host synchronisations inside the training step (slow).

``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()`` and printing a tensor make
the CPU wait for the GPU to finish everything queued so far, so the GPU idles
while the CPU prepares the next step. Once every N steps for logging is fine.
"""
from __future__ import annotations

import ast
import re
from typing import Iterator, Optional, Set

from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, has_modulo, method_name, names_in
from trainkit.lint._loss import loss_of
from trainkit.lint._registry import Hit, rule

_SYNC_METHODS = frozenset({"item", "cpu", "tolist", "numpy"})
# An ``if`` mentioning one of these guards logging or evaluation, not the step itself.
_LOGGING_RE = re.compile(r"log|print|verbose|debug|display|report|val|eval", re.IGNORECASE)
_NO_GRAD = ("no_grad", "inference_mode")
_TENSORISH_RE = re.compile(
    r"^(\w*loss\w*|logits?|outputs?|outs?|preds?|predictions?|y_?hat|grads?)$", re.IGNORECASE
)


def _exempt(ctx: FileContext, loop: TrainingLoop, node: ast.AST) -> bool:
    """Under a logging ``if`` (or behind ``if step % log_every != 0: continue``), in a validation
    branch, or under ``torch.no_grad()``."""
    if loop.exits_before(node):
        return True
    child = node
    for parent in ctx.ancestors(node, stop=loop.node):
        # Only the body is the logging branch; the else branch runs on the plain steps.
        if isinstance(parent, ast.If) and any(child is s for s in parent.body):
            if has_modulo(parent.test) or any(_LOGGING_RE.search(n) for n in names_in(parent.test)):
                return True
        child = parent
    return ctx.inside_with(node, _NO_GRAD, stop=loop.node)


def _printed_tensor(call: ast.Call, tensors: Set[str]) -> Optional[str]:
    """The tensor-like name that ``print(...)`` formats, if any."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "print"):
        return None
    for arg in call.args:
        values = [v.value for v in arg.values if isinstance(v, ast.FormattedValue)] if isinstance(arg, ast.JoinedStr) else [arg]
        for value in values:
            name = dotted(value)
            if name and (name in tensors or _TENSORISH_RE.match(name.split(".")[-1])):
                return name
    return None


@rule(
    "TK302",
    name="host-sync-every-step",
    severity="warning",
    summary=".item()/.cpu()/.tolist()/.numpy()/print(tensor) on every training step",
)
def check_host_sync(ctx: FileContext) -> Iterator[Hit]:
    """Flag a GPU->CPU sync in the training step outside a logging condition."""
    # A script that never mentions CUDA may run on a CPU, where the sync costs little.
    waits = ("waits for the GPU on every training step" if ctx.mentions_cuda
             else "forces a device sync on every training step (the CPU waits for the GPU when there is one)")
    for loop in ctx.training_loops:
        tensors = {n for n in (loss_of(loop, c) for c in loop.backward_calls) if n}
        for call in loop.calls:
            if method_name(call) in _SYNC_METHODS and not call.args and not call.keywords:
                inner = call.func.value  # type: ignore[attr-defined]
                if isinstance(inner, ast.Call) and method_name(inner) in _SYNC_METHODS and not inner.args:
                    continue  # `.cpu().numpy()`: one sync, reported at the `.cpu()`
                found = f"`{ast.unparse(call)}`"
            else:
                printed = _printed_tensor(call, tensors)
                if printed is None:
                    continue
                found = f"`{ast.unparse(call)}` formats tensor `{printed}` and"
            if _exempt(ctx, loop, call):
                continue
            yield Hit(
                call,
                f"{found} {waits}",
                "log every N steps under `if step % log_every == 0:`, or keep a device-side "
                "running total (`total += loss.detach()`) and read it once per epoch",
            )
