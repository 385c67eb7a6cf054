"""skyrl-1 (non-default: ``advantage_estimator: gae`` with a critic and ``use_sample_packing: false``).

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-1.py``.

skyrl-train 0.3.1's trainer passes the critic's values as produced (``trainer.py:777``,
``values=data["values"]``) to ``ppo_utils.compute_advantages_and_returns``; with the GAE estimator the
recursion (``compute_gae_advantage_return``) reads ``values[:, t + 1]`` at every column and ignores
``response_mask``. The critic wrapper (``model_wrapper.py`` ``values[:, -num_actions:]``) returns a value
for every slot of a right-padded batch; with sample packing (the default ``use_sample_packing: true``)
``pad_input`` fills the padded slots with 0, which the recursion handles as "no bootstrap", but with
``use_sample_packing: false`` the critic's output on the pad tokens is bootstrapped into the last action
token's advantage. Default settings (``advantage_estimator: grpo``; or GAE with sample packing) are
unaffected. The critic output below is a stand-in: 0.3 on the action tokens, 5.0 on the pad tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf
from skyrl_train.utils.ppo_utils import compute_advantages_and_returns

response_mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])  # the score on the last action token
critic = torch.tensor([[0.3, 0.3, 0.3, 0.3], [0.3, 0.3, 5.0, 5.0]])  # values of the pad slots: 5.0
config = OmegaConf.create({"advantage_estimator": "gae", "gamma": 1.0, "lambd": 0.95})


def run(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_advantages_and_returns(  # the call of RayPPOTrainer.compute_advantages_and_returns
        token_level_rewards=rewards,
        response_mask=response_mask,
        index=np.array(["a", "b"]),
        adv_estimator="gae",
        config=config,
        values=values,
        gamma=1.0,
        lambd=0.95,
        grpo_norm_by_std=True,
    )


_, got = run(critic)
_, expected = run(critic * response_mask)  # what sample packing (pad_input's zeros) gives
print(
    "returns on the action tokens of the padded row, use_sample_packing=false: got",
    [round(x, 4) for x in got[1, :2].tolist()],
)
print(
    "expected (the pad slots' values ignored, as with sample packing):          ",
    [round(x, 4) for x in expected[1, :2].tolist()],
)
