"""Gradient accumulation with mixed precision, done right (the "efficient loop" template, fixed).

The template this replaces divides the loss *after* ``backward()`` (too late to matter), forgets
that the last window of an epoch may be shorter, and calls ``empty_cache()`` and ``gc.collect()``
every step. Here ``tk.accumulate`` divides the gradients by the micro-batches actually in each
window (a short last window included), ``tk.autocast_scaled`` unscales, clips, steps and updates
only at window boundaries and counts skipped steps, and nothing is freed by hand.

    python examples/accumulate_amp.py --accumulate 4 --logdir runs/accumulate
"""
from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader

import trainkit as tk
from trainkit.workloads.mnist import BlockShuffle, SyntheticMNIST, simple_cnn

from _args import positive_int, run_folder


def main() -> None:
    # RawDescription: the docstring's usage line stays a line of its own in --help
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accumulate", type=positive_int, default=4, metavar="N",
                        help="micro-batches per optimizer step (default: %(default)s)")
    parser.add_argument("--train-size", type=positive_int, default=1000, metavar="N",
                        help="training images, made as they are read; the default is 16 "
                             "batches of 64, so windows of 4, 4, 4 and 4 (default: %(default)s)")
    parser.add_argument("--logdir", type=run_folder, default="runs/accumulate", metavar="DIR",
                        help="TensorBoard run folder (default: %(default)s)")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = SyntheticMNIST(args.train_size)  # MNIST-shaped images, made as they are read
    # batch_size=None: the sampler gives whole shuffled batches, so memory is a few MB
    loader = DataLoader(data, batch_size=None, sampler=BlockShuffle(len(data), 64),
                        num_workers=tk.technique("num_workers", 0),
                        pin_memory=tk.technique("pin_memory", device.type == "cuda"))
    model = simple_cnn().to(device)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # bf16 needs no scaler; on a GPU without bf16, autocast_scaled uses fp16 and this scaler.
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")

    with tk.session(logdir=args.logdir) as s, tk.accumulate(args.accumulate, optimizer) as acc:
        for x, y in tk.patch(loader):
            x, y = tk.to_device((x, y), device)
            with tk.autocast_scaled(scaler) as amp:
                loss = criterion(model(x), y)  # the mean over this micro-batch: no division
            amp.backward(loss)
            amp.step(optimizer, clip_grad_norm=1.0)  # a real step only at window boundaries
            optimizer.zero_grad()  # a no-op inside a window
            s.log("loss", loss)
    print(f"{acc.steps} optimizer steps over {len(loader)} micro-batches; run in {s.logdir}")


if __name__ == "__main__":
    main()
