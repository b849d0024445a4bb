"""Reading an event file's records: TFRecord framing, as TensorBoard's writer and trainkit's write it.

Each record is its payload's length (8 bytes), that length's masked CRC32C (4), the payload (an
``Event`` protobuf) and its masked CRC32C (4). A file being written ends in a record not complete
yet, and a torn or corrupt one in a record whose CRC is wrong (or whose payload, its CRC right,
protobuf refuses as an ``Event``): reading stops there, as TensorBoard's reader does, and what
comes before is kept. The first is a run still being written and says nothing; the second lost
what follows, and :class:`Damage` says where (the analysis reports it: TA112). A long run's file is hundreds of megabytes, so it is read in chunks, not whole.
"""
from __future__ import annotations

import dataclasses
import os
import struct
from typing import Callable, Iterator, List, Optional

from ..sinks.tensorboard import masked_crc32c

_HEADER = struct.Struct("<QI")  # a record's payload length, and that length's masked CRC
_CRC = struct.Struct("<I")


class Cursor:
    """Where reading an event file got to, for a reader that reads it again once it grew.

    ``offset``: the byte after the last complete record read (where the next one begins);
    ``broken``: a record's CRC was wrong there, so nothing after it is read, now or later (the
    file only grows by records appended after it), as TensorBoard's reader stops there;
    ``broken_at``: where that record begins (-1 while none is).
    """

    __slots__ = ("offset", "broken", "broken_at")

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self.broken = False
        self.broken_at = -1


@dataclasses.dataclass(frozen=True)
class Damage:
    """A corrupt event file: a record whose CRC is wrong (a crash that cut the run, a damaged
    file), or whose payload protobuf refuses as an ``Event`` (its CRC right: the bytes were
    written so); it and the bytes after it are not read. A record cut short at the end of the
    file is no damage: that is a run still being written.

    Example::

        d = damage_of(path, cursor); print(d.offset, d.records)  # where, and what came before
    """

    #: the event file
    path: str
    #: the byte where the bad record begins: nothing from there on is read
    offset: int
    #: the complete records read before it (the first is the file's version record)
    records: int
    #: the file's size when read: ``size - offset`` bytes are lost
    size: int
    #: the record's CRCs are right, its payload is no ``Event`` (protobuf refuses it)
    refused: bool = False


def damage_of(path: str, cursor: Cursor) -> Optional[Damage]:
    """The :class:`Damage` that stopped the reading of ``path`` with ``cursor`` (None where
    none did). The records before it are counted here, once: a corrupt file is rare, and counting
    them as they are read would cost every read of every file."""
    if not cursor.broken or cursor.broken_at < 0:
        return None
    try:
        size = os.path.getsize(path)
        records = records_before(path, cursor.broken_at)
        refused = _crcs_right(path, cursor.broken_at)
    except OSError:  # gone meanwhile
        return None
    return Damage(path=path, offset=cursor.broken_at, records=records, size=size,
                  refused=refused)


def _crcs_right(path: str, offset: int) -> bool:
    """Whether the record at ``offset`` of ``path`` is whole and its CRCs right: then what
    stopped the reading there was its payload, which protobuf refused."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        head = fh.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return False
        length, head_crc = _HEADER.unpack(head)
        if masked_crc32c(head[:8]) != head_crc:
            return False
        payload = fh.read(length + _CRC.size)
    return len(payload) == length + _CRC.size and \
        masked_crc32c(payload[:length]) == _CRC.unpack_from(payload, length)[0]


def records_before(path: str, offset: int) -> int:
    """How many records of ``path`` begin before byte ``offset`` (the start of a record), their
    lengths read from their headers: the CRCs were checked as they were read."""
    count = pos = base = 0
    data = b""
    with open(path, "rb") as fh:
        while pos < offset:
            if pos + _HEADER.size > base + len(data):  # the next header is not in the chunk
                fh.seek(pos)
                data, base = fh.read(_CHUNK), pos
                if len(data) < _HEADER.size:
                    break
            pos += _HEADER.size + _CRC.size + _HEADER.unpack_from(data, pos - base)[0]
            count += 1
    return count


def event_records(path: str, cursor: Optional[Cursor] = None) -> Iterator[bytes]:
    """The payloads of an event file's records, in order (the framing the writer writes).

    Stops, as TensorBoard's reader does, at a record still being written (the file of a run in
    progress) or one whose CRC is wrong (a torn or corrupt file): what comes before is kept.
    Read in chunks of :data:`_CHUNK` bytes: a long run's file is hundreds of megabytes.

    ``cursor``: read from ``cursor.offset`` (the start of a record: where an earlier read
    ended), and move it on past each chunk's complete records as they are handed out.
    """
    got: List[bytes] = []

    def take(data: bytes) -> int:
        del got[:]
        return scan(data, got)

    for _ in chunks_taken(path, take, cursor):
        yield from got


def chunks_taken(path: str, take: Callable[[bytes], int],
                 cursor: Optional[Cursor] = None) -> Iterator[None]:
    """Hand ``take`` the event file's bytes in chunks of :data:`_CHUNK`, each beginning with a
    record (the incomplete one a chunk ended in begins the next); yields after each, and moves
    ``cursor`` on once resumed (the chunk's records used: :func:`event_records` hands them out
    first). ``take(data)`` deals with the complete records at the start of ``data`` and returns
    where the first incomplete one begins (the end of ``data`` where none is), or ``-1 - pos`` at
    a wrong CRC (or a payload that is no ``Event``, where ``take`` parses them) in the record
    beginning at ``pos``: reading stops there, and ``cursor.broken`` is
    set, ``cursor.broken_at`` to that record's offset in the file (``cursor.offset`` stays where
    the chunk began). :func:`scan` is the framing; ``ScalarsParse.take`` parses the records too.
    """
    with open(path, "rb") as fh:
        base = cursor.offset if cursor is not None else 0
        if base:
            fh.seek(base)
        rest = b""
        while True:
            more = fh.read(_CHUNK)
            data = rest + more if rest else more
            pos = take(data)
            yield
            if cursor is not None:
                if pos < 0:  # the offset stays where the chunk began: never read again
                    cursor.broken = True
                    cursor.broken_at = base - 1 - pos
                else:
                    cursor.offset = base + pos
            if pos < 0 or not more:
                return
            rest = data[pos:]
            base += pos


#: How much of an event file :func:`event_records` reads at a time.
_CHUNK = 4 << 20


def records_in(data: bytes) -> Iterator[bytes]:
    """The payloads of the complete records at the start of ``data`` (a file's first bytes)."""
    got: List[bytes] = []
    scan(data, got)
    return iter(got)


def scan(data: bytes, out: List[bytes]) -> int:
    """Put the payloads of ``data``'s complete records into ``out``; returns where the first
    incomplete one begins (the end of ``data`` where none is), or ``-1 - pos`` at a wrong CRC in
    the record beginning at ``pos`` (-1: the first)."""
    pos, end = 0, len(data)
    while pos + _HEADER.size <= end:
        length, header_crc = _HEADER.unpack_from(data, pos)
        if masked_crc32c(data[pos:pos + 8]) != header_crc:
            return -1 - pos
        start = pos + _HEADER.size
        stop = start + length + _CRC.size
        if stop > end:
            return pos
        payload = data[start:start + length]
        if masked_crc32c(payload) != _CRC.unpack_from(data, stop - _CRC.size)[0]:
            return -1 - pos
        out.append(payload)
        pos = stop
    return pos
