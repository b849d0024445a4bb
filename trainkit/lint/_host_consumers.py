"""Host reads the step itself needs (TK302): the value goes on to an environment's ``step(...)``.

In reinforcement learning the action is picked on the GPU and the environment, a Python or C
program on the host, must get it before the next observation exists: CleanRL's ``dqn.py`` does
``actions = torch.argmax(q_values, dim=1).cpu().numpy()`` and then ``envs.step(actions)``. That
read cannot be moved under a logging ``if`` nor kept on the device, so TK302's advice does not
apply. The rule: a host read whose value reaches, in the same loop, the arguments of a ``.step(...)``
called on an object whose name says it is an environment (``env``, ``envs``, ``self.env``,
``train_env``) — directly (``envs.step(actions.cpu().numpy())``) or through names assigned from it
(``greedy = q.argmax().cpu()``; ``actions = greedy.numpy()``; ``envs.step(actions)``).
"""
from __future__ import annotations

import ast
import re
from typing import List, Set

from trainkit.lint._core import FileContext, TrainingLoop
from trainkit.lint._nodes import dotted, method_name, receiver

# The receiver's last part names an environment: `env`, `envs`, `train_env`, `vec_env`, `environment`.
_ENV_RE = re.compile(r"env", re.IGNORECASE)
_STATEMENTS = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)


def is_env_step(ctx: FileContext, call: ast.Call) -> bool:
    """``env.step(action)``: a ``step`` with arguments, on no optimizer or scaler, whose receiver
    is named as an environment."""
    if method_name(call) != "step" or not (call.args or call.keywords) or ctx.is_step(call):
        return False
    name = receiver(call)
    return bool(name) and bool(_ENV_RE.search(name.split(".")[-1]))


def _targets(stmt: ast.AST) -> Set[str]:
    target_nodes: List[ast.AST] = (list(stmt.targets) if isinstance(stmt, ast.Assign)
                                   else [stmt.target])  # type: ignore[attr-defined]
    out: Set[str] = set()
    for target in target_nodes:
        for sub in ast.walk(target):
            name = dotted(sub) if isinstance(sub, (ast.Name, ast.Attribute)) else None
            if name and isinstance(getattr(sub, "ctx", None), ast.Store):
                out.add(name)
    return out


def _mentions(node: ast.AST, names: Set[str]) -> bool:
    return any(dotted(sub) in names for sub in ast.walk(node) if isinstance(sub, (ast.Name, ast.Attribute)))


def _env_arguments(call: ast.Call) -> List[ast.expr]:
    return list(call.args) + [k.value for k in call.keywords]


def feeds_environment(ctx: FileContext, loop: TrainingLoop, read: ast.Call) -> bool:
    """Whether the value of the host read ``read`` reaches an environment's ``step(...)`` in ``loop``."""
    env_steps = [c for c in loop.calls if is_env_step(ctx, c)]
    if not env_steps:
        return False
    tainted: Set[str] = set()
    child: ast.AST = read
    for parent in ctx.ancestors(read, stop=loop.node):
        if isinstance(parent, ast.Call) and is_env_step(ctx, parent) \
                and any(child is arg for arg in _env_arguments(parent)):
            return True  # `envs.step(actions.cpu().numpy())`
        if isinstance(parent, _STATEMENTS):
            if child is not getattr(parent, "value", None):
                return False
            tainted = _targets(parent)
            break
        if isinstance(parent, ast.stmt):
            return False  # read in a test, a call statement, a return: not passed on by name
        child = parent
    if not tainted:
        return False
    # Follow the names through later assignments, twice round the loop: an action computed at the
    # end of one iteration is stepped at the start of the next.
    statements = [n for n in loop.region if isinstance(n, _STATEMENTS)]
    for _ in range(2):
        for stmt in statements:
            value = getattr(stmt, "value", None)
            if value is not None and _mentions(value, tainted):
                tainted |= _targets(stmt)
    return any(_mentions(arg, tainted) for call in env_steps for arg in _env_arguments(call))

