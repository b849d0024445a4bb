"""The hand-encoded scalar events are exactly what protobuf would write."""
from __future__ import annotations

import math

import pytest
from tensorboard.compat.proto import event_pb2

from trainkit.sinks.tensorboard import EventFileWriter, encode_scalars, masked_crc32c


@pytest.mark.parametrize("step", [0, 1, 127, 128, 300, 16383, 16384, 2**21 - 1, 2**21, 2**31 + 5, -1])
def test_encoding_parses_into_the_same_event(step):
    values = {"trainkit/step_time_ms": 12.5, "loss": -0.25, "é/ünïcode": 3.0, "x" * 200: 1e30}
    data = encode_scalars(step, values, 1700000000.125)
    ev = event_pb2.Event.FromString(data)
    assert ev.step == step and ev.wall_time == 1700000000.125
    got = {v.tag: v.simple_value for v in ev.summary.value}
    assert list(got) == list(values)
    for tag, value in values.items():
        assert got[tag] == pytest.approx(value, rel=1e-7)
    # Byte for byte what the protobuf library produces.
    ref = event_pb2.Event(wall_time=1700000000.125, step=step)
    for tag, value in values.items():
        ref.summary.value.add(tag=tag, simple_value=value)
    assert data == ref.SerializeToString()


def test_nan_and_inf_survive():
    ev = event_pb2.Event.FromString(encode_scalars(3, {"a": float("nan"), "b": float("inf")}, 0.0))
    assert math.isnan(ev.summary.value[0].simple_value) and math.isinf(ev.summary.value[1].simple_value)


def test_masked_crc_matches_tensorboard_reference():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference

    for data in (b"", b"a", b"hello world" * 50):
        assert masked_crc32c(data) == reference(data)


def test_writer_file_reads_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = EventFileWriter(str(tmp_path))
    w.write_scalars(step=5, values={"a": 1.5, "b": 2.0}, wall_time=10.0)
    w.write_text("notes", "hello **world**")
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.write_scalars(step=6, values={"a": 1.0})
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    assert [(e.step, e.value, e.wall_time) for e in ea.Scalars("a")] == [(5, 1.5, 10.0)]
    assert "notes" in ea.Tags()["tensors"]


def test_sessions_of_one_second_sort_in_the_order_they_started(tmp_path, monkeypatch):
    """TensorBoard (and trainkit's analysis, which takes the latest session) read a folder's event
    files in name order: the ninth and tenth writer of one process within one second too."""
    import itertools

    from trainkit.sinks import tensorboard as tb

    monkeypatch.setattr(tb, "_file_ids", itertools.count(8))
    monkeypatch.setattr(tb.time, "time", lambda: 1700000000.5)
    made = []
    for _ in range(4):  # counters 8, 9, 10, 11
        w = EventFileWriter(str(tmp_path))
        made.append(w.path.rsplit("/", 1)[1])
        w.close()
    assert sorted(made) == made


def test_text_summaries_are_tensorboards_own_bytes(tmp_path, monkeypatch):
    # write_text builds what tensorboard's text_pb builds, without importing it: text_pb imports
    # numpy, and that import at exit (a session closed by atexit after an unhandled
    # KeyboardInterrupt, writing its last summaries) turned the exit status -SIGINT into 1.
    from tensorboard.plugins.text.summary_v2 import text_pb

    from trainkit.profiling.eventfiles import event_records

    w = EventFileWriter(str(tmp_path))
    sent = []
    monkeypatch.setattr(w, "write_summary", lambda summary, step=0: sent.append(summary))
    for text in ("hello **world**", "", "é/ünïcode " * 300, '[{"stepped": false}]'):
        w.write_text("trainkit/meta/x", text, step=3)
        assert sent[-1].SerializeToString() == text_pb("trainkit/meta/x", text).SerializeToString()
    w.close()
    assert list(event_records(w.path))  # the file itself stays readable


def test_write_text_imports_no_numpy(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from trainkit.sinks.tensorboard import EventFileWriter; "
            f"w = EventFileWriter({str(tmp_path)!r}); before = 'numpy' in sys.modules; "
            "w.write_text('t', 'x'); w.close(); print(before, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split()
    assert after == before, out.stdout  # write_text added no numpy import
