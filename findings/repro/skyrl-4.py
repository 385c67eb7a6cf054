"""skyrl-4 (non-default: ``loss_reduction: sequence_mean`` with rows whose loss mask is all zero, e.g.
``generator.apply_overlong_filtering: true``).

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-4.py``.

skyrl-train 0.3.1's generator zeroes the whole loss mask of a truncated response when
``apply_overlong_filtering`` is true (``generators/utils.py`` ``apply_overlong_filtering``, DAPO's overlong
filter). With ``trainer.algorithm.loss_reduction: sequence_mean`` the policy loss
(``ppo_policy_loss`` -> ``reduce_loss``) is ``masked_mean(loss, mask, dim=-1).mean()``: each filtered row
adds a 0 to the mean over rows, so the loss and its gradient shrink by the share of filtered rows.
The critic loss (``ppo_critic_loss``) reduces the same way whatever ``loss_reduction`` says. Default
settings (``token_mean``, no overlong filtering) are unaffected.
"""

from __future__ import annotations

import pathlib
import sys

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _skyrl_stubs

_skyrl_stubs.install()  # skyrl_train.generators imports skyrl_gym, transformers, ... at top level

from skyrl_train.generators.utils import apply_overlong_filtering  # noqa: E402
from skyrl_train.utils.ppo_utils import ppo_critic_loss, ppo_policy_loss  # noqa: E402

EOS = 2
responses = [[5, 6, EOS], [7, 8, 9]]  # the second one was cut at the length limit
loss_masks = apply_overlong_filtering([[1, 1, 1], [1, 1, 1]], responses, EOS)
mask = torch.tensor(loss_masks, dtype=torch.float32)
print("loss masks after apply_overlong_filtering:", loss_masks)
config = OmegaConf.create(
    dict(
        policy_loss_type="regular",
        loss_reduction="sequence_mean",
        eps_clip_low=0.2,
        eps_clip_high=0.2,
        clip_ratio_c=3.0,
        use_tis=False,
        tis_imp_ratio_cap=-1.0,
        max_seq_len=None,
    )
)
logp = torch.zeros(2, 3, requires_grad=True)
advantages = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
loss, _ = ppo_policy_loss(logp, logp.detach().clone(), advantages, config, loss_mask=mask)
loss.backward()
print(
    "policy loss (sequence_mean): got", round(loss.item(), 4), "expected -2.0 (the one kept row's mean of -A)"
)
print(
    "d loss / d logp row 0: got",
    [round(x, 4) for x in logp.grad[0].tolist()],
    "expected [-0.3333, -0.6667, -1.0]",
)
values = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
vloss, _ = ppo_critic_loss(
    values, values.clone(), torch.zeros(2, 3), OmegaConf.create({"value_clip": 0.2}), loss_mask=mask
)
print("critic loss: got", round(vloss.item(), 4), "expected", round(0.5 * (1 + 4 + 9) / 3, 4))
