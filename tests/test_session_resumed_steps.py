"""A session resumed from a checkpoint (``steps_done=N``) numbers its first optimizer step N + 1,
whatever the loop does before it: a validation of the loaded model over a patched loader, or
the batches done before the checkpoint skipped in-process (the optimizer last stepped in an
earlier session). Those batches were counted as steps of an evaluation: the training went on
from N + k + 1, and ``s.steps_done`` (saved in the next checkpoint) was k too many. With nothing
before it (``steps_done`` a numpy integer too), the event file starts there as well, with
SessionLog.START at N + 1."""
from __future__ import annotations

import numpy as np
import torch

import trainkit as tk
from tests.conftest import scalars


def _data(n, rows):
    return [(torch.randn(rows, 4), torch.randn(rows, 2)) for _ in range(n)]


def _train(s, model, opt, batches, skip=0):
    for i, (x, y) in enumerate(tk.patch(batches)):
        if i < skip:
            continue  # done before the checkpoint
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        s.log("trained", float(i))


def test_a_resumed_session_that_validates_first_trains_from_the_checkpoints_next_step(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    val, train = _data(3, 16), _data(4, 8)
    with tk.session(logdir=tmp_path, steps_done=6, system_metrics=False) as s:
        tk.patch(opt)
        with torch.no_grad():
            for vx, _ in tk.patch(val):
                model(vx)
        s.log("val_before", 1.0)
        _train(s, model, opt, train)
        assert s.steps_done == 10
    got = scalars(tmp_path)
    assert [st for st, _ in got["trained"]] == [7, 8, 9, 10]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [7, 8, 9, 10]
    assert got["val_before"] == [(7, 1.0)]


def test_a_resumed_session_in_the_same_process_skipping_done_batches(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = _data(10, 8)
    tk.patch(opt)
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        _train(s, model, opt, train[:4])  # then stopped (a Ctrl-C in a notebook): 4 steps done
        done = s.steps_done
    assert done == 4
    with tk.session(logdir=tmp_path, steps_done=done, system_metrics=False) as s:
        _train(s, model, opt, train, skip=4)
        assert s.steps_done == 10
    resumed = scalars(tmp_path)  # the folder as TensorBoard reads it: one run, steps 1 to 10
    assert [st for st, _ in resumed["trained"]] == list(range(1, 11))
    assert [v for _, v in resumed["trained"]] == [float(i) for i in range(10)]


def test_a_resumed_session_numbers_its_steps_on_from_steps_done(tmp_path):
    """steps_done=N (a numpy integer too): the first step is N + 1, the file starts with
    SessionLog.START there, and what is logged lands on the resumed steps."""
    from tensorboard.compat.proto import event_pb2

    from trainkit.profiling.eventfiles import event_records

    model = torch.nn.Linear(4, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with tk.session(logdir=tmp_path, system_metrics=False, steps_done=np.int64(40)) as s:
        assert s.step == 41 and s.steps_done == 40 and "step 41" in repr(s)
        for _ in range(3):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            s.log("loss", loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert s.step == 44 and s.steps_done == 43
    got = scalars(str(tmp_path))
    assert [st for st, _ in got["loss"]] == [41, 42, 43]
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [42, 43]
    (path,) = [p for p in tmp_path.iterdir() if "tfevents" in p.name]
    events = [event_pb2.Event.FromString(r) for r in event_records(str(path))]
    start = event_pb2.SessionLog.START  # twice: TensorBoard's legacy loader skips a run's first
    assert [(e.session_log.status, e.step) for e in events[1:3]] == [(start, 41)] * 2
    assert not any(e.HasField("session_log") for e in events[3:])
    tk.unpatch(opt)
