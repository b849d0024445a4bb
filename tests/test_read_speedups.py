"""trainkit._speedups.take_scalars, the C reading of event files' scalars, against the Python it
mirrors (ScalarsParse.take: eventfiles.scan's framing, then ScalarsParse.consume): the same
points (steps, values to the bit, tags in the same order), meta texts, ends of the complete
records, CRC stops and refused payloads (each where its record begins), and the same Cursor offsets and broken flags when a file is
read in chunks and again once grown.

The C decodes only payloads of plain ``simple_value`` scalars and hands any other to consume, in
order; the payloads here are made to sit on that border: session logs between scalars, texts,
histograms, values with metadata, oneof members one after the other, fields given twice,
unknown fields, empty summaries, non-canonical and negative varints, NaN bit patterns, tags
that are no UTF-8, truncated fields; and files written by trainkit's writer and by
torch.utils.tensorboard's SummaryWriter, torn at the end or corrupted in the middle.
"""
from __future__ import annotations

import os
import random
import struct
from typing import Any, List, Tuple

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2

from trainkit import recorder
from trainkit.profiling import eventfiles, runs
from trainkit.profiling.eventfiles import Cursor
from trainkit.profiling.points import ScalarsParse
from trainkit.profiling.reader import EventReader
from trainkit.sinks.tensorboard import EventFileWriter, masked_crc32c

fast = recorder._fast
pytestmark = pytest.mark.skipif(fast is None, reason="trainkit._speedups is not built here")
META = runs.META


# ---- protobuf's wire format, by hand --------------------------------------------------------
def varint(n: int, pad: int = 0) -> bytes:
    """``n`` (an int64: negative as its 64 bits) as a varint, ``pad`` bytes longer than needed."""
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    if pad:
        out[-1] |= 0x80
        out += b"\x80" * (pad - 1) + b"\0"
    return bytes(out)


def key(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def ld(field: int, body: bytes, pad: int = 0) -> bytes:
    return key(field, 2) + varint(len(body), pad) + body


def f32(field: int, bits: int) -> bytes:
    return key(field, 5) + struct.pack("<I", bits)


def value(tag: bytes, bits: int) -> bytes:
    return ld(1, tag) + f32(2, bits)


def event(step: int, values: List[bytes], wall: float = 1.7e9) -> bytes:
    return key(1, 1) + struct.pack("<d", wall) + key(2, 0) + varint(step) + \
        ld(5, b"".join(ld(1, v) for v in values))


def frame(payload: bytes) -> bytes:
    head = struct.pack("<Q", len(payload))
    return head + struct.pack("<I", masked_crc32c(head)) + payload + \
        struct.pack("<I", masked_crc32c(payload))


TAGS = [b"loss", b"trainkit/step_time_ms", b"trainkit/data_wait_ms", "r\u00e9gion/\u00fc".encode(),
        b"", META.encode() + b"x"]
ONE = 0x3F800000  # 1.0f
FLOATS = [0, 0x80000000, ONE, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 1,
          0x00400000, 0x7F7FFFFF]  # +-0, 1, +-inf, NaNs (a signalling one), subnormals, max


def _proto(step: int, **kw: Any) -> bytes:
    return event_pb2.Event(step=step, **kw).SerializeToString()


def _text(tag: str, text: str) -> summary_pb2.Summary.Value:
    return summary_pb2.Summary.Value(tag=tag, tensor={"dtype": 7, "string_val": [text.encode()]})


def odd_payloads(step: int) -> List[Tuple[str, bytes]]:
    """Payloads the C hands to consume (or that sit on its border), each at ``step``."""
    a, b = value(b"loss", ONE), value(b"odd", 0x40000000)
    hist = summary_pb2.Summary.Value(tag="loss", histo={"min": 0.0, "max": 1.0, "num": 2.0})
    meta = summary_pb2.Summary.Value(tag="loss", simple_value=2.5,
                                     metadata={"plugin_data": {"plugin_name": "scalars"}})
    start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
    return [
        ("start", _proto(step, session_log=start)),
        ("start_early", _proto(max(step - 7, 0), session_log=start)),
        ("stop", _proto(step, session_log={"status": event_pb2.SessionLog.STOP})),
        ("meta_text", _proto(step, summary={"value": [_text(META + "optimizers", f"t{step}")]})),
        ("other_text", _proto(step, summary={"value": [_text("notes", "n")]})),
        ("histogram", _proto(step, summary={"value": [hist]})),
        ("metadata", _proto(step, summary={"value": [meta]})),
        ("file_version", _proto(0, file_version="brain.Event:2")),
        ("only_step", key(2, 0) + varint(step)),
        ("empty", b""),
        ("empty_summary", event(step, [])),
        ("step_after_summary", ld(5, ld(1, a)) + key(2, 0) + varint(step)),
        ("step_twice", event(step + 100, [a]) + key(2, 0) + varint(step)),
        ("tag_twice", event(step, [ld(1, b"first") + value(b"second", ONE)])),
        ("value_twice", event(step, [value(b"v", ONE) + f32(2, 0x40400000)])),
        ("summary_twice", event(step, [a]) + ld(5, ld(1, b))),
        ("no_value", event(step, [ld(1, b"loss")])),
        ("simple_then_tensor", event(step, [a + ld(8, b"")])),
        ("tensor_then_simple", event(step, [ld(1, b"t") + ld(8, b"") + f32(2, ONE)])),
        ("node_name", event(step, [a + ld(7, b"node")])),
        ("unknown_in_event", event(step, [a]) + key(15, 0) + varint(3)),
        ("unknown_in_summary", key(2, 0) + varint(step) + ld(5, ld(1, a) + key(2, 0) + b"\x01")),
        ("unknown_in_value", event(step, [a + key(12, 5) + b"\0\0\0\0"])),
        ("wrong_wire_type", key(2, 2) + varint(1) + b"x" + event(step, [a])),
        ("padded_step", key(2, 0) + varint(abs(step), pad=2) + ld(5, ld(1, a))),
        ("padded_length", key(2, 0) + varint(step) + ld(5, ld(1, a, pad=1), pad=2)),
        ("bits_past_64", key(2, 0) + b"\xff" * 9 + b"\x7f" + ld(5, ld(1, a))),  # -1 to protobuf
        ("negative_step", event(-step - 1, [a, b])),
        ("min_step", event(-(1 << 63), [a])),
        ("long_key", b"\x90\x00" + varint(step) + ld(5, ld(1, a))),  # step's key, two bytes
    ]


REFUSED = {  # payloads protobuf refuses: reading stops there, said as -1 - where it begins
    "bad_utf8_tag": event(3, [value(b"\xff\xfe", ONE)]),
    "surrogate_tag": event(3, [value(b"\xed\xa0\x80", ONE)]),
    "bad_utf8_tag_no_value": event(3, [ld(1, b"\xc3")]),
    # a tag given twice: protobuf checks each one's UTF-8, not only the last one's (which the C
    # kept); found by fuzzing payloads framed with valid CRCs
    "bad_utf8_tag_then_good": event(3, [ld(1, b"f\xebrst") + value(b"second", ONE)]),
    "cut_wall_time": key(2, 0) + b"\x03" + key(1, 1) + b"\0" * 4,
    "cut_varint": key(2, 0) + b"\x80",
    "cut_float": event(3, [ld(1, b"loss") + key(2, 5) + b"\0\0"]),
    "length_past_end": key(5, 2) + varint(50) + b"\x0a",
    "eleven_byte_varint": key(2, 0) + b"\x80" * 10 + b"\x01",
    "field_zero": b"\x00\x01",
}


def scalar_payload(rng: random.Random, step: int) -> bytes:
    vals = [value(rng.choice(TAGS), rng.choice(FLOATS) if rng.random() < 0.3
                  else rng.getrandbits(32)) for _ in range(rng.randint(1, 6))]
    return event(step, vals, wall=rng.random() * 2e9)


def stream(rng: random.Random, n: int) -> List[bytes]:
    """``n`` payloads: scalar events at mostly rising steps, a tenth of them odd ones."""
    out, step = [], 0
    for _ in range(n):
        step += rng.choice([1, 1, 1, 0, 5, -3]) if rng.random() < 0.95 else -step
        if rng.random() < 0.1:
            out.append(rng.choice(odd_payloads(step))[1])
        else:
            out.append(scalar_payload(rng, rng.choice([step, step, -step, 1 << 40])))
    return out


# ---- the two readings compared ------------------------------------------------------------
def read(data: bytes, use_c: bool, parse: Any = None) -> Tuple[Any, ...]:
    """What parsing ``data`` left: take's result, the points (tag order, steps and values as
    bytes), the meta texts. Neither reading raises at a payload protobuf refuses (it returns
    ``-1 - pos`` there, TA112): a DecodeError out of either fails the test, where both raising
    once read as the same reading."""
    parse = parse or ScalarsParse(meta={}, meta_prefix=META)
    got: Any = fast.take_scalars(parse, data) if use_c else parse.take(data)
    return got, dump(parse.result()), parse.meta


def dump(points: Any) -> List[Tuple[str, bytes, bytes]]:
    return [(tag, p.steps.tobytes(), p.values.tobytes()) for tag, p in points.items()]


def same(data: bytes) -> Tuple[Any, ...]:
    c, py = read(data, True), read(data, False)
    assert c == py
    return c


@pytest.mark.parametrize("seed", range(12))
def test_random_streams_read_alike(seed):
    rng = random.Random(seed)
    data = b"".join(frame(p) for p in stream(rng, 400))
    got, points, _ = same(data)
    assert got == len(data) and sum(len(s) for _, s, _ in points) > 500


@pytest.mark.parametrize("kind", [k for k, _ in odd_payloads(0)])
def test_each_odd_payload_between_scalars_reads_alike(kind):
    rng = random.Random(kind)
    before = [scalar_payload(rng, s) for s in range(1, 30)]
    after = [scalar_payload(rng, s) for s in range(20, 40)]
    odd = dict(odd_payloads(25))[kind]
    got, points, meta = same(b"".join(frame(p) for p in before + [odd] + after))
    assert got > 0 and points
    if kind == "meta_text":
        assert meta == {META + "optimizers": "t25"}


def test_a_start_cuts_the_points_the_c_gathered_before_it():
    rng = random.Random(1)
    payloads = [scalar_payload(rng, s) for s in range(1, 50)]
    payloads.insert(30, odd_payloads(10)[0][1])  # START at step 10, after step 30
    _, points, _ = same(b"".join(frame(p) for p in payloads))
    steps = struct.unpack(f"<{len(points[0][1]) // 8}q", points[0][1])
    assert 30 not in steps and 40 in steps


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_a_refused_payload_stops_both_keeping_what_came_before(kind):
    rng = random.Random(kind)
    payloads = [scalar_payload(rng, s) for s in range(1, 20)]
    payloads += [REFUSED[kind]] + [scalar_payload(rng, s) for s in range(20, 30)]
    got, points, _ = same(b"".join(frame(p) for p in payloads))
    # the file is corrupt there (TA112): no DecodeError left to the caller, which stopped in silence
    assert got == -1 - sum(len(frame(p)) for p in payloads[:19]) and points


def test_torn_and_corrupt_chunks_stop_alike():
    rng = random.Random(7)
    data = b"".join(frame(p) for p in stream(rng, 60))
    for cut in sorted(rng.sample(range(len(data)), 60)) + list(range(0, 40)):
        same(data[:cut])
    for where in rng.sample(range(len(data)), 60):
        bad = bytearray(data)
        bad[where] ^= 1 << rng.randrange(8)
        got, _, _ = same(bytes(bad))
        # a CRC catches any one bit flipped (in a length, a payload or a CRC): a stop, said
        assert got < 0, (where, got)


def test_chunks_fed_one_after_another_read_alike():
    """The same ScalarsParse taking chunk after chunk (as parse_file feeds it): points kept
    aside between them, a START in a later chunk cutting an earlier one's."""
    rng = random.Random(3)
    chunks = [b"".join(frame(p) for p in stream(rng, 80)) for _ in range(5)]
    chunks[3] = frame(odd_payloads(40)[0][1]) + chunks[3]
    c, py = ScalarsParse(meta={}, meta_prefix=META), ScalarsParse(meta={}, meta_prefix=META)
    for chunk in chunks:
        assert fast.take_scalars(c, chunk) == py.take(chunk)
    assert dump(c.result()) == dump(py.result()) and c.meta == py.meta


def test_many_points_in_one_chunk_read_alike():
    """More points of a tag than the C gathers before adding them to the arrays (4096): added
    mid-chunk, tags first met after that in their order, a START and a text after it."""
    rng = random.Random(17)
    payloads = [event(s, [value(b"loss", rng.getrandbits(32)),
                          value(TAGS[1 + s // 3000], rng.getrandbits(32))])
                for s in range(12000)]
    payloads[9000:9000] = [odd_payloads(8500)[0][1], odd_payloads(8500)[3][1]]
    got, points, meta = same(b"".join(frame(p) for p in payloads))
    assert [tag for tag, _, _ in points][:2] == ["loss", TAGS[1].decode()] and len(points) == 5
    assert len(points[0][1]) // 8 == 12000 - 500 and meta


def test_plain_scalars_are_decoded_in_c():
    """consume is called for the payloads the C does not decode, and only for those."""
    calls: List[int] = []

    class Counting(ScalarsParse):
        def consume(self, payloads: Any) -> None:
            payloads = list(payloads)
            calls.append(len(payloads))
            super().consume(payloads)

    rng = random.Random(5)
    payloads = [scalar_payload(rng, s) for s in range(100)]
    payloads[50:50] = [odd_payloads(9)[0][1], odd_payloads(9)[3][1]]
    fast.take_scalars(Counting(meta={}, meta_prefix=META), b"".join(frame(p) for p in payloads))
    assert calls == [1, 1]


# ---- files, through parse_file and EventReader, with either path ----------------------------
def _both(monkeypatch: pytest.MonkeyPatch, fn: Any) -> Any:
    got = []
    for use_c in (True, False):
        monkeypatch.setattr(recorder, "_fast", fast if use_c else None)
        got.append(fn())
    assert got[0] == got[1]
    return got[0]


def _read_file(path: str, cursor: Any = None) -> Tuple[Any, ...]:
    parse = ScalarsParse(meta={}, meta_prefix=META)
    more = runs.parse_file(path, parse, cursor)
    at = (cursor.offset, cursor.broken, cursor.broken_at) if cursor is not None else None
    return more, at, dump(parse.result()), parse.meta


def _writers(folder: str) -> List[str]:
    from torch.utils.tensorboard import SummaryWriter

    rng = random.Random(11)
    w = EventFileWriter(os.path.join(folder, "tk"))
    w.write_text(META + "loader/0", "{}")
    sw = SummaryWriter(os.path.join(folder, "tb"))
    for s in range(1, 400):
        vals = {t.decode(): rng.choice([rng.random(), float("nan"), -0.0, 1e39])
                for t in rng.sample(TAGS, 3)}
        w.write_scalars(step=s, values=vals, wall_time=1.7e9 + s)
        for tag, v in vals.items():
            sw.add_scalar(tag, v, global_step=s)
        if s % 97 == 0:
            w.write_text(META + "optimizers", f"at {s}", step=s)
            sw.add_text(META + "optimizers", f"at {s}", global_step=s)
            sw.add_histogram("weights", np.array([rng.random() for _ in range(20)]), global_step=s)
            sw.add_scalars("group", {"a": 1.0, "b": float(s)}, global_step=s)
    w.close()
    sw.close()
    return [os.path.join(root, f) for root, _, files in os.walk(folder) for f in files
            if runs.EVENTS_MARK in f]


@pytest.mark.parametrize("chunk", [50, 1000, 1 << 22])
def test_files_of_both_writers_read_alike(tmp_path, monkeypatch, chunk):
    paths = _writers(str(tmp_path))
    assert len(paths) >= 3  # trainkit's, SummaryWriter's, add_scalars' own
    monkeypatch.setattr(eventfiles, "_CHUNK", chunk)
    for path in paths:
        more, at, points, _ = _both(monkeypatch, lambda: _read_file(path, Cursor()))
        assert more and at == (os.path.getsize(path), False, -1) and points
        size = os.path.getsize(path)
        with open(path, "r+b") as fh:  # torn, then corrupt in the middle
            fh.truncate(size - 5)
        assert _both(monkeypatch, lambda: _read_file(path, Cursor()))[1][1] is False
        with open(path, "r+b") as fh:
            fh.seek(size // 2)
            byte = fh.read(1)
            fh.seek(size // 2)
            fh.write(bytes([byte[0] ^ 0x10]))
        more, at, _, _ = _both(monkeypatch, lambda: _read_file(path, Cursor()))
        assert not more and at[1] is True and 0 <= at[2] <= size // 2


def _corrupt_record() -> bytes:
    head = struct.pack("<Q", 20)  # a header right, its payload's CRC wrong
    return head + struct.pack("<I", masked_crc32c(head)) + b"\0" * 24


def test_a_file_grown_between_reads_reads_alike(tmp_path, monkeypatch):
    """Read, grown by a torn record completed later, a START and a corrupt record: the cursor
    and what each read gives, the same with either path (the reader's too)."""
    rng = random.Random(13)
    path = str(tmp_path / "events.out.tfevents.1.host")
    records = [frame(p) for p in stream(rng, 300)]
    grown = [b"".join(records[:100]) + records[100][:9], records[100][9:] +
             b"".join(records[101:200]) + frame(odd_payloads(150)[0][1]),
             b"".join(records[200:]), _corrupt_record()]
    monkeypatch.setattr(eventfiles, "_CHUNK", 777)
    cursors = {True: Cursor(), False: Cursor()}
    parses = {u: ScalarsParse(meta={}, meta_prefix=META) for u in cursors}
    readers = {u: EventReader() for u in cursors}
    for part in grown:
        with open(path, "ab") as fh:
            fh.write(part)
        got = {}
        for use_c in (True, False):
            monkeypatch.setattr(recorder, "_fast", fast if use_c else None)
            more = runs.parse_file(path, parses[use_c], cursors[use_c])
            got[use_c] = (more, cursors[use_c].offset, cursors[use_c].broken,
                          parses[use_c].meta, cursors[use_c].broken_at,
                          readers[use_c].read(path), readers[use_c].damage(path))
        assert got[True][6] == got[False][6]
        assert got[True][:5] == got[False][:5]
        (c_points, c_meta), (py_points, py_meta) = got[True][5], got[False][5]
        assert dump(c_points) == dump(py_points) and c_meta == py_meta
    assert cursors[True].broken and dump(parses[True].result()) == dump(parses[False].result())
    assert cursors[True].broken_at == os.path.getsize(path) - len(_corrupt_record())
    assert readers[True].damage(path).offset == cursors[True].broken_at


@pytest.mark.parametrize("seed", range(4))
def test_mutated_payloads_with_valid_crcs_read_alike(seed):
    # Bytes changed, cut, inserted or dropped inside the payloads, then framed with right CRCs,
    # so the C decoder (not the CRC check) meets them: it keeps what protobuf keeps and refuses
    # what it refuses. 120,000 such cases found the tag given twice (bad_utf8_tag_then_good).
    rng = random.Random(1000 + seed)
    for _ in range(2500):
        out = []
        for p in stream(rng, rng.randint(1, 12)):
            b = bytearray(p)
            for _ in range(rng.choice([0, 1, 1, 2, 3, 8])):
                if not b:
                    break
                i, op = rng.randrange(len(b)), rng.random()
                if op < 0.5:
                    b[i] = rng.getrandbits(8)
                elif op < 0.7:
                    del b[i:i + rng.randint(1, 4)]
                elif op < 0.9:
                    b[i:i] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4)))
                else:
                    del b[i:]
            out.append(frame(bytes(b)))
        same(b"".join(out))
