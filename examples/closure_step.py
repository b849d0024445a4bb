"""``optimizer.step(closure)``: where the time goes is the closure, and trainkit shows it.

With a closure, the forward and backward passes run *inside* ``optimizer.step``; timing the step
alone says nothing about the optimizer. A patched optimizer records the closure's time
(``trainkit/closure_ms``) apart from the update's own (``trainkit/update_ms``), and the results
are bit-identical to the unpatched run. LBFGS calls the closure several times per step.

    python examples/closure_step.py --logdir runs/closure
"""
from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainkit as tk

from _args import run_folder


def main() -> None:
    # RawDescription: the docstring's usage line stays a line of its own in --help
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizer", choices=["lbfgs", "sgd"], default="lbfgs",
                        help="lbfgs calls the closure several times a step, sgd once "
                             "(default: %(default)s)")
    parser.add_argument("--logdir", type=run_folder, default="runs/closure", metavar="DIR",
                        help="TensorBoard run folder (default: %(default)s)")
    args = parser.parse_args()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
    loader = DataLoader(data, batch_size=64, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    loss_fn = torch.nn.CrossEntropyLoss()
    if args.optimizer == "lbfgs":
        optimizer: torch.optim.Optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    with tk.session(logdir=args.logdir) as s:
        tk.patch(optimizer)
        for inputs, targets in tk.patch(loader):

            def closure() -> torch.Tensor:
                optimizer.zero_grad()
                loss = loss_fn(model(inputs), targets)
                loss.backward()
                return loss

            loss = optimizer.step(closure)
            s.log("loss", loss)
    print(f"closure vs update time recorded in {s.logdir}")


if __name__ == "__main__":
    main()
