"""``trainkit demo`` into a folder another run writes into at the same time: its summary is its own."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO
from trainkit import demo

#: Another process's session of 5 steps into the same folder, as a second `trainkit demo
#: --logdir same` started a moment later (or a script of the user's) writes there.
_OTHER_RUN = """
import sys, torch, trainkit as tk
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with tk.session(logdir=sys.argv[1], system_metrics=False):
    tk.patch(opt)
    for x in tk.patch([torch.randn(8, 4) for _ in range(5)]):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
"""


def test_a_run_writing_into_the_folder_at_the_same_time_is_not_counted(tmp_path, monkeypatch):
    """Two demos at once into one --logdir: the later one to finish read back every event file
    new since it started, the other process's too, and said 30 optimizer steps for its 20. The
    other run here starts (and ends) while this demo's session is open: a real process, with a
    real session, writing its own event file into the folder."""
    import trainkit

    folder = tmp_path / "same"
    real = trainkit.session

    def session_with_another_run_beside(*args, **kwargs):
        s = real(*args, **kwargs)
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run([sys.executable, "-c", _OTHER_RUN, str(folder)], check=True, env=env,
                       timeout=120)
        return s

    monkeypatch.setattr(trainkit, "session", session_with_another_run_beside)
    result = demo.run(demo.DemoConfig(logdir=str(folder), epochs=1, train_size=128, val_size=64,
                                      batch_size=64, progress=False))
    assert len(list(folder.glob("*tfevents*"))) == 2  # the other run did write beside it
    assert result.steps == 2, result
    assert str(result).startswith("2 optimizer steps, ")
