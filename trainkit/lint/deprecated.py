"""TK4xx: deprecated or superseded torch APIs."""
from __future__ import annotations

import ast
from typing import Dict, Iterator, Set, Tuple

from trainkit.lint._core import FileContext
from trainkit.lint._registry import Hit, rule

_CUDA_AMP: Dict[str, str] = {
    "torch.cuda.amp.autocast": 'torch.amp.autocast("cuda", ...)',
    "torch.cuda.amp.GradScaler": 'torch.amp.GradScaler("cuda")',
    "torch.cuda.amp.custom_fwd": 'torch.amp.custom_fwd(device_type="cuda")',
    "torch.cuda.amp.custom_bwd": 'torch.amp.custom_bwd(device_type="cuda")',
}
_JIT = ("torch.jit.script", "torch.jit.trace")


def _uses(ctx: FileContext, wanted: Tuple[str, ...]) -> Iterator[Tuple[ast.AST, str]]:
    """Each reference to one of ``wanted``, once per line, in source order."""
    seen: Set[Tuple[int, str]] = set()
    hits = sorted(((n, q) for n, q in ctx.references if q in wanted), key=lambda h: (h[0].lineno, h[0].col_offset))
    for node, qual in hits:
        if (node.lineno, qual) not in seen:
            seen.add((node.lineno, qual))
            yield node, qual


def _spelled(node: ast.AST, qual: str) -> str:
    """```amp.autocast` (torch.cuda.amp.autocast)``: the spelling found, and what it resolves to."""
    text = ast.unparse(node)
    return f"`{text}`" if text == qual else f"`{text}` (`{qual}`)"


@rule(
    "TK401",
    name="deprecated-cuda-amp",
    severity="warning",
    summary="torch.cuda.amp.autocast / GradScaler are deprecated",
)
def check_cuda_amp(ctx: FileContext) -> Iterator[Hit]:
    """Flag ``torch.cuda.amp.autocast`` / ``GradScaler`` however they were imported."""
    for node, qual in _uses(ctx, tuple(_CUDA_AMP)):
        yield Hit(
            node,
            f"{_spelled(node, qual)} is deprecated since torch 2.4 (FutureWarning)",
            f"use `{_CUDA_AMP[qual]}`",
        )


@rule(
    "TK402",
    name="jit-for-speed",
    severity="advice",
    summary="torch.jit.script / torch.jit.trace: TorchScript is in maintenance mode",
)
def check_jit(ctx: FileContext) -> Iterator[Hit]:
    """Suggest ``torch.compile`` where TorchScript is used."""
    for node, qual in _uses(ctx, _JIT):
        yield Hit(
            node,
            f"{_spelled(node, qual)}: TorchScript gets no new features and is usually "
            "slower to train with than torch.compile",
            "`model = torch.compile(model)` for speed (keep torch.jit / torch.export only for deployment)",
        )
