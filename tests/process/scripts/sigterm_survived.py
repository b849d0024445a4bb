"""A process that survives SIGTERM: the signal is ignored, or its handler only sets a flag.

Usage: sigterm_survived.py LOGDIR MODE    (MODE: ignore | flag)
Trains 10 steps under one session, sends itself SIGTERM after step 5 and goes on to step 10
(the graceful-shutdown pattern: finish the epoch / save a checkpoint, then leave). Prints
``done <flag>`` at the end.
"""
import os
import signal
import sys

import torch

import trainkit as tk

logdir, mode = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
requested = []
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda signum, frame: requested.append(signum))

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(10)]
with tk.session(logdir=logdir, flush_secs=60, system_metrics=False) as s:
    tk.patch(opt)
    for i, (x, y) in enumerate(tk.patch(data), start=1):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        s.log("loss", loss)
        if i == 5:
            os.kill(os.getpid(), signal.SIGTERM)
print(f"done {requested}", flush=True)
