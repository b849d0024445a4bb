"""The MNIST CNN loop of the "seven speed techniques" article, instrumented with trainkit.

The loop is the usual one; trainkit adds a session, patches the optimizer and the loader, times
three regions and moves batches with ``tk.to_device`` (asynchronous exactly when the batch is
pinned). The knobs the article tunes by hand (workers, pinned memory, batch size) are
``tk.technique`` switches, so they can be flipped without editing this file, e.g.
``TRAINKIT_TECHNIQUES='{"num_workers": 2, "batch_size": 128}'`` (JSON) in the environment.

    python examples/mnist_cnn.py --epochs 1 --logdir runs/mnist
    tensorboard --logdir runs
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
    parser.add_argument("--epochs", type=positive_int, default=1, metavar="N",
                        help="passes over the training images (default: %(default)s)")
    parser.add_argument("--train-size", type=positive_int, default=3200, metavar="N",
                        help="training images, made as they are read (default: %(default)s)")
    parser.add_argument("--logdir", type=run_folder, default="runs/mnist-cnn", metavar="DIR",
                        help="TensorBoard run folder (default: %(default)s)")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = SyntheticMNIST(args.train_size)  # MNIST-shaped images, made as they are read
    sampler = BlockShuffle(len(data), tk.technique("batch_size", 64))  # shuffled batches
    loader = DataLoader(
        data,
        batch_size=None,  # the sampler gives whole batches: a few MB whatever --train-size
        sampler=sampler,
        num_workers=tk.technique("num_workers", 0),
        pin_memory=tk.technique("pin_memory", device.type == "cuda"),
    )
    model = simple_cnn().to(device)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    with tk.session(logdir=args.logdir) as s:
        tk.patch(optimizer)
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # a new order each epoch
            for x, y in tk.patch(loader):
                with tk.profile_region("h2d"):
                    x, y = tk.to_device((x, y), device)
                with tk.profile_region("forward"):
                    loss = criterion(model(x), y)
                with tk.profile_region("backward"):
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=tk.technique("set_to_none", True))
                s.log("loss", loss)
    print(f"TensorBoard run written to {s.logdir}")


if __name__ == "__main__":
    main()
