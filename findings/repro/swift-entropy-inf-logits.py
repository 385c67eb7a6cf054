"""swift-entropy-inf-logits (latent): the entropy ms-swift 4.6.0's GRPO trainer computes is NaN for a
distribution with a banned token (logit -inf). ``swift.rlhf_trainers.grpo_trainer`` binds TRL's
``entropy_from_logits`` (grpo_trainer.py:64-67; trl 0.29.1 ``trl/trainer/utils.py:572``; its own
fallback, ``swift/rlhf_trainers/utils.py:646``, is the same formula): ``-(exp(logp) * logp).sum(-1)``,
and ``0 * -inf`` is NaN. The trainer applies it to the model's logits over the temperature
(grpo_trainer.py:1488-1493, 1602-1604), never to masked logits: latent.

Run from the repository root: ``.envs/swift/bin/python findings/repro/swift-entropy-inf-logits.py``
(standalone: ``pip install ms-swift==4.6.0 msgspec torch``; imports only torch and swift).

Trigger: a logit of -inf. Default (what the pipeline passes): finite logits. Expected: the entropy
over the tokens with non-zero probability (Categorical's, computed inline). Exit 1 while NaN appears.
"""

from __future__ import annotations

import sys

import torch
from swift.rlhf_trainers import grpo_trainer
from swift.rlhf_trainers.utils import entropy_from_logits as swift_fallback

banned = torch.tensor([[[0.0, float("-inf"), 1.0986122886681098]]], dtype=torch.float64)
finite = torch.tensor([[[0.0, -30.0, 1.0986122886681098]]], dtype=torch.float64)
p = torch.softmax(banned, -1)
expected = float(-(p[p > 0] * p[p > 0].log()).sum())
got = float(grpo_trainer.entropy_from_logits(banned)[0, 0])
print(f"bound: {grpo_trainer.entropy_from_logits.__module__}.entropy_from_logits")
print(f"trigger  [0, -inf, ln 3]:  expected {expected:.6f} got {got}")
print(f"fallback (swift utils):    got {float(swift_fallback(banned)[0, 0])}")
print(f"default  [0, -30, ln 3]:   got {float(grpo_trainer.entropy_from_logits(finite)[0, 0]):.6f}")
sys.exit(1 if got != got else 0)
