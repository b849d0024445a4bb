"""TK302 and host reads the environment consumes: in reinforcement learning the action picked on
the GPU must reach ``env.step(...)`` on the host in the same step, so its ``.cpu()``/``.item()``
cannot be moved under a logging ``if`` nor kept on the device. TK302 told CleanRL's ``dqn.py`` to
log every N steps."""
from __future__ import annotations

import textwrap

import pytest

from trainkit.lint import lint_source

DQN = """
import random
import numpy as np
import torch
import torch.nn.functional as F

def main(args, envs, q_network, optimizer, rb, device):
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        if random.random() < 0.1:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            q_values = q_network(torch.Tensor(obs).to(device))
            {select}
        {env_step}
        obs = next_obs
        if global_step % args.train_frequency == 0:
            loss = F.mse_loss(q_network(obs), obs)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""

ENV_STEP = "next_obs, rewards, terminations, truncations, infos = envs.step(actions)"


def _codes(select: str, env_step: str = ENV_STEP) -> list:
    src = textwrap.dedent(DQN).replace("{select}", select).replace("{env_step}", env_step)
    return [f.code for f in lint_source(src)]


@pytest.mark.parametrize("select", [
    "actions = torch.argmax(q_values, dim=1).cpu().numpy()",
    "actions = q_values.argmax(dim=1).tolist()",
    "actions = q_values.argmax().item()",
    # through a second name
    "greedy = q_values.argmax(dim=1).cpu()\n            actions = greedy.numpy()",
])
def test_action_read_for_env_step_is_not_reported(select: str) -> None:
    assert _codes(select) == []


def test_action_read_inside_the_env_step_call_is_not_reported() -> None:
    assert _codes("actions = torch.argmax(q_values, dim=1)",
                  "next_obs, rewards, d, t, i = envs.step(actions.cpu().numpy())") == []


@pytest.mark.parametrize("receiver", ["env", "self.env", "train_env", "vec_env"])
def test_environment_names(receiver: str) -> None:
    assert _codes("actions = q_values.argmax().item()",
                  f"next_obs, r, d, t, i = {receiver}.step(actions)") == []


def test_a_read_that_never_reaches_the_environment_is_still_reported() -> None:
    # the host read feeds a print, not the environment
    assert _codes("actions = torch.argmax(q_values, dim=1)\n            print(q_values.max().item())",
                  "next_obs, rewards, d, t, i = envs.step(actions)") == ["TK302"]


def test_another_read_in_the_same_loop_is_still_reported() -> None:
    src = textwrap.dedent(DQN).replace("{select}", "actions = q_values.argmax().item()").replace(
        "{env_step}", ENV_STEP).replace("obs = next_obs", "obs = next_obs\n        mean_q = q_values.mean().item()")
    assert [(f.code, f.line) for f in lint_source(src)] == [("TK302", 17)]


def test_a_scheduler_step_is_no_environment() -> None:
    assert _codes("actions = q_values.argmax().item()",
                  "next_obs = obs\n        lr_scheduler.step(actions)") == ["TK302"]
