"""TensorBoard event files, written by the session's writer thread.

One ``Event`` per step carries every scalar of that step, so a step costs one protobuf and one
record, not one per tag. The record framing (length, masked CRC32C, payload, masked CRC32C) is the
TFRecord format TensorBoard reads; the CRC comes from ``google-crc32c`` (C) when installed, else
from tensorboard's pure-Python fallback, which costs ~25 us per event and would steal the GIL from
the training thread on small steps.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from typing import IO, Any, Dict, Mapping, Optional

try:  # the fast path: a C implementation
    import google_crc32c as _crc

    def _crc32c(data: bytes) -> int:
        return _crc.value(data)

except ImportError:  # pragma: no cover - exercised on machines without the wheel
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as _crc32c


_pack_len = struct.Struct("<Q").pack
_pack_crc = struct.Struct("<I").pack


def masked_crc32c(data: bytes) -> int:
    """The CRC TensorBoard's record reader checks (TFRecord's masked CRC32C)."""
    x = _crc32c(data) & 0xFFFFFFFF
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class EventFileWriter:
    """An append-only ``events.out.tfevents.*`` file in ``logdir``.

    Example::

        w = EventFileWriter("runs/exp1")
        w.write_scalars(step=1, values={"trainkit/step_time_ms": 12.5})
        w.flush(); w.close()
    """

    def __init__(self, logdir: str, *, filename_suffix: str = "") -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        self._event_pb2 = event_pb2
        self._summary_pb2 = summary_pb2
        os.makedirs(logdir, exist_ok=True)
        name = "events.out.tfevents.%010d.%s.%d.%d%s" % (
            int(time.time()), socket.gethostname(), os.getpid(), _next_id(), filename_suffix)
        self.path = os.path.join(logdir, name)
        self._file: Optional[IO[bytes]] = open(self.path, "ab")
        self._write_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def _write_event(self, event: Any) -> None:
        if self._file is None:
            raise ValueError(f"event file {self.path!r} is closed; open a new session to write again")
        data = event.SerializeToString()
        header = _pack_len(len(data))
        self._file.write(header + _pack_crc(masked_crc32c(header)) + data
                         + _pack_crc(masked_crc32c(data)))

    def write_scalars(self, *, step: int, values: Mapping[str, float],
                      wall_time: Optional[float] = None) -> None:
        """One event holding every ``tag -> value`` of ``step``."""
        if not values:
            return
        event = self._event_pb2.Event(wall_time=time.time() if wall_time is None else wall_time,
                                      step=step)
        add = event.summary.value.add
        for tag, v in values.items():
            add(tag=tag, simple_value=v)
        self._write_event(event)

    def write_summary(self, summary: Any, *, step: int = 0) -> None:
        """A prebuilt ``Summary`` protobuf (e.g. HParams plugin data)."""
        self._write_event(self._event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def write_text(self, tag: str, text: str, *, step: int = 0) -> None:
        """A markdown text summary, shown in TensorBoard's Text tab."""
        from tensorboard.plugins.text.summary_v2 import text_pb

        self.write_summary(text_pb(tag, text), step=step)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


_ids: Dict[str, int] = {"n": 0}


def _next_id() -> int:
    # Two sessions started within the same second in one process must not share a file name.
    _ids["n"] += 1
    return _ids["n"]
