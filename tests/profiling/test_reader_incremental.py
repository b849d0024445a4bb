"""EventReader (the tab's) parses only the records appended to an event file since its last read,
and reads what a fresh read_scalars of the file reads: a record cut in half at the end, a
SessionLog.START appended, meta texts, a file replaced or rewritten smaller."""
from __future__ import annotations

import os
import shutil

from trainkit.profiling.analyze import analyze_run
from trainkit.profiling.reader import EventReader
from trainkit.profiling.runs import load_run, read_scalars
from trainkit.sinks.tbplugin.data import TabData
from trainkit.sinks.tensorboard import EventFileWriter

TAGS = ("trainkit/step_time_ms", "trainkit/data_wait_ms", "trainkit/update_ms", "loss")
RESTARTS = {}  # event file -> where its SessionLog.START begins


def _session(folder, first: int, last: int, *, restart_at: int = 0) -> str:
    """A real event file: steps ``first..last`` of TAGS, a meta text, and, with ``restart_at``,
    a SessionLog.START at that step after step ``last`` followed by steps from there again (its
    offset in the file: :data:`RESTARTS`)."""
    from tensorboard.compat.proto import event_pb2

    w = EventFileWriter(str(folder))
    w.write_text("trainkit/meta/optimizers", "first", step=0)
    for step in range(first, last + 1):
        w.write_scalars(step=step, values={t: step * (i + 1) / 4.0 for i, t in enumerate(TAGS)})
        if step == (first + last) // 2:
            w.write_text("trainkit/meta/optimizers", "second", step=step)
    if restart_at:
        w.flush()
        RESTARTS[w.path] = os.path.getsize(w.path)
        w._write_event(event_pb2.Event(step=restart_at, session_log=event_pb2.SessionLog(
            status=event_pb2.SessionLog.START)))
        for step in range(restart_at, restart_at + 5):
            w.write_scalars(step=step, values={"loss": -float(step), TAGS[0]: 1.0})
    w.close()
    return w.path


def _fresh(path: str):
    meta: dict = {}
    got = read_scalars(os.path.dirname(path), [os.path.basename(path)], meta=meta)
    return got, meta


def _grow_in_pieces(source: str, target: str, cuts):
    """Copy ``source`` into ``target`` (one file, appended to: the same inode) up to each cut."""
    data = open(source, "rb").read()
    done = 0
    for cut in cuts:
        with open(target, "ab") as fh:
            fh.write(data[done:cut])
        done = cut
        yield cut


def test_a_growing_file_read_again_equals_a_fresh_read_and_only_new_bytes_are_parsed(tmp_path):
    src = _session(tmp_path / "src", 1, 400, restart_at=150)
    size = os.path.getsize(src)
    (tmp_path / "live").mkdir()
    live = str(tmp_path / "live" / os.path.basename(src))
    reader = EventReader()
    # cuts inside records (a record written in part, completed by the next piece), and the end
    cuts = [size // 7, size // 7 + 3, size // 3, size // 2 + 11, size - 5, size]
    for cut in _grow_in_pieces(src, live, cuts):
        got, meta = reader.read(live)
        assert (got, meta) == _fresh(live), f"cut at {cut} of {size}"
        assert reader.parsed_bytes <= cut
    # each byte was parsed once (a record cut in two: once completed)
    assert reader.parsed_bytes == size
    got, meta = reader.read(live)
    assert reader.parsed_bytes == size, "an unchanged file was parsed again"
    assert meta == {"trainkit/meta/optimizers": "second"}
    assert [s for s, _ in got["loss"]][-6:] == [149, 150, 151, 152, 153, 154]  # the START's rule
    assert max(s for s, _ in got["trainkit/update_ms"]) == 149


def test_a_restart_appended_later_drops_the_points_already_read(tmp_path):
    src = _session(tmp_path / "src", 1, 100, restart_at=40)
    data = open(src, "rb").read()
    restart = RESTARTS[src]
    (tmp_path / "live").mkdir()
    live = str(tmp_path / "live" / os.path.basename(src))
    reader = EventReader()
    for cut in _grow_in_pieces(src, live, [restart - 20, restart + 7, len(data)]):
        got, meta = reader.read(live)
        assert (got, meta) == _fresh(live)
    assert max(s for s, _ in got["trainkit/data_wait_ms"]) == 39


def test_a_file_replaced_or_rewritten_smaller_is_read_again_whole(tmp_path):
    reader = EventReader()
    folder = tmp_path / "run"
    path = _session(folder, 1, 300)
    assert reader.read(path) == _fresh(path)
    # replaced (another inode) by a smaller file of the same name
    small = _session(tmp_path / "other", 1, 40)
    shutil.copyfile(small, path + ".new")
    os.replace(path + ".new", path)
    got = reader.read(path)
    assert got == _fresh(path) and len(got[0]["loss"]) == 40
    # rewritten in place (the same inode), smaller, then larger than what was read: another
    # session's first bytes
    bigger = _session(tmp_path / "third", 500, 900)
    for source in (_session(tmp_path / "fourth", 7, 9), bigger):
        with open(path, "r+b") as fh:
            fh.truncate(0)
            fh.write(open(source, "rb").read())
        assert reader.read(path) == _fresh(path)
    assert [s for s, _ in reader.read(path)[0]["loss"]][:2] == [500, 501]
    os.remove(path)
    assert reader.read(path) == ({}, {})


def test_load_run_and_the_tab_with_a_reader_equal_a_fresh_read_as_the_run_grows(tmp_path):
    """Two sessions in one folder (a rerun), the later one growing, read through the tab."""
    logdir = tmp_path / "logs"
    folder = logdir / "exp"
    _session(folder, 1, 120)
    src = _session(tmp_path / "src", 1, 300)
    live = str(folder / ("events.out.tfevents.9999999999.z" + os.path.basename(src)[-12:]))
    data = TabData(str(logdir))
    size = os.path.getsize(src)
    cut1 = size // 3 + 5
    for cut in _grow_in_pieces(src, live, [cut1, size]):
        before = data._reader.parsed_bytes
        report = dict(data.report("exp"))
        report.pop("ablation")
        assert report == analyze_run(str(folder), str(folder), name="exp").to_dict()
        ran = load_run(str(logdir), str(folder), reader=data._reader)
        assert ran == load_run(str(logdir), str(folder))
        parsed = data._reader.parsed_bytes - before
        if cut == size:  # the records after the first read's last complete one, no more
            assert 0 < parsed < size - cut1 + 300, "the files were parsed again whole"
    assert report["steps"] == 299


def test_the_tab_forgets_the_files_of_a_deleted_run(tmp_path):
    logdir = tmp_path / "logs"
    _session(logdir / "a", 1, 30)
    _session(logdir / "b", 1, 30)
    data = TabData(str(logdir))
    assert data.runs() == ["a", "b"] and data.report("a")["steps"] == 29
    assert data.report("b")["steps"] == 29
    assert len(data._reader._files) == 2
    shutil.rmtree(logdir / "b")
    assert data.runs() == ["a"]
    assert [os.path.basename(os.path.dirname(p)) for p in data._reader._files] == ["a"]
