"""``@tk.profile_region`` given what it cannot decorate as a function: refused, with the fix."""
from __future__ import annotations

import pytest
import torch

import trainkit as tk


def test_region_refuses_a_model_instance_and_names_the_fix():
    # model = tk.profile_region("forward")(model) made the model a function: its calls ran, and
    # the optimizer's model.parameters() then failed with "'function' object has no attribute".
    model = torch.nn.Linear(3, 2)
    with pytest.raises(TypeError, match=r"got the model Linear\(\.\.\.\).*def forward"):
        tk.profile_region("forward")(model)
    wrapped = tk.profile_region("forward")(model.forward)  # its bound forward is a function
    assert wrapped(torch.ones(1, 3)).shape == (1, 2)
