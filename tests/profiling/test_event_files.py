"""Reading event files in chunks (trainkit/profiling/eventfiles.py) gives what reading them whole
gave: the same records, stopping at the same torn or corrupt record; and the scalars of a run
longer than one protobuf message's reuse (4096 records) are TensorBoard's.

A long run's file is hundreds of megabytes: read whole, and parsed into one reused ``Event``
(whose arena keeps every parse), a 1M-step run took ~2 GB to read.
"""
from __future__ import annotations

import os

import pytest

from trainkit.profiling import eventfiles
from trainkit.profiling.eventfiles import event_records, records_in
from trainkit.profiling.runs import read_scalars
from trainkit.sinks.tensorboard import EventFileWriter

from ..conftest import scalars


def _run(folder: str, steps: int, *, text: str = "") -> str:
    w = EventFileWriter(folder)
    if text:
        w.write_text("trainkit/meta/big", text)
    for s in range(1, steps + 1):
        w.write_scalars(step=s, values={"trainkit/step_time_ms": 40.0 + s % 7, "loss": 1.0 / s},
                        wall_time=1.7e9 + s)
    w.close()
    return w.path


def _whole(path: str) -> list:
    with open(path, "rb") as fh:
        return list(records_in(fh.read()))


@pytest.mark.parametrize("chunk", [13, 64, 100, 4096])
def test_records_read_in_chunks_are_those_read_whole(tmp_path, monkeypatch, chunk):
    # A record larger than a chunk too (a text summary of 5,000 bytes).
    path = _run(str(tmp_path), 300, text="x" * 5000)
    whole = _whole(path)
    assert len(whole) == 302  # the file version, the text, 300 steps
    monkeypatch.setattr(eventfiles, "_CHUNK", chunk)
    assert list(event_records(path)) == whole


@pytest.mark.parametrize("damage", ["torn", "corrupt"])
def test_chunks_stop_where_a_whole_read_stops(tmp_path, monkeypatch, damage):
    """A file cut inside a record (being written), or with a wrong CRC in its middle: the
    records before it, and none after."""
    path = _run(str(tmp_path), 200)
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        if damage == "torn":
            fh.truncate(size - 7)
        else:
            fh.seek(size // 2)
            byte = fh.read(1)
            fh.seek(size // 2)
            fh.write(bytes([byte[0] ^ 0xFF]))
    whole = _whole(path)
    assert 50 < len(whole) < 201, len(whole)
    for chunk in (17, 256, 1 << 20):
        monkeypatch.setattr(eventfiles, "_CHUNK", chunk)
        assert list(event_records(path)) == whole, chunk


def test_a_run_of_more_records_than_one_message_holds_reads_as_tensorboard(tmp_path):
    # read_scalars parses into a fresh Event every 4096 records: across those boundaries, and
    # the 4 MiB chunks', every point is TensorBoard's.
    _run(str(tmp_path), 10_000)
    assert read_scalars(str(tmp_path)) == scalars(str(tmp_path))
