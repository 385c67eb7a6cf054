"""trl-approxkl-unmasked (metrics-only), through TRL 1.12's own ``PPOTrainer.train``.

Run from the repository root: ``.envs/trl/bin/python findings/repro/trl-approxkl-unmasked.py``.

One PPO iteration of ``trl.experimental.ppo.PPOTrainer`` on tiny random GPT-2 models (the benchmark's
models and tokenizer, ``bench/tiny_ppo.py``), default settings except: a stop token inside the
vocabulary (so responses end early and get padded, as with any real EOS), 8 prompts, 16 response
tokens, one mini-batch, two PPO epochs, ``bf16=False`` and no sample generations (CPU). A wrapper
around ``accelerator.backward`` reads ``train()``'s own locals at each micro-batch (the log-ratio
``logprobs_diff`` and ``padding_mask``), so the expected figures come from the very tensors the
trainer used: ``approxkl`` over the action tokens only, against the logged ``policy/approxkl_avg``,
which averages ``0.5 * logprobs_diff**2`` over every position, padding included (the padded slots
hold ``INVALID_LOGPROB`` in both log-probs, so they add 0 and count in the denominator).
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
            bf16=False,
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
            diff = f["logprobs_diff"].detach()
            action = ~f["padding_mask"][f["micro_batch_inds"]]
            seen.append(
                {
                    "unmasked": float(0.5 * (diff**2).mean()),
                    "action_tokens": float(0.5 * (diff[action] ** 2).mean()),
                    "ratio_unmasked": float(torch.exp(diff).mean()),
                    "ratio_action_tokens": float(torch.exp(diff[action]).mean()),
                    "padding_share": float(1 - action.float().mean()),
                }
            )
            return backward(loss, **kwargs)

        trainer.accelerator.backward = spy
        trainer.train()
        logged = next(e for e in trainer.state.log_history if "policy/approxkl_avg" in e)
    n = len(seen)
    expected = sum(m["action_tokens"] for m in seen) / n
    unmasked = sum(m["unmasked"] for m in seen) / n
    print(f"micro-batches: {n}, padding share of the response slots: {seen[0]['padding_share']:.3f}")
    print(f"policy/approxkl_avg logged by PPOTrainer.train: {logged['policy/approxkl_avg']:.6g}")
    print(f"  the unmasked mean of the same log-ratios:      {unmasked:.6g}")
    print(f"expected (0.5 * mean of logprobs_diff**2 over action tokens): {expected:.6g}")
    ratio = sum(m["ratio_action_tokens"] for m in seen) / n
    print(f"val/ratio logged: {logged['val/ratio']:.6g}; expected over action tokens: {ratio:.6g}")


if __name__ == "__main__":
    main()
