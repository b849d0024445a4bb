"""Compiling the optimizer step, with an LR scheduler that would otherwise force recompiles.

``torch.compile`` guards on the Python floats in ``param_groups``: every new learning rate (or
OneCycleLR's new betas) is a recompile, until the recompile limit is hit and the step silently
runs eagerly again. ``tk.compiled_step`` holds the scheduled hyper-parameters as tensors, so the
step compiles in its warm-up (on a CPU here, at steps 1 and 2: the schedule's first move of
Adam's betas is the second) and never again however the schedule moves; compile time
(``trainkit/compile/seconds``) and any later recompile are recorded apart from step time.

    python examples/compiled_optimizer.py --steps 20 --logdir runs/compiled
"""
from __future__ import annotations

import argparse

import torch

import trainkit as tk

from _args import positive_int, run_folder


def main() -> None:
    # RawDescription: the docstring's usage line stays a line of its own in --help
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive_int, default=20, metavar="N",
                        help="optimizer steps, the OneCycleLR schedule's length "
                             "(default: %(default)s)")
    parser.add_argument("--width", type=positive_int, default=256, metavar="N",
                        help="features of each of the 4 linear layers (default: %(default)s)")
    parser.add_argument("--logdir", type=run_folder, default="runs/compiled", metavar="DIR",
                        help="TensorBoard run folder (default: %(default)s)")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Sequential(
        *[torch.nn.Linear(args.width, args.width, bias=False) for _ in range(4)]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    tk.compiled_step(optimizer)  # the same as tk.patch(optimizer, compile=True)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=args.steps)
    inputs = torch.rand(32, args.width, device=device)

    with tk.session(logdir=args.logdir) as s:
        for _ in range(args.steps):
            loss = model(inputs).square().mean()
            loss.backward()
            s.log("loss", loss)  # before the step: no loader marks steps, so after it is the next
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
    print(f"compiled optimizer steps recorded in {s.logdir}")


if __name__ == "__main__":
    main()
