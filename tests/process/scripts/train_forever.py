"""Train Linear(8, 2) with SGD forever under a trainkit session; print each finished step.

Usage: train_forever.py LOGDIR FLUSH_SECS MODE [MARKER]
MODE: plain        - nothing special (SIGTERM / SIGINT / SIGKILL end it as they would anyway)
      user_handler - a SIGTERM handler, installed BEFORE the session, writes MARKER, sys.exit(3)
      catch_kbi    - KeyboardInterrupt is caught outside the `with` block; prints "caught"
      no_with      - the session is created without `with` and never closed by the script
Each step prints ``step N LOSS MONOTONIC`` (N from 1, LOSS the value logged) once everything of
step N has been recorded.
"""
import signal
import sys
import time

import torch

import trainkit as tk

logdir, flush_secs, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
torch.manual_seed(0)

if mode == "user_handler":
    marker = sys.argv[4]

    def on_term(signum, frame):
        with open(marker, "w") as f:
            f.write(f"handled {signum}\n")
        sys.exit(3)

    signal.signal(signal.SIGTERM, on_term)


def batches():
    g = torch.Generator().manual_seed(1)
    while True:
        yield torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)


def loop(s, model, opt):
    tk.patch(opt)
    print("ready", flush=True)
    for i, (x, y) in enumerate(tk.patch(batches()), start=1):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        s.log("loss", loss)
        print(f"step {i} {loss.item()!r} {time.monotonic()!r}", flush=True)
        time.sleep(0.002)  # stay lean on a shared machine


def train():
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # A long flush_secs also turns off the wake-ups every log_every steps: then only the final
    # flush (exit, signal) writes the last second of steps.
    log_every = 10**6 if flush_secs >= 60 else 50
    s = tk.session(logdir=logdir, flush_secs=flush_secs, log_every=log_every,
                   system_metrics=False)
    if mode == "no_with":
        loop(s, model, opt)
    else:
        with s:
            loop(s, model, opt)


if mode == "catch_kbi":
    try:
        train()
    except KeyboardInterrupt:
        print("caught", flush=True)
else:
    train()
