"""The README's rows for the Text tab's ``meta/`` records name what a session writes there."""
from __future__ import annotations

import json
import os
import re

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainkit as tk
from tests.conftest import REPO


def _row(tag: str) -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        (row,) = [line for line in fh if line.startswith(f"| `{tag}` |")]
    return row


def _texts(logdir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: json.loads(acc.Tensors(tag)[0].tensor_proto.string_val[0])
            for tag in acc.Tags()["tensors"] if tag.startswith("trainkit/meta/")}


def test_the_meta_rows_name_every_field_a_session_writes(tmp_path):
    """meta/loader's "type" was in no row, and meta/optimizers' "impl" was said to be one of
    "fused", "foreach", "for-loop", where it is a list of them."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        for x, y in tk.patch(loader):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    tk.unpatch(opt)
    texts = _texts(tmp_path)
    for tag, row_tag, fields in (("trainkit/meta/loader/0", "meta/loader/<i>",
                                  texts["trainkit/meta/loader/0"]),
                                 ("trainkit/meta/optimizers", "meta/optimizers",
                                  texts["trainkit/meta/optimizers"][0]),
                                 ("trainkit/meta/versions", "meta/versions",
                                  texts["trainkit/meta/versions"])):
        row = _row(row_tag)
        named = set(re.findall(r"`([a-z_]+)`", row))
        assert set(fields) <= named, (tag, sorted(set(fields) - named))
    impl = texts["trainkit/meta/optimizers"][0]["impl"]
    assert isinstance(impl, list)
    assert "a list" in _row("meta/optimizers")
