"""A corrupt event file (a record whose CRC is wrong, more data after it) is TA112, naming the
file, the byte where it is corrupt and how many records were read before it; it was read up to
there with no word, and where nothing came before it, TA110 asked "is the optimizer patched?".
A record whose CRC is right but whose payload protobuf refuses as an ``Event`` is TA112 too (the
reading stopped there in silence). A record cut short at the end of the file is a run still being
written: nothing is said.

Both readers (trainkit._speedups' C and ``TRAINKIT_PURE_PYTHON=1``'s Python) say the same.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from typing import List, Tuple

import pytest

import trainkit as tk
from trainkit import recorder
from trainkit.profiling import eventfiles
from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.reader import EventReader
from trainkit.profiling.runs import EVENTS_MARK
from trainkit.sinks.tensorboard import masked_crc32c

from .conftest import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> str:
    """A real session's run of 30 steps."""
    logdir = str(tmp_path_factory.mktemp("good"))
    train(logdir, steps=30)
    return logdir


def _file(folder: str) -> str:
    (name,) = [f for f in os.listdir(folder) if EVENTS_MARK in f]
    return os.path.join(folder, name)


def _offsets(path: str) -> List[int]:
    with open(path, "rb") as fh:
        data = fh.read()
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    return out


#: a payload protobuf refuses as an Event: a summary (field 5) said 50 bytes long, holding one
REFUSED = b"\x2a\x32\x0a"


def _framed(payload: bytes) -> bytes:
    """``payload`` as a record whose CRCs are right."""
    head = struct.pack("<Q", len(payload))
    return (head + struct.pack("<I", masked_crc32c(head)) + payload
            + struct.pack("<I", masked_crc32c(payload)))


#: what TA112's evidence says of each damage
WHY = {"payload": "checksum (CRC) is wrong", "header": "checksum (CRC) is wrong",
       "torn": "checksum (CRC) is wrong", "refused": "protobuf refuses it"}


def _damaged(good: str, tmp_path, record: int, how: str = "payload") -> Tuple[str, str, int]:
    """A copy of the run with its ``record``-th record damaged: a payload byte flipped, a header
    byte flipped, half its payload gone (a record torn in the middle), or its payload replaced
    by one that is no ``Event``, its CRCs right ("refused"). Returns the folder, its event file
    and where the record begins."""
    folder = str(tmp_path / "run")
    shutil.copytree(good, folder)
    path = _file(folder)
    at = _offsets(path)[record]
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    if how == "payload":
        data[at + 14] ^= 0xFF
    elif how == "header":
        data[at] ^= 0x01
    elif how == "refused":
        data[at:_offsets(path)[record + 1]] = _framed(REFUSED)
    else:
        del data[at + 14:at + 20]
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    return folder, path, at


@pytest.fixture(params=["c", "python"])
def reader_kind(request, monkeypatch):
    if request.param == "c" and recorder._fast is None:
        pytest.skip("trainkit._speedups is not built here")
    if request.param == "python":
        monkeypatch.setattr(recorder, "_fast", None)
    return request.param


@pytest.mark.parametrize("how", ["payload", "header", "torn", "refused"])
def test_nothing_before_the_damage_is_ta112_not_ta110(good, tmp_path, reader_kind, how):
    folder, path, at = _damaged(good, tmp_path, 2, how)  # after the versions text
    found = tk.analyze(folder)
    assert [f.code for f in found] == ["TA112"], found
    f = found[0]
    assert path in f.evidence and f"byte {at:,}" in f.evidence, f.evidence
    assert WHY[how] in f.evidence, f.evidence
    assert "the 2 records before it were read" in f.evidence
    assert "no step could be analyzed" in f.evidence and f.severity == "high"
    assert "crash" in f.fix and "lost" in f.fix
    assert "patched" not in f.evidence + f.fix


@pytest.mark.parametrize("how", ["payload", "refused"])
def test_damage_in_the_middle_says_what_was_read(good, tmp_path, reader_kind, how):
    folder, path, at = _damaged(good, tmp_path, 15, how)
    found = tk.analyze(folder)
    (f,) = [f for f in found if f.code == "TA112"]
    assert f"byte {at:,} of {os.path.getsize(path):,}" in f.evidence
    assert "the 15 records before it were read" in f.evidence
    assert "the analysis covers the" in f.evidence and f.severity == "medium"


def test_a_torn_last_record_is_a_run_being_written(good, tmp_path, reader_kind):
    folder = str(tmp_path / "run")
    shutil.copytree(good, folder)
    path = _file(folder)
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 7)
    assert not [f for f in tk.analyze(folder) if f.code == "TA112"]


@pytest.mark.parametrize("how", ["payload", "refused"])
def test_the_tab_reader_finds_the_damage_as_a_file_grows(good, tmp_path, reader_kind, how):
    """The tab's reader reads a live run's appended bytes only: a corrupt record appended, then
    more records, is TA112 at the same byte, and stays so at later reads (the file is not read
    again)."""
    folder = str(tmp_path / "run")
    os.mkdir(folder)
    src = _file(good)
    with open(src, "rb") as fh:
        data = fh.read()
    cut = _offsets(src)[20]
    path = os.path.join(folder, os.path.basename(src))
    with open(path, "wb") as fh:
        fh.write(data[:cut])
    reader = EventReader()
    first = analyze_run(folder, folder, reader=reader)
    assert not [f for f in first.findings if f.code == "TA112"]
    bad = bytearray(data[cut:])
    if how == "refused":
        bad[:_offsets(src)[21] - cut] = _framed(REFUSED)
    else:
        bad[14] ^= 0xFF
    with open(path, "ab") as fh:
        fh.write(bytes(bad))
    parsed = reader.parsed_bytes
    for _ in range(2):
        (f,) = [f for f in analyze_run(folder, folder, reader=reader).findings
                if f.code == "TA112"]
        assert f"byte {cut:,}" in f.evidence and "the 20 records before it" in f.evidence
        assert WHY[how] in f.evidence
    assert reader.parsed_bytes == parsed  # the records before it were in the first read


@pytest.mark.parametrize("how", ["payload", "refused"])
def test_cursor_says_where_alike_in_c_and_python(good, tmp_path, monkeypatch, how):
    if recorder._fast is None:
        pytest.skip("trainkit._speedups is not built here")
    folder, path, at = _damaged(good, tmp_path, 17, how)
    got = []
    for fast in (recorder._fast, None):
        for chunk in (50, 700, 1 << 22):
            monkeypatch.setattr(recorder, "_fast", fast)
            monkeypatch.setattr(eventfiles, "_CHUNK", chunk)
            damaged: list = []
            from trainkit.profiling.runs import read_scalars

            read_scalars(folder, meta={}, damaged=damaged)
            got.append(damaged)
    refused = how == "refused"
    assert all(g == [eventfiles.Damage(path=path, offset=at, records=17,
                                       size=os.path.getsize(path), refused=refused)]
               for g in got), got


@pytest.mark.parametrize("how", ["payload", "refused"])
@pytest.mark.parametrize("pure", ["0", "1"])
def test_trainkit_analyze_names_the_corrupt_file(good, tmp_path, pure, how):
    folder, path, at = _damaged(good, tmp_path, 2, how)
    env = dict(os.environ, TRAINKIT_PURE_PYTHON=pure, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "trainkit", "analyze", folder], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "TA112" in done.stdout and path in done.stdout and f"byte {at:,}" in done.stdout
    assert "TA110" not in done.stdout and "patched" not in done.stdout
    assert WHY[how] in " ".join(done.stdout.split())
