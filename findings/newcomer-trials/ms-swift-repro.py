"""ms-swift 4.6.0's own functions on the inputs of ms-swift.md's triage; imports swift, trl and torch only.

Run: .envs/swift/bin/python findings/newcomer-trials/ms-swift-repro.py
"""

import torch
from swift.rl_core.advantage import _sdar_agg_loss, compute_advantages, compute_advantages_dynamic
from swift.rlhf_trainers.utils import entropy_from_logits
from trl.trainer.utils import entropy_from_logits as trl_entropy

INF = float("inf")
F64 = torch.float64


def ones(dtype: torch.dtype) -> torch.Tensor:
    return torch.ones(1, dtype=dtype)


# 1. group advantages: float64 rewards crash (prompt_means is allocated float32); float32 works
scores = torch.tensor([0.0, 0.02], dtype=F64)
try:
    compute_advantages_dynamic(scores[:, None], ones(F64), ["a", "a"], ["0", "1"])
except RuntimeError as e:
    print("dynamic, float64:", e)
adv32, _ = compute_advantages_dynamic(scores.float()[:, None], ones(torch.float32), ["a", "a"], ["0", "1"])
print("dynamic, float32:", adv32, "(eps=0.01 would give +-0.4142; 1e-4 is fixed)")
print("fixed-K, float64:", compute_advantages(scores[:, None], ones(F64), 2)[0])
print("pipeline rewards_per_func dtype (torch.zeros default):", torch.zeros((2, 1)).dtype)

# 2. entropy: float16 logits give float16 entropies (swift's fallback and TRL's, which the trainer uses)
logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0)).half() * 5
err = (entropy_from_logits(logits).double() - entropy_from_logits(logits.double())).abs().max().item()
print(
    "entropy float16 dtype swift/trl:",
    entropy_from_logits(logits).dtype,
    trl_entropy(logits).dtype,
    "max err",
    err,
)

# 3. -inf logits: NaN entropy
banned = torch.tensor([[[0.0, -INF, 1.0986122886681098]]], dtype=F64)
print("entropy with -inf logit:", entropy_from_logits(banned), trl_entropy(banned), "(expected 0.5623)")

# 4. aggregation multiplies by the mask: NaN / inf padding gives NaN
per_token = torch.tensor([[1.0, 3.0, float("nan")], [2.0, INF, 0.0]], dtype=F64)
mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=F64)
finite = torch.nan_to_num(per_token, nan=0.0, posinf=0.0)
print(
    "token-mean, junk padding:",
    _sdar_agg_loss(per_token, mask, "token-mean"),
    "finite:",
    _sdar_agg_loss(finite, mask, "token-mean"),
)
empty_row = _sdar_agg_loss(
    torch.tensor([[1.0, 2.0], [5.0, 5.0]]), torch.tensor([[1.0, 1.0], [0.0, 0.0]]), "seq-mean-token-sum"
)
print("seq-mean-token-sum with an empty row:", empty_row, "(3.0 over the rows with action tokens)")
