"""Which optimizers a session had: recorded as it closes, for ``trainkit analyze``.

TA110 (no steps recorded) asks whether the optimizer is patched; when one was and never stepped
(an RL loop that learns once its replay buffer is warm, a condition a short run never met), the
answer is elsewhere: the loop never reached ``optimizer.step()``. So a session closing writes a
JSON text summary under ``trainkit/meta/optimizers``: each patched optimizer that stepped in it
or never stepped yet, its type and whether it stepped there.
"""
from __future__ import annotations

import json
from typing import Any

from .patch import _patched, optimizer_patch

#: ``trainkit/meta/optimizers``: the optimizers patched when a session closed (JSON), so that
#: ``trainkit analyze`` can tell a loop that never reached ``optimizer.step()`` (TA110) from one
#: whose optimizer is not patched.
META_OPTIMIZERS = "trainkit/meta/optimizers"


def patched_summary(s: Any) -> str:
    """JSON: each optimizer patched now that stepped in session ``s`` or never stepped yet, its
    type and whether it stepped in ``s`` (one that stepped in another session, an earlier
    phase's, is left out: it is not this session's to step)."""
    out = []
    for opt in list(_patched):
        p = optimizer_patch(opt)
        last = None if p is None or p.session is None else p.session()
        if p is None or (p.session is not None and last is not s):
            continue
        out.append({"type": type(opt).__name__, "stepped": last is s})
    return json.dumps(out, sort_keys=True)
