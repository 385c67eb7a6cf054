"""verl-7 (non-default: flash-attn's cross-entropy kernel absent, or ``VERL_DISABLE_FLASH_ATTN_CE=1``).

Run from the repository root: ``.envs/verl/bin/python findings/repro/verl-7.py``.

verl 0.9.1's FSDP engine (``workers/engine/fsdp/transformer_impl.py``) passes the model's logits, in
the parameter dtype (bf16 under its default mixed precision), to ``verl.utils.torch_functional.
logprobs_from_logits``. With flash-attn installed (the usual GPU install) that goes to flash-attn's
cross-entropy kernel, which computes in float32; without it (CPU, AMD, no flash-attn, or
``VERL_DISABLE_FLASH_ATTN_CE=1`` for bitwise reproducibility) it falls back to
``logprobs_from_logits_v2``, whose ``log_softmax`` runs in bf16 and returns bf16 log-probs (spec LOGP-3:
float32 math). The entropy (``entropy_from_logits``) is computed in the logits' dtype on every path;
with the default ``entropy_coeff: 0`` it is only logged. This script runs the fallback path (flash-attn
is not installed in .envs/verl) on bf16 logits as the engine hands them over.
"""

from __future__ import annotations

import torch
from verl.utils import torch_functional as F

print("flash-attn cross-entropy available:", F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE)
torch.manual_seed(0)
logits = (torch.randn(4, 16, 128) * 3).to(torch.bfloat16)  # (batch, response tokens, vocabulary)
labels = torch.randint(0, 128, (4, 16))
got = F.logprobs_from_logits(logits, labels)
exact = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
err = (got.float() - exact).abs()
print(
    f"log-probs: got dtype {got.dtype}, max |error| {err.max():.4g}, "
    f"mean {err.mean():.4g}; expected float32, "
    "error ~1e-6"
)
print(f"ratio exp(new - old) off by up to {float(torch.exp(err.max()) - 1):.3%} from this rounding alone")
ent = F.entropy_from_logits(logits)
ent32 = F.entropy_from_logits(logits.float())
print(
    f"entropy: got dtype {ent.dtype}, max |error| {(ent.float() - ent32).abs().max():.4g}; expected float32"
)
