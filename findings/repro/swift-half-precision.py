"""swift-half-precision (non-default): ms-swift 4.6.0's GRPO trainer computes the log-probs and the
entropies of a bf16 model's logits in bf16. ``GRPOTrainer._get_logps_via_local_forward``
(swift/rlhf_trainers/grpo_trainer.py:1563-1606) takes ``model(**inputs).logits``, divides them by the
temperature in place and calls ``selective_log_softmax`` (grpo_trainer.py:38) and
``entropy_from_logits`` (grpo_trainer.py:64-67), both TRL's (trl 0.29.1 ``trl/trainer/utils.py:525``,
``:572``), which run ``log_softmax`` in the input dtype and return it (spec LOGP-3 / ENT-1: float32
math). The entropies are computed when ``log_entropy`` or ``top_entropy_quantile < 1`` is set
(grpo_trainer.py:2111) and feed the ``top_entropy_quantile`` token mask (grpo_trainer.py:959-962, 1061-1062).

Run from the repository root: ``.envs/swift/bin/python findings/repro/swift-half-precision.py``
(standalone: ``pip install ms-swift==4.6.0 msgspec torch``; imports only torch, transformers, accelerate
and swift).

Trigger: a model whose forward returns bf16 logits (bf16 weights with no float32 output conversion:
e.g. DeepSpeed with bf16, or a model not wrapped by accelerate's mixed precision). Here a tiny
random Qwen2 (Qwen vocabulary size 151936) loaded in bf16, its own forward. Expected: the same
numbers computed in float64 from the very same bf16 logits (float32 rounding, < 1e-3). Not at
ms-swift's float32 weights, and not when accelerate's ``mixed_precision='bf16'`` wraps the model
(its forward returns float32 logits: checked below). Exit 1 while the bf16 error appears.
"""

from __future__ import annotations

import copy
import sys

import torch
from accelerate import Accelerator
from swift.rlhf_trainers import grpo_trainer
from transformers import Qwen2Config, Qwen2ForCausalLM

torch.manual_seed(0)
config = Qwen2Config(
    vocab_size=151936,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
model32 = Qwen2ForCausalLM(config).eval()
input_ids = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
temperature = 0.9  # any; GRPOTrainer divides the logits by it in place


def measure(model: torch.nn.Module, label: str) -> tuple[float, float]:
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits[:, :-1, :]
        logits.div_(temperature)
        labels = input_ids[:, 1:]
        logps = grpo_trainer.selective_log_softmax(logits, labels)
        ent = grpo_trainer.entropy_from_logits(logits)
        ref_logp = torch.log_softmax(logits.double(), -1)
        ref_logps = ref_logp.gather(-1, labels[..., None]).squeeze(-1)
        ref_ent = -(ref_logp.exp() * ref_logp).sum(-1)
    err_lp = (logps.double() - ref_logps).abs().max().item()
    err_ent = (ent.double() - ref_ent).abs().max().item()
    print(
        f"{label:38s} logits {logits.dtype!s:15s} log-probs {logps.dtype!s:15s} "
        f"max |err| {err_lp:.3g}; entropies {ent.dtype!s:15s} max |err| {err_ent:.3g} "
        f"(mean entropy {ref_ent.mean().item():.4f})"
    )
    return err_lp, err_ent


print("entropy_from_logits is", grpo_trainer.entropy_from_logits.__module__ + ".entropy_from_logits")
measure(model32, "float32 weights (where it does not)")
model16 = Qwen2ForCausalLM(config).eval()
model16.load_state_dict(model32.state_dict())
model16 = model16.to(torch.bfloat16)
accel = Accelerator(mixed_precision="bf16", cpu=True).prepare_model(copy.deepcopy(model16))
measure(accel, "bf16 weights, accelerate bf16 (not)")
err_lp, err_ent = measure(model16, "bf16 weights (trigger)")
print("expected: max |err| < 1e-3 (float32 math)")
sys.exit(1 if max(err_lp, err_ent) > 1e-3 else 0)
