"""``tk.to_device`` to the host under another name: a copy, but no host-to-device transfer."""
from __future__ import annotations

import torch

import trainkit as tk
from tests.conftest import scalars


def test_a_copy_to_cpu_0_records_no_host_to_device_transfer(tmp_path):
    # torch copies a CPU tensor given "cpu:0" (.to returns a new tensor), and so does to_device;
    # it moved nothing off the host: h2d_* are for copies to another device, none on a CPU run.
    x = torch.randn(256, 64)
    with tk.session(logdir=tmp_path, system_metrics=False):
        for device in ("cpu:0", torch.device("cpu", 0)):
            out, y = tk.to_device((x, x[:8]), device)
            assert out.device.type == "cpu" and torch.equal(out, x) and torch.equal(y, x[:8])
    assert not [tag for tag in scalars(tmp_path) if tag.startswith("trainkit/h2d")]
