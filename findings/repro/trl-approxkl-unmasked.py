"""trl-approxkl-unmasked (metrics-only, with a stop token): TRL 1.12's logged ``policy/approxkl_avg``
and ``val/ratio`` average over the padding after EOS.

Interpreter: .envs/trl/bin/python (any env with ``pip install trl==1.12.0``; TRL removed PPO in 1.13).
Run from the repository root: ``.envs/trl/bin/python findings/repro/trl-approxkl-unmasked.py``.

Drives ``trl.experimental.ppo.PPOTrainer.train()`` itself, one iteration, real sampling, on tiny
random GPT-2 policy, reference, value and reward models built from a config and a 16-token word-level
tokenizer built in-process (no hub, no network; writes only in a tempfile directory). ``train()``
logs ``approxkl = 0.5 * (logprobs_diff**2).mean()`` and ``ratio.mean()`` per micro-batch
(``ppo_trainer.py:857``, ``:868``) over every response slot; the padded slots hold
``INVALID_LOGPROB`` in both log-probs, so they add 0 to the KL and exp(0) = 1 to the ratio while
counting in the denominator. Expected, from ``train()``'s own tensors read at each micro-batch (a
wrapper around ``accelerator.backward`` reads its frame), averaged over micro-batches the way
``train()`` averages its stats:

    approxkl_expected = mean_mb [ 0.5 * sum_{action tokens} logprobs_diff**2 / n_action ]
    ratio_expected    = mean_mb [ sum_{action tokens} exp(logprobs_diff) / n_action ]

Triggering setting (exit 1 when the logged value is off by more than 1e-3 relative):
``stop_token="eos"`` (responses end at EOS and are padded, as in TRL's ``ppo_tldr.py`` recipe,
``--stop_token eos``). Also run: TRL's defaults (``stop_token=None``: no response is truncated, no
padding, so the unmasked mean is the token mean). The loss does not use either statistic and TRL
has no early stop on them: training is unaffected. ``learning_rate`` is raised to 3e-3 so that the
log-ratios of the later PPO epochs are well above rounding (the dilution does not depend on it).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

VOCAB = 16  # model vocabulary; the tokenizer's [PAD] is id 16, outside it (TRL masks pad ids to 0 before
EOS = 1  # every forward, as in TRL's ppo_tldr.py where [PAD] is added to the tokenizer)
PROMPT, RESPONSE, PER_DEVICE = 4, 12, 8
TOLERANCE = 1e-3


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)} | {"[PAD]": VOCAB}
    vocab["<eos>"] = EOS
    del vocab[f"t{EOS}"]
    raw = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", eos_token="<eos>")


def models_(seed: int) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    sizes = {"n_positions": 32, "n_embd": 16, "n_layer": 1, "n_head": 2}
    config = GPT2Config(vocab_size=VOCAB, num_labels=1, bos_token_id=EOS, eos_token_id=EOS, **sizes)
    built: dict[str, Any] = {}
    for name, cls, offset in (("policy", GPT2LMHeadModel, 0), ("ref", GPT2LMHeadModel, 0)):
        torch.manual_seed(seed + offset)
        built[name] = cls(config)
    for name, offset in (("value", 1), ("reward", 2)):
        torch.manual_seed(seed + offset)
        built[name] = GPT2ForSequenceClassification(config)
    return built


def run(stop_token: str | None, seed: int = 0) -> dict[str, float]:
    """One train() iteration; the logged statistics and the token means of the same log-ratios."""
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    m = models_(seed)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, VOCAB, (2 * PER_DEVICE, PROMPT), generator=g).tolist()
    with tempfile.TemporaryDirectory() as out:
        config = PPOConfig(
            output_dir=out, per_device_train_batch_size=PER_DEVICE, total_episodes=PER_DEVICE,
            response_length=RESPONSE, stop_token=stop_token, learning_rate=3e-3,
            num_sample_generations=0, report_to="none", save_strategy="no", use_cpu=True, seed=seed,
        )  # fmt: skip
        trainer = PPOTrainer(
            args=config,
            processing_class=tokenizer(),
            model=m["policy"],
            ref_model=m["ref"],
            reward_model=m["reward"],
            value_model=m["value"],
            train_dataset=Dataset.from_dict({"input_ids": prompts}),
        )
        seen: list[dict[str, float]] = []
        backward = trainer.accelerator.backward

        def spy(loss: Any, **kwargs: Any) -> Any:
            f = sys._getframe(1).f_locals  # PPOTrainer.train's frame
            diff = f["logprobs_diff"].detach()
            action = ~f["padding_mask"][f["micro_batch_inds"]]
            seen.append(
                {
                    "kl": float(0.5 * (diff[action] ** 2).mean()),
                    "ratio": float(torch.exp(diff[action]).mean()),
                    "padding": float(1 - action.float().mean()),
                }
            )
            return backward(loss, **kwargs)

        trainer.accelerator.backward = spy
        np.random.seed(seed)  # train()'s mini-batch shuffle (np.random.permutation) is not seeded by TRL
        trainer.train()
        logged = next(e for e in trainer.state.log_history if "policy/approxkl_avg" in e)
    n = len(seen)
    return {
        "kl": sum(s["kl"] for s in seen) / n,
        "ratio": sum(s["ratio"] for s in seen) / n,
        "padding": seen[0]["padding"],
        "logged_kl": float(logged["policy/approxkl_avg"]),
        "logged_ratio": float(logged["val/ratio"]),
    }


def main() -> int:
    torch.set_num_threads(1)
    wrong = False
    for label, stop in (("trigger: stop_token='eos'", "eos"), ("defaults: stop_token=None", None)):
        r = run(stop)
        rel = abs(r["logged_kl"] - r["kl"]) / r["kl"]
        print(
            f"{label}: padding share of the response slots {r['padding']:.3f}; policy/approxkl_avg expected "
            f"{r['kl']:.6g}, got {r['logged_kl']:.6g} (relative error {rel:.3g}); val/ratio expected "
            f"{r['ratio']:.6g}, got {r['logged_ratio']:.6g}"
        )
        wrong |= stop is not None and rel > TOLERANCE
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
