"""Host and CUDA-event timers whose results are resolved lazily, off the hot path.

On a GPU, work is queued asynchronously: the host clock says when work was *launched*, not when it
ran. A :class:`PendingInterval` holds two CUDA events recorded on the current stream of the device
the timed work runs on (:func:`cuda_event`); the session's writer thread asks ``ready()``
(``cudaEventQuery``, never a synchronize) and reads the elapsed time only once the GPU has passed
the second event; read, the events go back to a pool (a step's end once the next step's time,
which starts there, is read). Nothing here ever synchronizes the device in the training step.
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
# torch's calls, bound at the first event (tests of the GPU logic on a CPU put stand-ins here):
# the current device's index, a new timing event, and a device's current stream.
_current_device: Optional[Callable[[], int]] = None
_new_event: Optional[Callable[[], Any]] = None
_stream_of: Optional[Callable[[int], Any]] = None


def _bind() -> None:
    global _current_device, _new_event, _stream_of
    import torch

    # torch's C call (~0.1 us) where it has one, else the public one (~1 us)
    _current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
    _new_event = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    _stream_of = torch.cuda.current_stream


def _give_back(ev: Any) -> None:
    """Return a finished event to its device's pool."""
    index = event_device(ev)
    if index is not None:
        _pools.setdefault(index, []).append(ev)


def cuda_event(device: Optional[int] = None) -> Any:
    """Record a timing CUDA event on the current stream of ``device`` (an index; None: the
    current device) and return it.

    The device is the one the timed work runs on: a model on ``cuda:1``, or each torchrun rank's
    own GPU, while the current device is still 0 (no ``torch.cuda.set_device``). Recorded on the
    current device instead, the event would time device 0's idle stream (and create a CUDA
    context there from every rank).
    """
    if _current_device is None:
        _bind()
    here = _current_device()  # type: ignore[misc]
    if device is None:
        device = here
    pool = _pools.get(device)
    try:
        ev = pool.pop() if pool else _new_event()  # type: ignore[misc]
    except IndexError:  # another thread took the last one
        ev = _new_event()  # type: ignore[misc]
    if device == here:
        ev.record()
    else:
        ev.record(_stream_of(device))  # type: ignore[misc]
    return ev


_UNSET: Any = object()
_rank_device: Any = _UNSET  # LOCAL_RANK when it names a device of this process, else None


def work_device(steps: Optional[int]) -> int:
    """The device whose stream a region's (or a step's first wait's) events go on.

    The current device, when set (``torch.cuda.set_device``, ``with torch.cuda.device(k)``: a
    pipeline stage); while it is torch's default, 0, the steps' device (``steps``: the primary
    optimizer's parameters', once known), and before that torchrun's ``LOCAL_RANK`` when it
    names a device (a rank's ``model.to(local_rank)`` without ``set_device``, as the DDP
    tutorial has it: events on device 0 would time its idle stream, and make a CUDA context
    there from every rank).
    """
    global _rank_device
    if _current_device is None:
        _bind()
    here = _current_device()  # type: ignore[misc]
    if here != 0:
        return here
    if steps is not None:
        return steps
    if _rank_device is _UNSET:
        _rank_device = None
        from . import _env

        try:
            local = int(_env.get(_env.LOCAL_RANK) or 0)
        except ValueError:
            local = 0
        if local > 0:
            import torch

            if local < torch.cuda.device_count():
                _rank_device = local
    return 0 if _rank_device is None else _rank_device


def steps_device(known: Optional[int]) -> int:
    """The device of a step's own events (its end, its first wait): ``known`` (the primary
    optimizer's parameters'), else the guess of :func:`work_device`."""
    return work_device(None) if known is None else known


def event_device(ev: Any) -> Optional[int]:
    """The index of the device a recorded event belongs to."""
    device = getattr(ev, "device", None)
    return None if device is None else device.index


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

    __slots__ = ("start", "end", "release_end")

    def __init__(self, start: Any, end: Any, *, release_end: bool = True) -> None:
        self.start = start
        self.end = end
        # A step's end event is also where the next step's time starts: the interval that reads
        # it as its start hands it back (steps are read in order), not this one.
        self.release_end = release_end

    def ready(self) -> bool:
        return bool(self.end.query())

    def value(self, *, wait: bool = False) -> float:
        """Milliseconds between the events; ``wait=True`` (only at close) may synchronize."""
        if wait:
            self.end.synchronize()
        ms = float(self.start.elapsed_time(self.end))
        return ms

    def release(self) -> None:
        _give_back(self.start)
        if self.release_end:
            _give_back(self.end)


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
    # The copy is queued on the tensor's device's stream, and so is its event.
    return PendingTensor(tensor.detach().to("cpu", non_blocking=True), cuda_event(tensor.get_device()))
