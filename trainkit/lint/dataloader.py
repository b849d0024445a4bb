"""TK5xx: DataLoader settings that starve a GPU (CUDA scripts only)."""
from __future__ import annotations

import ast
from typing import Dict, Iterator, List

from trainkit.lint._core import FileContext
from trainkit.lint._nodes import dotted, method_name
from trainkit.lint._registry import Hit, rule

# Positional index of the argument in torch.utils.data.DataLoader's signature.
_NUM_WORKERS_POS = 5
_PIN_MEMORY_POS = 7


def _is_cuda_device(expr: ast.expr, values: Dict[str, List[ast.expr]], depth: int = 0) -> bool:
    """``"cuda"``, ``"cuda:0"``, ``torch.device("cuda")``, or a name only ever bound to one of those."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value.lower().startswith("cuda")
    if isinstance(expr, ast.Call) and (dotted(expr.func) or "").endswith("device") and expr.args:
        return _is_cuda_device(expr.args[0], values, depth + 1)
    name = dotted(expr)
    if name is not None and depth < 3 and name in values:
        return all(_is_cuda_device(v, values, depth + 1) for v in values[name])
    return False


def _on_cuda(expr: ast.expr, values: Dict[str, List[ast.expr]], depth: int = 0) -> bool:
    """A tensor visibly on CUDA: ``x.cuda()``, ``x.to("cuda")``, ``torch.randn(..., device="cuda")``,
    or a name only ever bound to one of those."""
    if isinstance(expr, ast.Call):
        if method_name(expr) == "cuda":
            return True
        if method_name(expr) == "to" and expr.args and _is_cuda_device(expr.args[0], values):
            return True
        return any(k.arg in ("device", "device_type") and _is_cuda_device(k.value, values) for k in expr.keywords)
    name = dotted(expr)
    if name is not None and depth < 3 and name in values:
        return all(_on_cuda(v, values, depth + 1) for v in values[name])
    return False


def _dataset_on_cuda(ctx: FileContext, loader: ast.Call, values: Dict[str, List[ast.expr]]) -> bool:
    """Whether the loader's dataset is a ``TensorDataset`` of tensors already on CUDA, or an
    instance of the file's own class whose ``__getitem__`` moves items to CUDA.

    Pinning then fails (only CPU tensors can be pinned) and worker processes cannot
    use CUDA (tensors made in the parent, or CUDA initialised in a forked worker), so the
    TK5xx advice does not apply.
    """
    dataset = loader.args[0] if loader.args else next((k.value for k in loader.keywords if k.arg == "dataset"), None)
    if dataset is None:
        return False
    candidates = [dataset]
    name = dotted(dataset)
    if name is not None:
        candidates = values.get(name, [])
    for candidate in candidates:
        if not isinstance(candidate, ast.Call):
            continue
        if ((ctx.qualname(candidate.func) or "").endswith("TensorDataset")
                and any(_on_cuda(arg, values) for arg in candidate.args)):
            return True
        if isinstance(candidate.func, ast.Name) and _items_on_cuda(ctx, candidate.func.id, values):
            return True
    return False


def _items_on_cuda(ctx: FileContext, name: str, values: Dict[str, List[ast.expr]]) -> bool:
    """Whether the file's class ``name`` moves its items to CUDA in ``__getitem__`` (``return x.cuda()``)."""
    for node in ctx.nodes:
        if isinstance(node, ast.ClassDef) and node.name == name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__getitem__":
                    if any(isinstance(n, ast.Call) and _on_cuda(n, values) for n in ast.walk(item)):
                        return True
    return False


def _loaders(ctx: FileContext) -> List[ast.Call]:
    """``DataLoader(...)`` calls without ``**kwargs`` (which might set anything), in a CUDA script,
    over a dataset not visibly on the GPU already."""
    if not ctx.mentions_cuda:
        return []
    values = ctx.assignments
    return [
        call
        for call in ctx.calls
        if (ctx.qualname(call.func) or "").split(".")[-1] == "DataLoader"
        and not any(k.arg is None for k in call.keywords)
        and not _dataset_on_cuda(ctx, call, values)
    ]


def _missing(ctx: FileContext, keyword: str, position: int, why: str, fix: str) -> Iterator[Hit]:
    """A hit for each CUDA-script loader that sets ``keyword`` neither by name nor by position."""
    for call in _loaders(ctx):
        if len(call.args) <= position and not any(k.arg == keyword for k in call.keywords):
            yield Hit(call, f"`{ast.unparse(call.func)}(...)` without `{keyword}`: {why}", fix)


@rule(
    "TK501",
    name="dataloader-no-workers",
    severity="advice",
    summary="DataLoader without num_workers in a CUDA script: batches are loaded in the training process",
)
def check_num_workers(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``DataLoader(...)`` without ``num_workers`` in a file that uses CUDA."""
    return _missing(
        ctx,
        "num_workers",
        _NUM_WORKERS_POS,
        "loading and collating run in the training process, between GPU steps",
        "pass `num_workers=4` (about the CPU cores per GPU) and `persistent_workers=True`",
    )


@rule(
    "TK502",
    name="dataloader-no-pin-memory",
    severity="advice",
    summary="DataLoader without pin_memory in a CUDA script: host-to-device copies cannot be asynchronous",
)
def check_pin_memory(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``DataLoader(...)`` without ``pin_memory`` in a file that uses CUDA."""
    return _missing(
        ctx,
        "pin_memory",
        _PIN_MEMORY_POS,
        "batches come from pageable memory, so `.to(device, non_blocking=True)` still blocks",
        "pass `pin_memory=True` and copy with `.to(device, non_blocking=True)`",
    )
