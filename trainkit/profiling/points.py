"""A tag's scalars as a run's reader keeps them: steps and values in two typed arrays.

A list of ``(step, value)`` tuples costs ~100 bytes a point (the tuple, the int, the float); a run
of 1,000,000 steps and ~10 tags held ~0.8 GB of them. :class:`Points` holds the same points in an
``array('q')`` of steps and an ``array('d')`` of values, 16 bytes a point, and reads as the list
did: it iterates, indexes, slices and compares (``==``) as the list of tuples, so every consumer
of :func:`.runs.read_scalars` keeps working; a hot one reads :attr:`Points.steps` and
:attr:`Points.values` directly.
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import compress
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union, overload

from .eventfiles import scan


def step_array() -> "array[int]":
    """An empty array of steps (int64, as an ``Event``'s step is)."""
    return array("q")


def value_array() -> "array[float]":
    """An empty array of values (float64: a ``simple_value``'s float32 is exact in it)."""
    return array("d")


class Points(Sequence):
    """A tag's points, ``(step, value)`` in the order written; read-only.

    Example::

        pts = Points.of([(1, 2.0), (2, 3.5)]); pts[0] == (1, 2.0); pts == [(1, 2.0), (2, 3.5)]
        dict(zip(pts.steps, pts.values))
    """

    __slots__ = ("steps", "values")

    def __init__(self, steps: "array[int]", values: "array[float]") -> None:
        if len(steps) != len(values):
            raise ValueError(f"Points: {len(steps)} steps but {len(values)} values; "
                             f"pass arrays of the same length")
        #: the steps, an ``array('q')``; not to be changed
        self.steps = steps
        #: the values, an ``array('d')``; not to be changed
        self.values = values

    @classmethod
    def of(cls, pairs: Any) -> "Points":
        """Points from ``(step, value)`` pairs (a list of tuples, or another :class:`Points`)."""
        if isinstance(pairs, Points):
            return pairs
        steps, values = step_array(), value_array()
        for step, value in pairs:
            steps.append(step)
            values.append(value)
        return cls(steps, values)

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[Tuple[int, float]]:
        return zip(self.steps, self.values)

    def __reversed__(self) -> Iterator[Tuple[int, float]]:
        return zip(reversed(self.steps), reversed(self.values))

    @overload
    def __getitem__(self, i: int) -> Tuple[int, float]: ...

    @overload
    def __getitem__(self, i: slice) -> "Points": ...

    def __getitem__(self, i: Union[int, slice]) -> Union[Tuple[int, float], "Points"]:
        if isinstance(i, slice):
            return Points(self.steps[i], self.values[i])
        return self.steps[i], self.values[i]

    def __contains__(self, point: object) -> bool:
        return any(p == point for p in self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Points):
            return self.steps == other.steps and self.values == other.values
        if isinstance(other, list):  # not a tuple of them, which the list did not equal either
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compares as a list does, and is as unhashable

    def __repr__(self) -> str:
        shown = list(self[:3])
        more = f", ... {len(self) - 3} more" if len(self) > 3 else ""
        return f"Points({str(shown)[:-1]}{more}])"

    def below(self, until: int) -> "Points":
        """The points whose step is below ``until``, in order (itself where all are)."""
        steps = self.steps
        if not steps or max(steps) < until:
            return self
        keep = [s < until for s in steps]
        return Points(array("q", compress(steps, keep)), array("d", compress(self.values, keep)))

    def then(self, more: "Optional[Points]") -> "Points":
        """These points followed by ``more``'s, as a new :class:`Points` (itself where ``more``
        is None; neither is changed: a run read earlier may hold either)."""
        if more is None:
            return self
        return Points(self.steps + more.steps, self.values + more.values)

    def first_step(self) -> int:
        """The smallest step (the points are not sorted after a restart).

        Raises:
            ValueError: there is no point.
        """
        return min(self.steps)


class ScalarsParse:
    """The scalars and ``trainkit/meta/...`` texts of event records, parsed as they come: what
    :func:`.runs.read_scalars` reads, and :class:`.reader.EventReader` goes on reading once a
    file grew (``points`` and ``meta`` as an earlier parse left them).

    Each tag's :class:`Points` in :attr:`points` is never changed once made (a run read earlier
    may hold it): the points parsed since are kept aside and joined on at :meth:`result`, or at a
    ``SessionLog.START``, which drops the points parsed so far whose step is its own or later.
    """

    def __init__(self, points: Optional[Dict[str, Points]] = None,
                 meta: Optional[Dict[str, str]] = None, *, meta_prefix: str = "") -> None:
        self.points: Dict[str, Points] = dict(points or {})
        #: ``tag -> text`` of the texts under ``meta_prefix`` (the last one of a tag wins); None:
        #: none kept
        self.meta = meta
        self._prefix = meta_prefix
        # tag -> the appends of the steps and values parsed since the last join
        self._new: Dict[str, Tuple[Any, Any]] = {}
        self._fresh: Dict[str, Points] = {}

    def consume(self, payloads: Iterable[bytes]) -> None:
        """Parse the records' payloads (``Event`` protobufs), in order.

        Raises:
            google.protobuf.message.DecodeError: a payload is no ``Event``; those before it are
                kept.
        """
        from tensorboard.compat.proto import event_pb2

        event = None
        start = event_pb2.SessionLog.START
        new, meta, prefix = self._new, self.meta, self._prefix
        for i, payload in enumerate(payloads):
            if not i & 4095:  # a message parsed into again keeps every parse's memory
                event = event_pb2.Event()  # (upb's arena): ~0.9 GB of a 1M-step run's 2
            event.ParseFromString(payload)
            if event.HasField("summary"):
                step = event.step
                for value in event.summary.value:
                    if value.HasField("simple_value"):
                        add = new.get(value.tag)
                        if add is None:
                            add = self._open(value.tag)
                        add[0](step)
                        add[1](value.simple_value)
                    elif meta is not None and value.tag.startswith(prefix) \
                            and value.HasField("tensor") and value.tensor.string_val:
                        meta[value.tag] = value.tensor.string_val[0].decode("utf-8", "replace")
            elif event.HasField("session_log") and event.session_log.status == start:
                self._join()  # a restart: later steps are orphaned
                self.points = {tag: points.below(event.step)
                               for tag, points in self.points.items()}

    def _open(self, tag: str) -> Tuple[Any, Any]:
        """A tag's first point since the last join: its fresh :class:`Points` made, and the
        appends of its steps and values."""
        got = self._fresh[tag] = Points(step_array(), value_array())
        add = self._new[tag] = (got.steps.append, got.values.append)
        return add

    def take(self, data: bytes) -> int:
        """Parse the complete records at the start of ``data``, a chunk of an event file
        (:func:`.eventfiles.chunks_taken` hands them out): :func:`.eventfiles.scan`'s framing,
        then :meth:`consume`. Returns where the first incomplete record begins (the end of
        ``data`` where none is), or ``-1 - pos`` at a wrong CRC in the record beginning at ``pos``,
        or at a payload there that protobuf refuses as an ``Event`` (the records before it
        parsed): a corrupt file, said where (:class:`.eventfiles.Damage`), not a silent stop.

        ``trainkit._speedups.take_scalars(parse, data)`` does the same in C (the records'
        scalars decoded by hand, each payload it does not fully understand parsed here by
        :meth:`consume`, in order): what :func:`.runs.parse_file` uses where it is built.
        """
        from google.protobuf.message import DecodeError

        got: List[bytes] = []
        pos = scan(data, got)
        try:
            self.consume(got)
        except DecodeError:
            return -1 - _refused_at(got)
        return pos

    def _join(self) -> None:
        for tag, got in self._fresh.items():
            was = self.points.get(tag)
            self.points[tag] = got if was is None else was.then(got)
        self._new.clear()
        self._fresh.clear()

    def result(self) -> Dict[str, Points]:
        """``tag -> points`` of the tags holding any."""
        self._join()
        return {tag: points for tag, points in self.points.items() if points}


def _refused_at(payloads: List[bytes]) -> int:
    """Where the first of ``payloads`` (a chunk's records, from its start) that protobuf refuses
    as an ``Event`` begins: :meth:`ScalarsParse.consume` stopped there (each payload is parsed
    alone). Found once the consume failed: a corrupt file is rare."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    pos = 0
    for payload in payloads:
        try:
            event_pb2.Event.FromString(payload)
        except DecodeError:
            return pos
        pos += 16 + len(payload)  # the framing: length, its CRC; the payload; its CRC
    raise AssertionError("consume refused a payload that parses alone")

