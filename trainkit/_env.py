"""Every environment variable trainkit reads, in one place.

trainkit only *reads* the environment; it never writes to ``os.environ`` (the ablation CLI passes
overrides to its children through the ``env=`` of the subprocess it starts).
"""
from __future__ import annotations

import os
from typing import Optional

#: JSON object of technique overrides, set by ``trainkit ablate`` for its child runs.
TECHNIQUES = "TRAINKIT_TECHNIQUES"
#: Where a child run started by ``trainkit ablate`` writes its step times (JSON).
ABLATE_RESULTS = "TRAINKIT_ABLATE_RESULTS"
#: ``warmup+steps`` budget of real optimizer steps after which a child run stops itself.
ABLATE_BUDGET = "TRAINKIT_ABLATE_BUDGET"

#: "1": run the session writer's Python code even where its C version (trainkit._speedups) is
#: built; the two write the same bytes, so this is for tests and for telling them apart.
PURE_PYTHON = "TRAINKIT_PURE_PYTHON"

# Set by torchrun / torch.distributed.launch.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
#: "True" when the ranks reach torchrun's agent store at MASTER_ADDR:MASTER_PORT.
USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"


def get(name: str) -> Optional[str]:
    """The value of one of the variables above, or None when unset or empty."""
    value = os.environ.get(name)
    return value if value else None


def rank() -> Optional[int]:
    """This process's global rank under torchrun, or None when not launched by it."""
    value = get(RANK)
    if value is None or get(WORLD_SIZE) is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"{RANK}={value!r} is not an integer; torchrun sets it to the process's rank, "
            f"e.g. RANK=0 — unset it when not running under torchrun"
        ) from None
