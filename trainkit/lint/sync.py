"""TK302: host synchronisations inside the training step (slow).

``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy(force=True)`` and printing a tensor make
the CPU wait for the GPU to finish everything queued so far, so the GPU idles
while the CPU prepares the next step. A bare ``.numpy()`` is not one: it refuses a GPU tensor, so
where it runs the tensor is on the host already (``.cpu().numpy()`` is reported at the ``.cpu()``).
Once every N steps for logging is fine, and so is once per update of accelerate's accumulation
(``if accelerator.sync_gradients:``) or on a non-finite loss.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, Iterator, List, Optional, Set, Tuple

from trainkit.lint._conditions import implies
from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._host_consumers import feeds_environment, is_env_step
from trainkit.lint._nodes import dotted, has_modulo, method_name, names_in, pos
from trainkit.lint._loss import loss_of
from trainkit.lint._registry import Hit, rule
from trainkit.lint._step_bodies import called_every_step

_SYNC_METHODS = frozenset({"item", "cpu", "tolist"})
#: ``.numpy()`` is a host read only with ``force=True`` (which copies a GPU tensor to the host)
_CONVERTERS = frozenset(_SYNC_METHODS | {"numpy"})
# An ``if`` mentioning one of these guards logging or evaluation, not the step itself.
# The words of a logging or evaluation setting (``log_every``, ``should_log``, ``args.verbose``,
# ``do_eval``, ``logStep``, ``printfreq``): the words of a name, not a substring of it, which hid
# reads under ``if use_aux_logits:`` ("log") or ``if clip_value is not None:`` ("val").
_LOGGING_WORDS = frozenset((
    "log", "logs", "logging", "logger", "print", "printing", "verbose", "verbosity", "debug",
    "debugging", "display", "report", "reporting", "val", "valid", "validate", "validation",
    "eval", "evaluate", "evaluation", "evaluating"))
_LOGGING_JOINED = re.compile(r"(log|print|eval|val|report|display|debug)"
                             r"(every|each|freq|frequency|interval|iter|iters|step|steps|period|n)")
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def _logging_name(name: str) -> bool:
    return any(w in _LOGGING_WORDS or _LOGGING_JOINED.fullmatch(w)
               for w in map(str.lower, _WORDS.findall(name)))
_NO_GRAD = ("no_grad", "inference_mode")
# torch's factories that make a new tensor on the default device (the CPU) unless given `device=`:
# `torch.rand(1).item()` (an epsilon-greedy draw) reads host memory, no device to wait for.
_HOST_FACTORIES = frozenset({
    "rand", "randn", "randint", "randperm", "tensor", "zeros", "ones", "full", "empty", "arange",
    "linspace", "logspace", "eye",
})
_TENSORISH_RE = re.compile(
    r"^(\w*loss\w*|logits?|outputs?|outs?|preds?|predictions?|y_?hat|grads?)$", re.IGNORECASE
)
# Objects holding a run's settings: `args.aux_loss_weight`, `cfg.train.loss_scale`,
# `self.hparams.loss_weight`, `model_config.loss_type` are Python values, not tensors.
_CONFIG_RE = re.compile(r"(^|_)(args|arguments|cfg|conf|config|configs|hparams|hyperparams|hp|opts|options|"
                        r"flags|settings)$", re.IGNORECASE)


def _tensorish(name: Optional[str], tensors: Set[str], numbers: Set[str]) -> bool:
    """Whether the dotted ``name`` looks like a tensor: the loss, or a tensor-like last name
    (``loss``, ``logits``, ``outputs.logits``) that is no number and no config attribute."""
    if not name or name in numbers:
        return False
    if name in tensors:
        return True
    parts = name.split(".")
    return bool(_TENSORISH_RE.match(parts[-1])) and not any(_CONFIG_RE.search(p) for p in parts[:-1])


def _synced(expr: ast.expr, holds: bool) -> bool:
    """``accelerator.sync_gradients`` true: accelerate's real step, once per accumulation window."""
    name = dotted(expr)
    return holds and name is not None and name.split(".")[-1] == "sync_gradients"


def _bad_value(expr: ast.expr, holds: bool) -> bool:
    """A non-finite loss: ``torch.isnan(loss)`` (``.any()``) true, or ``torch.isfinite(loss)`` (``.all()``) false."""
    if not isinstance(expr, ast.Call):
        return False
    name = (dotted(expr.func) or "").split(".")[-1] or method_name(expr)
    if name in ("any", "all"):
        inner = expr.args[0] if len(expr.args) == 1 else getattr(expr.func, "value", None)
        return isinstance(inner, ast.Call) and _bad_value(inner, holds)
    if name in ("isnan", "isinf"):
        return holds
    return name == "isfinite" and not holds


def _rare(loop: TrainingLoop, test: ast.expr, holds: bool) -> bool:
    """Whether code running where ``test`` is ``holds`` runs once per real step of accelerate's
    accumulation, or only on a non-finite loss, not on every micro-batch."""
    test = loop.resolved(test)
    return implies(test, holds, _synced) or implies(test, holds, _bad_value)


def _exempt(ctx: FileContext, loop: TrainingLoop, node: ast.AST) -> bool:
    """Under a logging ``if`` (or behind ``if step % log_every != 0: continue``), in a validation
    branch, under ``if accelerator.sync_gradients:`` (or behind ``if not ...: continue``), in a
    branch for a non-finite loss, or under ``torch.no_grad()``."""
    if loop.exits_before(node):
        return True
    if loop.behind_exit(node, "TK302 rare", lambda owner, side: _rare(loop, owner.test, side == "body")):
        return True
    child = node
    for parent in ctx.ancestors(node, stop=loop.node):
        if isinstance(parent, ast.If) and child is not parent.test:
            in_body = any(child is s for s in parent.body)
            if _rare(loop, parent.test, in_body):
                return True
            # Only the body is the logging branch; the else branch runs on the plain steps.
            if in_body and (has_modulo(parent.test) or any(map(_logging_name, names_in(parent.test)))):
                return True
        child = parent
    return ctx.inside_with(node, _NO_GRAD, stop=loop.node)


def _is_number(expr: ast.AST) -> bool:
    """A Python number: ``0.0``, ``x.item()``, ``float(x)``, ``loss.item() / n``, ``-x.item()``."""
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
    if isinstance(expr, ast.UnaryOp):
        return _is_number(expr.operand)
    if isinstance(expr, ast.Call):
        return method_name(expr) == "item" or (isinstance(expr.func, ast.Name) and expr.func.id in ("float", "int", "round"))
    if isinstance(expr, ast.BinOp):  # a number with a plain count: `loss.item() * n`, `total / steps`
        return (_is_number(expr.left) or _is_number(expr.right)) and all(
            _is_number(side) or isinstance(side, (ast.Name, ast.Attribute)) for side in (expr.left, expr.right))
    return False


def _scope(ctx: FileContext, loop: TrainingLoop) -> ast.AST:
    """The loop's function, or the module."""
    return next((p for p in ctx.ancestors(loop.node) if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))), ctx.tree)


def _python_numbers(scope: ast.AST) -> Set[str]:
    """Names that every assignment in ``scope`` (the loop's function, or the module) binds to a Python
    number: ``running = 0.0`` then ``running += loss.item() / n`` is a float, whatever its name says."""
    values: Dict[str, List[ast.AST]] = {}
    for node in ast.walk(scope):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        values.setdefault(sub.id, []).append(node.value if target is sub else target)
    return {name for name, vals in values.items() if all(_is_number(v) for v in vals)}


def _made_on_host(ctx: FileContext, expr: ast.expr) -> bool:
    """Whether ``expr`` is a call of one of torch's factories with no ``device=`` (nor
    ``**kwargs`` that may hold one) in a file that never changes the default device
    (``torch.set_default_device``, ``with torch.device(...):``): a CPU tensor. (A ``generator=``
    alone is a CPU one: torch refuses a CUDA generator for a tensor made on the CPU.)"""
    if not isinstance(expr, ast.Call) or any(k.arg in (None, "device") for k in expr.keywords):
        return False
    name = ctx.qualname(expr.func) or ""
    parts = name.split(".")
    if len(parts) != 2 or parts[0] != "torch" or parts[1] not in _HOST_FACTORIES:
        return False
    if parts[1] == "tensor" and not (expr.args and _literal(expr.args[0])):
        return False  # torch.tensor(t) of a tensor is made on t's device: maybe a GPU
    return not _default_device_changed(ctx)


def _literal(node: ast.expr) -> bool:
    """A number or a list/tuple of them written out: ``3``, ``[1.0, 2.0]``, ``((1, 2), (3, 4))``."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    return isinstance(node, (ast.List, ast.Tuple)) and all(_literal(e) for e in node.elts)


def _numpy_value(ctx: FileContext, expr: ast.expr) -> bool:
    """Whether the call chain ``expr`` starts at NumPy: ``np.random.permutation(n)[:k]`` (its
    ``.tolist()``/``.item()`` reads host memory; no device to wait for). Only the chain's spine is
    followed: ``f(np.arange(4))`` may be a tensor."""
    while True:
        if isinstance(expr, ast.Call):
            expr = expr.func
        elif isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        else:
            break
    return isinstance(expr, ast.Name) and (ctx.qualname(expr) or "").split(".")[0] == "numpy"


def _number_here(loop: TrainingLoop, name: str, call: ast.Call) -> bool:
    """Whether ``name``'s last binding in the iteration before ``call`` is a Python number
    (``loss = loss.item()``, then ``print(f"{loss:.3f}")``: a float, its read reported already)."""
    here = pos(call)
    last: Optional[ast.AST] = None
    for node in loop.region:
        if pos(node) >= here:
            break
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(dotted(t) == name for t in targets):
                last = node.value
    return last is not None and _is_number(last)


def _default_device_changed(ctx: FileContext) -> bool:
    for node in ctx.nodes:
        if isinstance(node, ast.Attribute) and node.attr == "set_default_device":
            return True
        if isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call) \
                and (ctx.qualname(node.context_expr.func) or "").endswith("torch.device"):
            return True
    return False


def _printed_tensor(call: ast.Call, tensors: Set[str], numbers: Set[str]) -> Optional[str]:
    """The tensor-like name that ``print(...)`` formats, if any."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "print"):
        return None
    for arg in call.args:
        values = [v.value for v in arg.values if isinstance(v, ast.FormattedValue)] if isinstance(arg, ast.JoinedStr) else [arg]
        for value in values:
            name = dotted(value)
            if _tensorish(name, tensors, numbers):
                return name
    return None


def _forced_numpy(call: ast.Call) -> bool:
    """``t.numpy(force=True)``: a copy to the host of a tensor that may be on the GPU."""
    return method_name(call) == "numpy" and not call.args and any(
        k.arg == "force" and not (isinstance(k.value, ast.Constant) and not k.value.value)
        for k in call.keywords)


def _converted_tensor(call: ast.Call, tensors: Set[str], numbers: Set[str]) -> Optional[str]:
    """The tensor-like name that ``float(...)`` or ``int(...)`` reads, if any: ``float(loss)``,
    ``float(loss.detach())``, ``int(preds.argmax())`` (a ``.item()`` inside is reported there)."""
    if not (isinstance(call.func, ast.Name) and call.func.id in ("float", "int")
            and len(call.args) == 1 and not call.keywords):
        return None
    arg = call.args[0]
    while isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and not arg.args:
        if arg.func.attr in _CONVERTERS:
            return None  # `float(loss.item())`: the `.item()` is the sync, reported itself
        arg = arg.func.value  # `loss.detach()`, `logits.argmax()`: the tensor it is called on
    name = dotted(arg)
    return name if _tensorish(name, tensors, numbers) else None


def _syncs(ctx: FileContext, loop: TrainingLoop, numbers: Set[str]) -> Iterator[Tuple[ast.Call, str]]:
    """The host reads of ``loop``'s iteration (or of a function's body read as one) outside logging, with
    what to say of each; ``numbers`` are the names its function (or the module) binds to Python numbers."""
    tensors = {n for n in (loss_of(loop, c) for c in loop.backward_calls) if n}
    numbers = numbers - tensors
    for call in loop.calls:
        if (method_name(call) in _SYNC_METHODS and not call.args and not call.keywords) or _forced_numpy(call):
            inner = call.func.value  # type: ignore[attr-defined]
            if isinstance(inner, ast.Call) and method_name(inner) in _CONVERTERS and not inner.args:
                continue  # `.cpu().numpy()`: one sync, reported at the `.cpu()`
            if _made_on_host(ctx, inner) or _numpy_value(ctx, inner):
                continue  # `torch.rand(1).item()`, `np.arange(4).tolist()`: no device to wait for
            found = f"`{ast.unparse(call)}`"
        elif (converted := _converted_tensor(call, tensors, numbers)) is not None:
            if _number_here(loop, converted, call):
                continue
            found = f"`{ast.unparse(call)}` reads a tensor on the host, as `.item()` does, and"
        else:
            printed = _printed_tensor(call, tensors, numbers)
            if printed is None or _number_here(loop, printed, call):
                continue
            found = f"`{ast.unparse(call)}` formats tensor `{printed}` and"
        if _exempt(ctx, loop, call) or feeds_environment(ctx, loop, call):
            continue  # logging, or the environment needs the value on the host
        yield call, found


_FIX = ("log every N steps under `if step % log_every == 0:`, or keep a device-side running total "
        "(`total += loss.detach()`) and read it once per epoch")


@rule(
    "TK302",
    name="host-sync-every-step",
    severity="warning",
    summary=".item()/.cpu()/.tolist()/.numpy(force=True)/float(tensor)/print(tensor) on every training step",
)
def check_host_sync(ctx: FileContext) -> Iterator[Hit]:
    """Flag a GPU->CPU sync in the training step outside a logging condition: in the loop, or in a
    function of the file that the loop calls on every iteration (the char-RNN tutorial's ``train()``
    ending in ``return output, loss.item()``), reported once, in the function. Not a function called
    under ``torch.no_grad()`` or a logging ``if``, nor one whose result goes to an environment's
    ``step(...)`` (an RL policy's ``select_action`` returning ``action.item()``)."""
    # A script that never mentions CUDA may run on a CPU, where the sync costs little.
    waits = ("waits for the GPU on every training step" if ctx.mentions_cuda
             else "forces a device sync on every training step (the CPU waits for the GPU when there is one)")
    in_scope: Dict[int, Set[str]] = {}  # each scope walked once: a script of many loops at module level

    def numbers(scope: ast.AST) -> Set[str]:
        if id(scope) not in in_scope:
            in_scope[id(scope)] = _python_numbers(scope)
        return in_scope[id(scope)]

    for loop in ctx.training_loops:
        if loop.per_epoch:
            continue  # a step once per epoch, after the batch loop (TK112's fix)
        scope = _scope(ctx, loop)
        for call, found in _syncs(ctx, loop, numbers(scope)):
            yield Hit(call, f"{found} {waits}", _FIX)
    seen: Set[int] = set()
    env_loops: Dict[int, bool] = {}  # whether a loop steps an environment, asked once per loop
    for called in called_every_step(ctx):
        loop = called.loop
        if id(loop) not in env_loops:
            env_loops[id(loop)] = any(is_env_step(ctx, c) for c in loop.calls)
        if _exempt(ctx, loop, called.call) or (env_loops[id(loop)] and feeds_environment(ctx, loop, called.call)):
            continue  # called under `torch.no_grad()`, or its result is an action for the environment
        for call, found in _syncs(ctx, called.body, numbers(called.function)):
            if id(call) not in seen and not called.skips(call):
                seen.add(id(call))
                yield Hit(call, f"{found} {waits}, {called.where()}", _FIX)
