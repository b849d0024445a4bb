"""The profiler's own work at a cycle's end is left out of the next step's time on a GPU too
(the CUDA paths' logic on the CPU, with test_gpu_logic's stand-ins for torch's CUDA calls): the
next step is timed from an event recorded after it, and every event still goes back once."""
from __future__ import annotations

import time

import torch

import trainkit as tk
from trainkit import timing

from .conftest import scalars
from .helpers import mlp
from .test_gpu_logic import batches, cuda, on_device, train  # noqa: F401 (cuda: a fixture)

SLOW = 1.0


def test_the_profilers_own_work_is_not_in_the_next_steps_device_time(tmp_path, cuda):  # noqa: F811
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False,
                    profile=tk.ProfileSchedule(wait=2, warmup=1, active=1)) as s:
        tracer = s._profiler
        step = tracer.step

        def slow_step():  # the cycle's end (its 4th step) takes SLOW, as a big trace would
            step()
            if tracer.steps == 4:
                time.sleep(SLOW)

        tracer.step = slow_step
        tk.patch(opt)
        on_device(opt, 0)
        train(model, opt, tk.patch(batches(7)))
        s.flush()
        pooled = [id(ev) for ev in timing._pools.get(0, [])]
        assert len(pooled) == len(set(pooled))  # no event in the pool twice (in use twice next)
    times = dict(scalars(tmp_path)["trainkit/step_time_ms"])
    assert sorted(times) == list(range(1, 8))
    assert max(times.values()) < SLOW * 1e3 / 2, times  # step 5 kept no second of it
