"""TensorBoard event files, written by the session's writer thread.

One ``Event`` per step carries every scalar of that step, so a step costs one protobuf and one
record, not one per tag. The record framing (length, masked CRC32C, payload, masked CRC32C) is the
TFRecord format TensorBoard reads; the CRC comes from ``google-crc32c`` (C) when installed, else
from tensorboard's pure-Python fallback, which costs ~25 us per event and would steal the GIL from
the training thread on small steps.
"""
from __future__ import annotations

import itertools
import math
import os
import socket
import struct
import time
from typing import IO, Any, Dict, Mapping, Optional, Tuple

try:  # the fast path: a C implementation
    from google_crc32c import value as _crc32c

except ImportError:  # pragma: no cover - exercised on machines without the wheel
    def _crc32c(data: bytes) -> int:
        # tensorboard's, imported at the first CRC (it imports tensorboard and numpy, which
        # `import trainkit` must not); it then replaces this function
        global _crc32c
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

        _crc32c = crc32c
        return crc32c(data)


_pack_len = struct.Struct("<Q").pack
_pack_crc = struct.Struct("<I").pack


def masked_crc32c(data: bytes) -> int:
    """The CRC TensorBoard's record reader checks (TFRecord's masked CRC32C)."""
    x = _crc32c(data) & 0xFFFFFFFF
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _masked_crc_bytes(data: bytes) -> bytes:
    return _pack_crc(masked_crc32c(data))


# -- scalar events, encoded by hand --------------------------------------------------------------
# Building an Event through the protobuf API costs ~0.7 us per value; the writer thread writes one
# Event per step with ~10 values, and every microsecond it holds the GIL is a microsecond the
# training thread may wait. The wire format of a scalar Event is small and fixed:
#   Event   { double wall_time = 1; int64 step = 2; Summary summary = 5; }
#   Summary { repeated Value value = 1; }
#   Value   { string tag = 1; float simple_value = 2; }
# tests/sinks check that protobuf parses these bytes into the same Event.
_pack_wall = struct.Struct("<Bd").pack  # wall_time's key (field 1, 64-bit), then the double
_pack_float = struct.Struct("<f").pack
_value_prefix: Dict[str, bytes] = {}


def _varint(n: int) -> bytes:
    if 0 <= n < 0x200000:  # a tag's or a summary's length, a step below 2**21: 1 to 3 bytes
        if n < 0x80:
            return _VARINT1[n]
        if n < 0x4000:
            return bytes((n & 0x7F | 0x80, n >> 7))
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    out = bytearray()
    n &= 0xFFFFFFFFFFFFFFFF  # int64 on the wire: negative numbers as 10-byte two's complement
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_VARINT1 = tuple(bytes((i,)) for i in range(0x80))


def _prefix(tag: str) -> bytes:
    prefix = _value_prefix.get(tag)
    if prefix is None:
        raw = tag.encode("utf-8")
        inner = b"\x0a" + _varint(len(raw)) + raw + b"\x15"  # tag, then simple_value's key
        prefix = b"\x0a" + _varint(len(inner) + 4) + inner  # Summary.value, length incl. float
        if len(_value_prefix) < 100_000:
            _value_prefix[tag] = prefix
    return prefix


def _float32(v: float) -> bytes:
    """``v`` as a float32, beyond whose range it is +-inf (as numpy and protobuf round it)."""
    try:
        return _pack_float(v)
    except OverflowError:  # e.g. a perplexity exp(loss) past 3.4e38, or a float64 norm
        return _pack_float(math.copysign(math.inf, v))


# The tags of a step repeat from step to step: per tuple of tags, one Struct packs the whole
# Summary (each tag's bytes, then its float) in one call, and its length is known.
_layouts: Dict[Tuple[str, ...], Tuple[Any, bytes, Tuple[bytes, ...]]] = {}


def _layout(tags: Tuple[str, ...]) -> Tuple[Any, bytes, Tuple[bytes, ...]]:
    layout = _layouts.get(tags)
    if layout is None:
        prefixes = tuple(_prefix(tag) for tag in tags)
        packer = struct.Struct("<" + "".join(f"{len(p)}sf" for p in prefixes))
        layout = (packer.pack, b"\x2a" + _varint(packer.size), prefixes)
        if len(_layouts) < 10_000:
            _layouts[tags] = layout
    return layout


def encode_scalars(step: int, values: Mapping[str, float], wall_time: float) -> bytes:
    """The serialized ``Event`` holding ``values`` as ``simple_value`` scalars at ``step``."""
    pack, head, prefixes = _layout(tuple(values))
    try:  # each tag's bytes, then its float
        summary = pack(*itertools.chain.from_iterable(zip(prefixes, values.values())))
    except (OverflowError, struct.error):  # a value past float32 (+-inf), or no float at all
        summary = b"".join([_prefix(tag) + _float32(v) for tag, v in values.items()])
        head = b"\x2a" + _varint(len(summary))
    # proto3 leaves a zero step out; so do we, to stay byte-identical to the protobuf library.
    return b"".join((_pack_wall(9, wall_time), b"\x10" + _varint(step) if step else b"", head,
                     summary))


class EventFileWriter:
    """An append-only ``events.out.tfevents.*`` file in ``logdir``.

    Example::

        w = EventFileWriter("runs/exp1")
        w.write_scalars(step=1, values={"trainkit/step_time_ms": 12.5})
        w.flush(); w.close()
    """

    def __init__(self, logdir: str, *, filename_suffix: str = "",
                 resumed_at: Optional[int] = None) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        self._event_pb2 = event_pb2
        self._summary_pb2 = summary_pb2
        self._logdir, self._suffix = logdir, filename_suffix
        self._file: Optional[IO[bytes]] = None
        self._open()
        if resumed_at is not None:
            # A run resumed at this step: what earlier files hold from it on is orphaned.
            # TensorBoard's data server drops it at the first step written again; its legacy
            # loader (and EventAccumulator) at a SessionLog.START, but the legacy loader takes a
            # run's first START for its beginning, and only the next one as a restart: two here,
            # at the same step, so that it drops the same steps whichever it is.
            start = event_pb2.Event(wall_time=time.time(), step=resumed_at, session_log=(
                event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
            self._write_event(start)
            self._write_event(start)
        self.flush()

    def _open(self) -> None:
        os.makedirs(self._logdir, exist_ok=True)
        name = "events.out.tfevents.%010d.%s.%d.%06d%s" % (
            int(time.time()), socket.gethostname(), os.getpid(), next(_file_ids), self._suffix)
        self.path = os.path.join(self._logdir, name)
        self._file = open(self.path, "ab")
        self._write_event(self._event_pb2.Event(wall_time=time.time(),
                                                file_version="brain.Event:2"))

    def reopen_if_deleted(self) -> None:
        """Open a new file (the folder made again) if this one was deleted: its folder removed
        mid-run (a ``rm -rf runs/*`` of old runs that caught this one) sent the rest of the run,
        unsaid, to a file nobody can open. Said once per file; what the deleted file held is
        gone, what is written from now on is kept. TensorFlow's EventsWriter does the same."""
        f = self._file
        if f is None or os.fstat(f.fileno()).st_nlink > 0:
            return
        from .._text import say

        old, self._file = self.path, None
        try:
            f.close()
        except OSError:  # what it held is gone with it
            pass
        self._open()
        # said, never raised: where warnings are errors, raised in the write it was taken for a
        # failed one, and everything after it dropped
        say(f"trainkit: the event file {old!r} was deleted while the run went on (its folder "
            f"removed?); what it held is lost, what is recorded from now on goes to "
            f"{self.path!r}", RuntimeWarning, stacklevel=2)

    def _write_event(self, event: Any) -> None:
        self._write_record(event.SerializeToString())

    def _write_record(self, data: bytes) -> None:
        if self._file is None:
            raise ValueError(f"event file {self.path!r} is closed; open a new session to write again")
        n = len(data)
        header = _headers.get(n)  # a step's events repeat their length: its header and CRC too
        if header is None:
            header = _pack_len(n)
            header += _masked_crc_bytes(header)
            if len(_headers) < 10_000:
                _headers[n] = header
        x = _crc32c(data) & 0xFFFFFFFF  # masked_crc32c, inline: once per step
        self._file.write(b"".join((header, data,
                                   _pack_crc((((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF))))

    def write_scalars(self, *, step: int, values: Mapping[str, float],
                      wall_time: Optional[float] = None) -> None:
        """One event holding every ``tag -> value`` of ``step``."""
        if not values:
            return
        self._write_record(encode_scalars(step, values,
                                          time.time() if wall_time is None else wall_time))

    def write_summary(self, summary: Any, *, step: int = 0) -> None:
        """A prebuilt ``Summary`` protobuf (e.g. HParams plugin data)."""
        self._write_event(self._event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def write_text(self, tag: str, text: str, *, step: int = 0) -> None:
        """A markdown text summary, shown in TensorBoard's Text tab: what tensorboard's
        ``text_pb`` builds, built here from the protos already imported. ``text_pb`` imports
        numpy, and an import of numpy while Python exits from an unhandled KeyboardInterrupt (a
        session closed at exit, writing its last summaries) turns the exit status from -SIGINT
        into 1."""
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

        pb = self._summary_pb2
        value = pb.Summary.Value(
            tag=tag,
            metadata=pb.SummaryMetadata(plugin_data=pb.SummaryMetadata.PluginData(plugin_name="text")),
            tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING,
                                          tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                          string_val=[text.encode("utf-8")]))
        self.write_summary(pb.Summary(value=[value]), step=step)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


#: record length -> the record's header (its length, and that length's masked CRC)
_headers: Dict[int, bytes] = {}
# Two sessions started within the same second in one process must not share a file name, and
# sort (TensorBoard reads a folder's files in name order) in the order they started: the
# counter is zero-padded, so the tenth session's ".000010" sorts after the ninth's.
_file_ids = itertools.count(1)
