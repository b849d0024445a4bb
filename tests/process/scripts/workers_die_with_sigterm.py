"""A SIGTERM sent to the whole process group (a job scheduler's, ``kill -- -PGID``) also kills a
DataLoader's workers, and torch's SIGCHLD handler then raises "DataLoader worker (pid N) is
killed by signal" wherever the main thread is: inside the session's final write, it lost the run.

Usage: workers_die_with_sigterm.py LOGDIR MODE
MODE: simulated  - no workers: a SIGCHLD handler that raises as torch's does, and a SIGCHLD that
                   comes while the final write reads a value; the script SIGTERMs itself after
                   step 5 (deterministic)
      dataloader - a real DataLoader with 2 workers; prints ``step N`` once step N is recorded,
                   and the parent SIGTERMs the process group
"""
import os
import signal
import sys
import time

import torch

import trainkit as tk
from tests.process._dying_worker import WorkerDiesNow, torch_like_sigchld

logdir, mode = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
torch.manual_seed(0)

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if mode == "simulated":
    signal.signal(signal.SIGCHLD, torch_like_sigchld)
    data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(5)]
else:
    ds = torch.utils.data.TensorDataset(torch.randn(4000, 8), torch.randint(0, 2, (4000,)))
    data = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
with tk.session(logdir=logdir, flush_secs=60, log_every=10**6, system_metrics=False) as s:
    tk.patch(opt)
    for i, (x, y) in enumerate(tk.patch(data), start=1):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        s.log("loss", loss)
        if mode == "dataloader":
            print(f"step {i}", flush=True)
            time.sleep(0.01)
    if mode == "simulated":
        s._buf.append(("late", 5, WorkerDiesNow()))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
print("not killed", flush=True)
