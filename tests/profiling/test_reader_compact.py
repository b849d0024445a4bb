"""read_scalars keeps each tag's points in two typed arrays (runs.Points), not a list of tuples:
a run of 1,000,000 steps and ~10 tags held ~0.8 GB of tuples. The points read as the list did."""
from __future__ import annotations

import tracemalloc

from trainkit.profiling.runs import load_run, read_scalars
from trainkit.sinks.tensorboard import EventFileWriter

TAGS = ("trainkit/step_time_ms", "trainkit/data_wait_ms", "trainkit/update_ms", "loss")


def _value(step: int, i: int) -> float:
    return step * (i + 1) / 8.0  # exact in float32, as a simple_value is written


def _write(folder, first: int, last: int, tags=TAGS) -> None:
    w = EventFileWriter(str(folder))
    for step in range(first, last + 1):
        w.write_scalars(step=step, values={t: _value(step, i) for i, t in enumerate(tags)})
    w.close()


def _expected(first: int, last: int, tags=TAGS):
    return {t: [(s, _value(s, i)) for s in range(first, last + 1)] for i, t in enumerate(tags)}


def test_points_read_compare_index_and_iterate_as_the_list_of_tuples(tmp_path):
    _write(tmp_path, 1, 50)
    got = read_scalars(str(tmp_path))
    want = _expected(1, 50)
    assert got == want and want == got  # either side of ==, as the dict of lists compared
    pts, old = got["loss"], want["loss"]
    assert list(pts) == old and len(pts) == 50 and bool(pts)
    assert pts[0] == (1, 1 / 2) and pts[-1] == old[-1] and pts[10:13] == old[10:13]
    assert list(reversed(pts)) == old[::-1] and (3, 3 / 2) in pts and (3, 0.0) not in pts
    assert [s for s, _ in pts] == list(range(1, 51)) and dict(pts) == dict(old)
    assert pts != old[:-1] and pts != [(s, v + 1) for s, v in old] and pts != tuple(old)
    assert pts.index((5, 5 / 2)) == 4 and pts.count((5, 5 / 2)) == 1
    assert max(s for s, _ in pts) == 50 and sorted(pts)[0] == (1, 0.5)
    assert isinstance(pts[0][0], int) and isinstance(pts[0][1], float)
    assert "(1, 0.5)" in repr(pts)


def test_a_restart_and_a_second_session_keep_the_same_points(tmp_path):
    """SessionLog.START drops the steps from its own on; a later session (load_run's merge)
    drops the earlier one's from its first counted step: the same as the lists were."""
    from tensorboard.compat.proto import event_pb2

    w = EventFileWriter(str(tmp_path))
    for step in range(1, 31):
        w.write_scalars(step=step, values={t: _value(step, i) for i, t in enumerate(TAGS)})
    w._write_event(event_pb2.Event(step=20, session_log=event_pb2.SessionLog(
        status=event_pb2.SessionLog.START)))
    w.write_scalars(step=20, values={"loss": 99.0})
    w.close()
    got = read_scalars(str(tmp_path))
    want = _expected(1, 19)
    want["loss"].append((20, 99.0))
    assert got == want
    _write(tmp_path, 10, 25)  # a resumed session in the same folder (its file sorts after)
    run = load_run(str(tmp_path), str(tmp_path))
    merged = {t: [p for p in want[t] if p[0] < 10] + _expected(10, 25)[t] for t in TAGS}
    assert run.scalars == merged
    assert run.values("loss") == dict(merged["loss"])


def test_the_points_of_a_long_run_take_a_fraction_of_the_lists_memory(tmp_path):
    """20,000 steps of 4 tags: 80,000 points held ~8 MB as tuples (~100 bytes each), and as two
    arrays 16 bytes each (1.3 MB, and some slack as the arrays grew)."""
    steps = 20_000
    _write(tmp_path, 1, steps)
    read_scalars(str(tmp_path))  # protobuf's and the reader's imports, out of the measure
    tracemalloc.start()
    try:
        got = read_scalars(str(tmp_path))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    points = sum(len(p) for p in got.values())
    assert points == steps * len(TAGS) and got == _expected(1, steps)
    assert held / points < 30, f"{held / points:.0f} bytes a point held (a tuple's: ~100)"
