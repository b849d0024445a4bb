"""A session whose every trace failed to be written (its folder replaced by a file mid-run) says
so at its close: it blamed the schedule ("ended ... before the schedule's first profiled one;
lower wait"), which had profiled two cycles."""
from __future__ import annotations

import shutil
import warnings

import torch

import trainkit as tk


def test_no_trace_written_because_the_writes_failed_says_so(tmp_path):
    logdir = tmp_path / "run"
    model = torch.nn.Linear(4, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tk.session(logdir=logdir, system_metrics=False,
                        profile=tk.ProfileSchedule(wait=1, warmup=1, active=2, repeat=2)):
            for i in range(10):
                model(torch.ones(2, 4)).sum().backward()
                if i == 2:  # in the first cycle's active steps
                    shutil.rmtree(logdir)
                    logdir.write_text("not a folder")
                opt.step()
                opt.zero_grad()
    tk.unpatch(opt)
    said = [str(w.message) for w in caught if "wrote no trace" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "2 cycle(s) ended, but their traces could not be written" in said[0]
    assert "lower wait" not in said[0]
