"""Regressions from linting real, widely copied training scripts.

Each snippet is a minimal rewrite (in our own words) of the shape found in the cited
script; the comment says where, what the linter said, and what it should say.
"""
from __future__ import annotations

import textwrap
from typing import List, Tuple

from trainkit.lint import lint_source


# TK112 (a short last window never stepped) fires on most of these loops; it has its own tests
# (test_leftover_window_rule.py), these are about other rules.
def _pairs(source: str, **kwargs: object) -> List[Tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(source), **{"ignore": "TK112", **kwargs})]  # type: ignore[arg-type]


# --------------------------------------------------------------------------- TK107

# huggingface/transformers examples/run_glue.py (pytorch-transformers era, 2019): the loss is divided
# by gradient_accumulation_steps, but clip_grad_norm_ runs right after every backward, outside the
# `if (step + 1) % gradient_accumulation_steps == 0:` that steps. It clipped each partial running sum
# (later versions moved the clip under that `if`). Nothing was reported.
RUN_GLUE_2019 = """
import torch
def train(args, model, loader, optimizer, scheduler, amp):
    for step, batch in enumerate(loader):
        loss = model(**batch)[0]
        if args.gradient_accumulation_steps > 1:
            loss = loss / args.gradient_accumulation_steps
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_grad_norm)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            scheduler.step()
            model.zero_grad()
"""


def test_clip_on_every_micro_batch_of_a_hand_written_accumulation_is_reported() -> None:
    assert _pairs(RUN_GLUE_2019) == [("TK107", 11), ("TK107", 14)]


def test_clip_under_the_steps_if_is_not_reported() -> None:
    # the later run_glue.py, and torch's AMP recipe: unscale_ and clip right before the step
    src = """
    import torch
    from torch.nn.utils import clip_grad_norm_ as clip
    def train(model, loader, optimizer, scaler, n, max_norm):
        for i, (x, y) in enumerate(loader):
            loss = model(x, y) / n
            scaler.scale(loss).backward()
            if (i + 1) % n == 0:
                scaler.unscale_(optimizer)
                clip(model.parameters(), max_norm)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    """
    assert _pairs(src) == []


# A CANINE masked-LM trainer found by code search (train_epoch): under `if (batch_idx + 1) % n == 0:`,
# `if args.use_amp and scaler is not None:` unscales, clips and steps the scaler, and its `else`
# clips and steps the optimizer. The `else` branch's clip was reported as running on every
# micro-batch, because it never runs with the first step found (`scaler.step`).
def test_clip_in_the_else_of_an_amp_branch_under_the_steps_if_is_not_reported() -> None:
    src = """
    import torch
    def train(model, loader, optimizer, scaler, n, use_amp):
        for i, (x, y) in enumerate(loader):
            loss = model(x, y) / n
            if use_amp:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if (i + 1) % n == 0:
                if use_amp:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == []


def test_clip_in_the_else_of_the_steps_if_is_still_reported() -> None:
    src = """
    import torch
    def train(model, loader, optimizer, n):
        for i, (x, y) in enumerate(loader):
            (model(x, y) / n).backward()
            if (i + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """
    assert _pairs(src) == [("TK107", 10)]


def test_clip_in_a_loop_that_steps_every_batch_is_not_reported() -> None:
    src = """
    import torch
    def train(model, loader, optimizer):
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            model(x, y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    """
    assert _pairs(src) == []


# --------------------------------------------------------------------------- loops that step through a call

# huggingface/pytorch-image-models train.py, train_one_epoch: the loop body defines _forward() and
# _backward() (backward, clip, optimizer.step() in there) and calls them, then reads
# `loss.item()` on every micro-batch when not distributed. The loop was not seen as a training
# loop, so that per-step sync went unreported.
TIMM_TRAIN_ONE_EPOCH = """
import torch
def train_one_epoch(model, loader, optimizer, loss_fn, args, losses_m, accum_steps):
    for batch_idx, (input, target) in enumerate(loader):
        need_update = (batch_idx + 1) % accum_steps == 0

        def _forward():
            loss = loss_fn(model(input), target)
            return loss / accum_steps

        def _backward(_loss):
            _loss.backward()
            if need_update:
                optimizer.step()

        loss = _forward()
        _backward(loss)
        if not args.distributed:
            losses_m.update(loss.item() * accum_steps, input.size(0))
        if not need_update:
            continue
        optimizer.zero_grad()
"""


def test_a_loop_calling_its_own_step_function_is_a_training_loop() -> None:
    assert _pairs(TIMM_TRAIN_ONE_EPOCH) == [("TK302", 19)]


# pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py: Trainer._run_epoch loops over
# the batches and calls self._run_batch(...), which zeroes, runs backward and steps.
DDP_TRAINER = """
import torch
class Trainer:
    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch):
        for source, targets in self.train_data:
            loss = self._run_batch(source.to(self.gpu_id), targets.to(self.gpu_id))
            torch.cuda.empty_cache()
"""


def test_a_loop_calling_a_method_that_steps_is_a_training_loop() -> None:
    assert _pairs(DDP_TRAINER) == [("TK301", 14)]


def test_an_epoch_loop_calling_a_function_with_its_own_batch_loop_is_not() -> None:
    # pytorch/examples mnist/main.py and imagenet/main.py: `for epoch ...: train(...); validate(...)`;
    # train() holds the batch loop, so the epoch loop's per-epoch syncs are not per-step ones.
    src = """
    def train(model, loader, optimizer):
        for x, y in loader:
            optimizer.zero_grad()
            model(x, y).backward()
            optimizer.step()

    def main(model, loader, optimizer, epochs, validate):
        for epoch in range(epochs):
            train(model, loader, optimizer)
            acc = validate(model).item()
            torch.cuda.empty_cache()
    """
    assert _pairs(src) == []


# --------------------------------------------------------------------------- TK501/TK502

# lucidrains/x-transformers train_enwik8.py: the Dataset's __getitem__ returns `full_seq.cuda()`, and the
# DataLoader sets neither num_workers nor pin_memory. TK501 and TK502 advised both, but their fixes
# fail there: a CUDA tensor cannot be pinned, and a forked worker cannot use CUDA.
XTRANSFORMERS_ENWIK8 = """
import torch
from torch.utils.data import DataLoader, Dataset

class TextSamplerDataset(Dataset):
    def __init__(self, data, seq_len):
        self.data, self.seq_len = data, seq_len

    def __getitem__(self, index):
        start = torch.randint(0, self.data.size(0) - self.seq_len - 1, (1,))
        return self.data[start: start + self.seq_len + 1].long().cuda()

    def __len__(self):
        return self.data.size(0) // self.seq_len

train_dataset = TextSamplerDataset(data_train, 1024)
train_loader = DataLoader(train_dataset, batch_size=4, drop_last=True)
host_loader = DataLoader(HostDataset(data_train), batch_size=4)
"""


def test_a_loader_over_a_dataset_that_returns_cuda_tensors_gets_no_worker_or_pinning_advice() -> None:
    # the loader over a dataset defined elsewhere (HostDataset) still gets the advice
    assert _pairs(XTRANSFORMERS_ENWIK8) == [("TK501", 18), ("TK502", 18)]


# --------------------------------------------------------------------------- TK108

# huggingface/accelerate examples/complete_nlp_example.py and huggingface/transformers
# examples/pytorch/language-modeling/run_clm_no_trainer.py (2021-22): `loss = loss / gradient_accumulation_steps`,
# then `if step % gradient_accumulation_steps == 0:` with `step` from enumerate(), which counts from 0. The
# first window of every epoch is one micro-batch, divided by the count all the same. Nothing was reported.
COMPLETE_NLP_EXAMPLE = """
def train(model, train_dataloader, optimizer, lr_scheduler, accelerator, gradient_accumulation_steps):
    for step, batch in enumerate(train_dataloader):
        loss = model(**batch).loss
        loss = loss / gradient_accumulation_steps
        accelerator.backward(loss)
        if step % gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
"""


def test_a_zero_based_index_modulo_equal_to_zero_is_reported() -> None:
    # and the last window (up to `step == len(train_dataloader) - 1`), short but divided by the full count: TK110
    assert _pairs(COMPLETE_NLP_EXAMPLE) == [("TK110", 5), ("TK108", 7)]


def test_one_based_counts_are_not_reported() -> None:
    src = """
    def train(model, loader, optimizer, n):
        for step, batch in enumerate(loader):
            (model(batch) / n).backward()
            if (step + 1) % n == 0:
                optimizer.step()
                optimizer.zero_grad()
        for step, batch in enumerate(loader, 1):
            (model(batch) / n).backward()
            if step % n == 0:
                optimizer.step()
                optimizer.zero_grad()
        seen = 0
        for batch in loader:
            (model(batch) / n).backward()
            seen += 1
            if seen % n == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _pairs(src) == []


# --------------------------------------------------------------------------- TK302

# A token-diffusion trainer found by code search: `accumulated_loss = 0.0`, then
# `accumulated_loss += loss.detach().float().item() / accumulation_steps` at each micro-batch, and
# `print(f"... {accumulated_loss:.6f}")` once per update. The `.item()` is a sync (reported); the
# print formats a Python float, but its name ends in `loss`, so it was reported as printing a tensor.
def test_printing_a_float_accumulated_from_item_is_not_a_tensor_print() -> None:
    src = """
    def train(model, loader, optimizer, n):
        running_loss = 0.0
        for i, (x, y) in enumerate(loader):
            loss = model(x, y)
            running_loss += loss.item() / n
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            print(f"loss {running_loss:.4f}")
    """
    assert _pairs(src) == [("TK302", 6)]


def test_printing_a_tensor_accumulator_is_still_reported() -> None:
    src = """
    def train(model, loader, optimizer):
        running_loss = 0.0
        for i, (x, y) in enumerate(loader):
            loss = model(x, y)
            running_loss += loss.detach()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            print(f"loss {running_loss:.4f}")
    """
    assert _pairs(src) == [("TK302", 10)]

