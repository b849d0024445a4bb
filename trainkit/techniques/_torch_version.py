"""The installed torch's version, for the techniques that work around an older torch's bug."""
from __future__ import annotations

import re
from typing import Tuple


def torch_before(version: Tuple[int, int]) -> bool:
    """Whether the installed torch is older than ``version`` (major, minor): ``torch_before((2, 4))``
    on 2.3.1. False where its version does not start with ``<major>.<minor>`` (taken for a new one).
    Imports torch: call it when a technique is used, not at ``import trainkit``."""
    import torch

    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return m is not None and (int(m[1]), int(m[2])) < version
