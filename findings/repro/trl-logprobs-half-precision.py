"""trl-logprobs-half-precision (non-default: a bfloat16 policy), through TRL 1.12's ``PPOTrainer.train``.

Run from the repository root: ``.envs/trl/bin/python findings/repro/trl-logprobs-half-precision.py``.

Same run as ``trl-approxkl-unmasked.py`` with ``PPOConfig``'s default ``bf16=True`` and the policy
loaded in bfloat16 (``torch_dtype=torch.bfloat16``, the non-default setting; with float32 weights the
CPU run gives float32 logits, checked with ``--float32-policy``): the logits reach
``selective_log_softmax`` in bfloat16 and the log-probs of the loss come back in bfloat16. A wrapper
around ``accelerator.backward`` reads ``train()``'s locals at each micro-batch and compares
``new_logprobs`` with the float32 log-softmax of the same logits. The run: one PPO iteration on the
benchmark's tiny random GPT-2 models, 8 prompts, 16 response tokens, an in-vocabulary stop token, one
mini-batch, two PPO epochs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch

from bench import tiny_ppo as s

STOP_TOKEN = 7  # an in-vocabulary stop token: about one response in four stops before 16 tokens


def main() -> None:
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    torch.manual_seed(0)
    models = s.build_models()
    if "--float32-policy" not in sys.argv:
        models["policy"] = models["policy"].to(torch.bfloat16)
    ids = s.prompt_ids().tolist()[:8]
    with tempfile.TemporaryDirectory() as out:
        config = PPOConfig(
            output_dir=out,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=8,
            gradient_accumulation_steps=1,
            num_mini_batches=1,
            local_rollout_forward_batch_size=8,
            total_episodes=8,  # one iteration
            num_ppo_epochs=2,
            response_length=16,
            stop_token_id=STOP_TOKEN,
            learning_rate=3e-3,
            num_sample_generations=0,
            gradient_checkpointing=False,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            seed=0,
        )
        trainer = PPOTrainer(
            args=config,
            processing_class=s.build_tokenizer(),
            model=models["policy"],
            ref_model=models["reference"],
            reward_model=models["reward"],
            value_model=models["value"],
            train_dataset=Dataset.from_dict({"input_ids": ids}),
            eval_dataset=Dataset.from_dict({"input_ids": ids}),
        )
        seen: list[dict[str, float]] = []
        backward = trainer.accelerator.backward

        def spy(loss: Any, **kwargs: Any) -> Any:
            f = sys._getframe(1).f_locals  # PPOTrainer.train's frame
            logits, responses = f["logits"].detach(), f["mb_responses"]
            action = ~f["padding_mask"][f["micro_batch_inds"]]
            got = f["new_logprobs"].detach()
            exact = torch.log_softmax(logits.float(), -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
            err = (got.float() - exact)[action].abs()
            seen.append(
                {
                    "logits_dtype": str(logits.dtype),
                    "logprobs_dtype": str(got.dtype),
                    "max_err": float(err.max()),
                    "mean_err": float(err.mean()),
                    "ratio_err": float((torch.exp(err) - 1).max()),
                }
            )
            return backward(loss, **kwargs)

        trainer.accelerator.backward = spy
        trainer.train()
    print(f"PPOConfig bf16 (left at its default): {config.bf16}")
    for i, m in enumerate(seen):
        print(
            f"micro-batch {i}: logits {m['logits_dtype']}, new_logprobs {m['logprobs_dtype']}; "
            f"|new_logprobs - float32 log-softmax| on action tokens: max {m['max_err']:.4g}, "
            f"mean {m['mean_err']:.4g} (expected 0 up to float32 rounding, spec LOGP-3)"
        )
    print("the same error enters the ratio exp(new - old): up to", f"{max(m['ratio_err'] for m in seen):.3%}")


if __name__ == "__main__":
    main()
