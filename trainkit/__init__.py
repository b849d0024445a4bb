"""trainkit: make hand-written PyTorch training loops fast, and show with numbers what did it.

Example::

    import trainkit as tk

    with tk.session(logdir="runs/exp1") as s:
        tk.patch(optimizer)
        for x, y in tk.patch(loader):
            with tk.profile_region("forward"):
                loss = criterion(model(x), y)
            loss.backward(); optimizer.step(); optimizer.zero_grad()
            s.log("loss", loss)

Importing trainkit is cheap: torch, tensorboard, matplotlib and rich are imported where used.
"""
from .patch import patch, unpatch
from .profiling.analyze import analyze
from .profiling.finding import Finding
from .profiling.regions import profile_region
from .profiling.schedule import ProfileSchedule
from .session import Session, active, session
from .switches import technique
from .techniques.accumulate import accumulate
from .techniques.amp import autocast_scaled
from .techniques.backends import channels_last
from .techniques.compiled_step import compiled_step
from .techniques.transfer import to_device

__version__ = "0.1.0"

__all__ = [
    "Finding",
    "ProfileSchedule",
    "Session",
    "accumulate",
    "active",
    "analyze",
    "autocast_scaled",
    "channels_last",
    "compiled_step",
    "patch",
    "profile_region",
    "session",
    "technique",
    "to_device",
    "unpatch",
]
