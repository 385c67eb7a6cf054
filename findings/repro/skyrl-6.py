"""skyrl-6, its precision part (non-default: flash-attn's cross-entropy kernel not installed).

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-6.py``.

skyrl-train 0.3.1's ``HFModelWrapper.forward`` (``model_wrapper.py``) divides the model's logits (bf16
under the default ``trainer.bf16: true``) by the temperature in place and passes them to
``skyrl_train.utils.torch_utils.logprobs_from_logits``. With flash-attn installed (the default GPU
set-up, ``flash_attn: true``) that uses flash-attn's float32 cross-entropy kernel; without it the
fallback ``logprobs_from_logits_v2`` runs ``log_softmax`` in bf16 and returns bf16 (spec LOGP-3: float32
math). ``chunked_entropy_from_logits`` allocates its output in the logits' dtype on every path (the
entropy is logged; it enters the loss only with ``use_entropy_loss: true``). The other part of skyrl-6
(``masked_whiten`` leaves masked-out entries non-zero) is off-mask only: no script.
"""

from __future__ import annotations

import torch
from skyrl_train.utils import torch_utils as U

print("flash-attn cross-entropy available:", U.FLASH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE)
torch.manual_seed(0)
logits = (torch.randn(4, 16, 128) * 3).to(torch.bfloat16)  # (batch, response tokens, vocabulary)
labels = torch.randint(0, 128, (4, 16))
got = U.logprobs_from_logits(logits, labels)
exact = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
err = (got.float() - exact).abs()
print(
    f"log-probs: got dtype {got.dtype}, max |error| {err.max():.4g}, "
    f"mean {err.mean():.4g}; expected float32, "
    "error ~1e-6"
)
ent = U.chunked_entropy_from_logits(logits)
print(f"entropy: got dtype {ent.dtype}; expected float32")
