"""Host and CUDA-event timers whose results are resolved lazily, off the hot path.

On a GPU, work is queued asynchronously: the host clock says when work was *launched*, not when it
ran. A :class:`PendingInterval` holds two CUDA events recorded on the current stream; the session's
writer thread asks ``ready()`` (``cudaEventQuery``, never a synchronize) and reads the elapsed time
only once the GPU has passed the second event. Nothing here ever synchronizes the device in the
training step.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

#: The host clock. Injectable (``timing.now = fake``) so that tests can be deterministic; the hot
#: paths bind it once (a region when its name is first used, a patch when made, a loader per pass).
now: Callable[[], float] = time.perf_counter

#: Finished CUDA events, reused (creating one costs more than recording one), one pool per
#: device: an event belongs to the device it was first recorded on, and recording it on another
#: device's stream raises.
_pools: Dict[int, List[Any]] = {}
_current_device: Optional[Callable[[], int]] = None


def _event() -> Any:
    global _current_device
    if _current_device is None:
        import torch

        # torch's C call (~0.1 us) where it has one, else the public one (~1 us)
        _current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
    pool = _pools.get(_current_device())
    if pool:
        return pool.pop()
    import torch

    return torch.cuda.Event(enable_timing=True)


def _give_back(ev: Any) -> None:
    """Return a finished event to its device's pool."""
    device = getattr(ev, "device", None)
    if device is not None and device.index is not None:
        _pools.setdefault(device.index, []).append(ev)


def cuda_event() -> Any:
    """Record a timing CUDA event on the current stream and return it."""
    ev = _event()
    ev.record()
    return ev


_cuda_module: Any = None


def cuda_in_use() -> bool:
    """True when this process has initialised CUDA (never initialises it itself).

    Called on the hot path (every region, copy and step), so it reads ``torch.cuda._initialized``
    (~50 ns) instead of calling ``torch.cuda.is_initialized()`` (~1 us); CUDA, once initialised,
    stays so for the life of the process.
    """
    global _cuda_module
    if _cuda_module is None:
        import sys

        torch = sys.modules.get("torch")
        if torch is None:
            return False
        _cuda_module = torch.cuda
    return _cuda_module.__dict__.get("_initialized", False) is True


class PendingInterval:
    """Elapsed GPU time between two CUDA events, read once the second one has completed.

    Example::

        start = timing.cuda_event(); y = model(x); iv = timing.PendingInterval(start, timing.cuda_event())
        ...  # later, in another thread
        if iv.ready(): print(iv.value())
    """

    __slots__ = ("start", "end", "release_start")

    def __init__(self, start: Any, end: Any, *, release_start: bool = True) -> None:
        self.start = start
        self.end = end
        # A step-time interval shares its start event with the previous interval's end, so only
        # one of the two may hand that event back to the pool.
        self.release_start = release_start

    def ready(self) -> bool:
        return bool(self.end.query())

    def value(self, *, wait: bool = False) -> float:
        """Milliseconds between the events; ``wait=True`` (only at close) may synchronize."""
        if wait:
            self.end.synchronize()
        ms = float(self.start.elapsed_time(self.end))
        return ms

    def release(self) -> None:
        if self.release_start:
            _give_back(self.start)


class PendingTensor:
    """A scalar logged on a GPU, copied to the host asynchronously; read once its event (recorded
    after the copy) has completed."""

    __slots__ = ("tensor", "event")

    def __init__(self, tensor: Any, event: Optional[Any]) -> None:
        self.tensor = tensor
        self.event = event

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def value(self, *, wait: bool = False) -> float:
        """The value; ``wait=True`` (only at close) first waits for the event: a host copy
        made asynchronously is complete only once the GPU has passed it."""
        if wait and self.event is not None:
            self.event.synchronize()
        return float(self.tensor.item())

    def release(self) -> None:
        if self.event is not None:
            _give_back(self.event)


def pending_copy(tensor: Any) -> PendingTensor:
    """A one-element CUDA tensor's value as the step queues it, read later with no CUDA call.

    Copied to the host asynchronously (into pinned memory), an event recorded after the copy:
    the value is the one at this point, whatever changes the tensor in place later (a running
    total, GradScaler's update()), and the writer reads host memory once the event has passed.
    """
    return PendingTensor(tensor.detach().to("cpu", non_blocking=True), cuda_event())
