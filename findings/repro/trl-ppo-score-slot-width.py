"""trl-ppo-score-slot-width (non-default: a stop token): in TRL 1.12's ``PPOTrainer.train`` the
EOS-ended response that fills the batch's width gets its score and advantages by another rule.

Interpreter: .envs/trl/bin/python (any env with ``pip install trl==1.12.0``; TRL removed PPO in 1.13).
Run from the repository root: ``.envs/trl/bin/python findings/repro/trl-ppo-score-slot-width.py``.

Drives ``trl.experimental.ppo.PPOTrainer.train()`` itself, one iteration, real sampling, on tiny
random GPT-2 policy, reference, value and reward models built from a config and a 6-token word-level
tokenizer built in-process (a small vocabulary, so that sampled responses end at EOS within the
budget; no hub, no network; writes only in a tempfile directory). TRL's declared design puts a
response's score one slot after its last token and keeps the critic's value there in the GAE
(``sequence_lengths_p1``, ``padding_mask_p1``, ``ppo_trainer.py:767-779``). But ``actual_end =
where(sequence_lengths_p1 < width, sequence_lengths_p1, sequence_lengths)`` (``:778``): the EOS-ended
response that fills the padded width (the longest of the batch, whenever every response of the batch
stopped before ``response_length``) gets the score on its EOS token and no ``V(EOS+1)``, so its
advantages depend on whether a longer response happened to share its batch (with ``lam < 1``; TRL's
default ``lam`` is 0.95).

Expected: TRL's own rule applied to every EOS-ended response, computed inline with plain torch from
``train()``'s tensors (read at the first micro-batch by a wrapper around ``accelerator.backward``):
for a width-filling EOS-ended row, the score at slot W (one past its EOS) with ``V(W)`` = the value
model's output at the EOS position (``trl.experimental.utils.get_reward`` on the same
``query_responses``, the column ``train()`` slices off), KL reward 0 there, then TRL's GAE
``delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}`` over W+1 columns and
TRL's ``masked_whiten`` over the action tokens. Rows cut at the budget keep TRL's treatment. Printed:
max |advantages - expected| over the action tokens / max |expected|.

Triggering setting (exit 1 when the error exceeds 1e-4 and a width-filling EOS-ended row exists):
``stop_token="eos"`` (TRL's ``ppo_tldr.py`` recipe). Also run: TRL's defaults (``stop_token=None``:
no response is truncated at EOS, every row fills the width and is scored on its last token by one
rule; the same computation then reproduces TRL's advantages, which checks the formula).
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

VOCAB = 6  # model vocabulary; the tokenizer's [PAD] is id 6, outside it (TRL masks pad ids to 0 before
EOS = 1  # every forward, as in TRL's ppo_tldr.py where [PAD] is added to the tokenizer)
PROMPT, RESPONSE, PER_DEVICE = 4, 24, 8
TOLERANCE = 1e-4


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


def whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's ``masked_whiten`` (mean and Bessel-corrected variance over ``mask``), as its formula reads."""
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = ((values - mean) ** 2 * mask).sum() / n * n / (n - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def expected_advantages(f: dict[str, Any], trainer: Any) -> tuple[torch.Tensor, int]:
    """TRL's rule (score one past EOS, V kept there) for every EOS-ended row; see the docstring."""
    from trl.experimental.utils import get_reward

    args, width = trainer.args, f["responses"].shape[1]
    lengths, post = f["sequence_lengths"], f["postprocessed_responses"]
    rows = torch.arange(len(lengths))
    stop = trainer.stop_token_id
    ended = torch.zeros_like(lengths, dtype=torch.bool) if stop is None else post[rows, lengths] == stop
    filled = ended & (lengths + 1 >= width)
    value_model = trainer.accelerator.unwrap_model(trainer.model).value_model
    with torch.no_grad():
        full, _, _ = get_reward(
            value_model, f["query_responses"], trainer.processing_class.pad_token_id, f["context_length"]
        )
    v_last = full[:, -1].squeeze(-1)  # the value at the last response position (EOS of a filled row)
    values = torch.cat([f["values"], torch.zeros(len(lengths), 1)], 1)
    values[filled, width] = v_last[filled]
    rewards = torch.cat([f["non_score_reward"], torch.zeros(len(lengths), 1)], 1)
    slot = torch.where(filled | (lengths + 1 < width), lengths + 1, lengths)
    rewards[rows, slot] += f["scores"]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros(len(lengths))
    for t in reversed(range(width + 1)):
        following = values[:, t + 1] if t < width else torch.zeros(len(lengths))
        last = rewards[:, t] + args.gamma * following - values[:, t] + args.gamma * args.lam * last
        advantages[:, t] = last
    action = ~f["padding_mask"]
    return whiten(advantages[:, :width], action).masked_fill(~action, 0), int(filled.sum())


def run(stop_token: str | None, seed: int = 0) -> tuple[float, int, int, float]:
    """One train() iteration: (relative advantage error, filled EOS rows, width, largest entry)."""
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    m = models_(seed)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, VOCAB, (2 * PER_DEVICE, PROMPT), generator=g).tolist()
    with tempfile.TemporaryDirectory() as out:
        config = PPOConfig(
            output_dir=out, per_device_train_batch_size=PER_DEVICE, total_episodes=PER_DEVICE,
            response_length=RESPONSE, stop_token=stop_token, num_ppo_epochs=1,
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
        record: dict[str, Any] = {}
        backward = trainer.accelerator.backward

        def spy(loss: Any, **kwargs: Any) -> Any:
            f = sys._getframe(1).f_locals  # PPOTrainer.train's frame
            if not record:
                expected, filled = expected_advantages(f, trainer)
                action = ~f["padding_mask"]
                got = f["advantages"]
                scale = float(expected[action].abs().max())
                record.update(
                    err=float((got - expected)[action].abs().max()) / scale, filled=filled,
                    width=int(f["responses"].shape[1]), scale=scale,
                )  # fmt: skip
            return backward(loss, **kwargs)

        trainer.accelerator.backward = spy
        np.random.seed(seed)  # train()'s mini-batch shuffle (np.random.permutation) is not seeded by TRL
        trainer.train()
    return record["err"], record["filled"], record["width"], record["scale"]


def main() -> int:
    torch.set_num_threads(1)
    wrong = False
    for label, stop in (("trigger: stop_token='eos'", "eos"), ("defaults: stop_token=None", None)):
        err, filled, width, scale = run(stop)
        print(
            f"{label}: batch width {width} of response_length {RESPONSE}, "
            f"EOS-ended rows filling it {filled}; "
            f"max |advantages - expected| / max |expected| expected 0 (< {TOLERANCE:g}), got {err:.3g} "
            f"(largest entry {scale:.4g})"
        )
        if stop is not None and filled == 0:
            print("the sampled batch has no width-filling EOS-ended row: the condition was not produced")
            return 2
        wrong |= stop is not None and err > TOLERANCE
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
