"""A session's profiler steps at each real step, and at a cycle's end stops, writes (and
compresses) its trace: tens of ms that are trainkit's, not the user's. They landed in the next
step's ``trainkit/step_time_ms`` (34-48 ms after each cycle in a loop of 2.7 ms steps, in no
trace, the mean 2.5x); on the host clock the next step is now timed from after them."""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars

SLOW = 1.0  # what the profiler's step takes at the cycle's end here (seconds)


@pytest.mark.parametrize("use_c", [True, False])
def test_the_profilers_own_work_is_not_in_the_next_steps_time(tmp_path, use_c, monkeypatch):
    from trainkit import recorder

    if use_c and recorder._fast is None:
        pytest.skip("trainkit._speedups not built")
    monkeypatch.setattr(recorder, "_fast", recorder._fast if use_c else None)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    slowed = []
    with tk.session(logdir=tmp_path, system_metrics=False,
                    profile=tk.ProfileSchedule(wait=2, warmup=1, active=1)) as s:
        tracer = s._profiler
        step = tracer.step

        def slow_step():  # the cycle's end (its 4th step) takes SLOW, as a big trace would; the
            step()  # 2nd too (no profiler records then: the C step's path, where built)
            if tracer.steps in (2, 4):
                time.sleep(SLOW)
                slowed.append(s.step)

        tracer.step = slow_step
        tk.patch(opt)
        for _ in range(7):
            model(torch.ones(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    assert slowed == [3, 5]  # it ran after steps 2 and 4 ended (the steps in progress: 3, 5)
    times = [v for _, v in scalars(tmp_path)["trainkit/step_time_ms"]]
    assert len(times) == 6  # steps 2-7 (the first has no start)
    assert max(times) < SLOW * 1e3 / 2, times  # the steps after kept no second of it


def test_an_evaluations_data_wait_stays_in_its_steps_time(tmp_path):
    # Batches are steps (no optimizer): a step ends where the next batch's wait began, once that
    # batch came; the profiler's step taken then moved the next step's start to after the wait,
    # which every step_time_ms lost (20.4 ms where 25.5 ms ran, in a probe)
    model = torch.nn.Linear(4, 2)
    slowed = []

    def batches():
        for _ in range(6):
            time.sleep(0.2)  # the data wait: in each step's time
            yield torch.ones(3, 4)

    with tk.session(logdir=tmp_path, system_metrics=False,
                    profile=tk.ProfileSchedule(wait=2, warmup=1, active=1)) as s:
        tracer = s._profiler
        step = tracer.step

        def slow_step():
            step()
            if tracer.steps == 4:  # the cycle's end
                time.sleep(SLOW)
                slowed.append(tracer.steps)

        tracer.step = slow_step
        with torch.no_grad():
            for x in tk.patch(batches()):
                model(x)
    assert slowed == [4]
    times = [v for _, v in scalars(tmp_path)["trainkit/step_time_ms"]]
    assert len(times) >= 5, times
    assert min(times) >= 190, times  # each holds its 200 ms wait
    assert max(times) < SLOW * 1e3 / 2, times  # and none the profiler's second
