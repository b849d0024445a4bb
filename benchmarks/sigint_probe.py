"""Which step of a training script makes an uncaught KeyboardInterrupt exit with status 1 instead
of dying by SIGINT, as CPython does since 3.8 (and tests/process/test_signals.py asserts).

On the GPU machine (H100, Python 3.12.3, torch 2.11; 2026-11-23) the interrupted
tests/process/scripts/train_forever.py exited 1; a child that only imported torch (and trainkit,
with a session) died by SIGINT. CPython exits 1 when anything runs exec/eval of a string (C's
PyRun_String too) after the main module failed. Each probe below is a child interrupted after it
says "ready"; each line says its exit status (-2: died by SIGINT, as it should).

    python benchmarks/sigint_probe.py        # what gpu.sh's sigint part runs
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOP = """
for i, (x, y) in enumerate(batches(), start=1):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    LOG
    if i == 20:
        print("ready", flush=True)
    time.sleep(0.002)
"""
SETUP = """import time, torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def batches():
    g = torch.Generator().manual_seed(1)
    while True:
        yield torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
"""
PROBES = {
    "sleep": "import time\nprint('ready', flush=True)\ntime.sleep(60)\n",
    "import torch": "import time, torch\nprint('ready', flush=True)\ntime.sleep(60)\n",
    "cuda tensor": ("import time, torch\ntorch.zeros(1).cuda() if torch.cuda.is_available() else None\n"
                    "print('ready', flush=True)\ntime.sleep(60)\n"),
    "train, no trainkit": SETUP + LOOP.replace("LOG", "pass"),
    "train, trainkit": (SETUP + "import trainkit as tk\n"
                        "with tk.session(logdir=LOGDIR, flush_secs=60, system_metrics=False) as s:\n"
                        "    tk.patch(opt)\n    batches_ = batches\n"
                        "    def batches():\n        return tk.patch(batches_())\n"
                        + "".join("    " + line + "\n" for line in
                                  LOOP.replace("LOG", "s.log('loss', loss)").strip().splitlines())),
}


def probe(name: str, source: str, workdir: str) -> str:
    path = os.path.join(workdir, "probe.py")
    with open(path, "w") as f:
        f.write(source.replace("LOGDIR", repr(os.path.join(workdir, "run"))))
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    # SIGINT at its default in the child (a background job's SIG_IGN is inherited otherwise)
    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        child = subprocess.Popen([sys.executable, path], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
    finally:
        signal.signal(signal.SIGINT, prev)
    try:
        line = child.stdout.readline()
        if line.strip() != "ready":
            child.kill()
            return f"{name:20s} did not start: {child.communicate(timeout=60)[1][-300:]!r}"
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        err = child.communicate(timeout=60)[1]
    finally:
        if child.poll() is None:
            child.kill()
    verdict = "died by SIGINT" if child.returncode == -signal.SIGINT else "WRONG"
    return f"{name:20s} exit {child.returncode:4d}  {verdict}  ({err.strip().splitlines()[-1:]})"


def main() -> None:
    print(f"python {sys.version.split()[0]}, {sys.executable}")
    for name, source in PROBES.items():
        with tempfile.TemporaryDirectory(prefix="sigint-probe-") as workdir:
            print(probe(name, source, workdir), flush=True)


if __name__ == "__main__":
    main()
