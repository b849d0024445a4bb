"""Rerunnable screenshot of the trainkit tab: docs/trainkit-tab.png.

Records a demo run (the MNIST-shaped CNN, fed by a map-style dataset that builds each item in
Python, batch 64, no workers: a data-loader-bound loop, as many first loops are), profiles three
steps, starts TensorBoard with the trainkit tab on loopback and photographs the tab with headless
Chromium (Debian: ``apt-get install chromium``).

Run: python docs/screenshot.py [--out docs/trainkit-tab.png] [--logdir DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import trainkit as tk  # noqa: E402
from trainkit.sinks.tbplugin.launch import serve  # noqa: E402


class ItemByItem:
    """MNIST-shaped items, each normalised in Python on access, like a torchvision transform."""

    def __init__(self, n: int) -> None:
        from trainkit.workloads.mnist import synthetic_mnist

        self.x, self.y = synthetic_mnist(n)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        import time

        time.sleep(0.004)  # stands for decoding a PNG from disk
        x = self.x[i]
        return (x - x.mean()) / (x.std() + 1e-6), self.y[i]


def record_demo(logdir: str, *, steps: int = 40) -> None:
    import torch

    from trainkit.workloads.loop import train_steps
    from trainkit.workloads.mnist import simple_cnn

    torch.manual_seed(0)
    model = simple_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(ItemByItem(64 * steps), batch_size=64)
    with tk.session(logdir=logdir, profile=tk.ProfileSchedule(wait=5, warmup=1, active=3)):
        train_steps(model, opt, loader)


def screenshot(url: str, out: str) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        sys.exit("no chromium on PATH: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                        "--window-size=1400,1000", "--virtual-time-budget=15000",
                        "--hide-scrollbars", f"--screenshot={os.path.abspath(out)}", url + "/#trainkit"],
                       check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "trainkit-tab.png"))
    ap.add_argument("--logdir", default=None, help="an existing logdir to show instead of the demo")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logdir = args.logdir
        if logdir is None:
            logdir = tmp
            record_demo(os.path.join(tmp, "demo-cnn"))
        for f in tk.analyze(logdir):
            print(f)
        with serve(logdir) as url:
            screenshot(url, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
