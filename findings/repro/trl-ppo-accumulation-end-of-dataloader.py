"""trl-ppo-accumulation-end-of-dataloader (non-default): with ``gradient_accumulation_steps = k > 1``,
the PPO iteration that draws the prompt loader's last batch takes an optimizer step at every micro-batch.

Interpreter: .envs/trl/bin/python (any env with ``pip install trl==1.12.0``; TRL removed PPO in 1.13).
Run from the repository root:
``.envs/trl/bin/python findings/repro/trl-ppo-accumulation-end-of-dataloader.py``.

Drives ``trl.experimental.ppo.PPOTrainer.train()`` itself, two iterations, real sampling, on tiny
random GPT-2 policy, reference, value and reward models built from a config and a 16-token word-level
tokenizer built in-process (no hub, no network; writes only in a tempfile directory). The prompts
fill exactly two loader batches, so iteration 1 is mid-pass and iteration 2 draws the loader's last
batch. ``train()`` wraps each micro-batch in ``accelerator.accumulate(model)`` and calls
``optimizer.step()`` after each (``ppo_trainer.py:810-850``), relying on accelerate to skip the
step until the k-th micro-batch. ``PPOTrainer.__init__`` builds its own
``Accelerator(gradient_accumulation_steps=...)`` (``:460``), whose ``sync_with_dataloader`` is
True (accelerate's default; ``GradientAccumulationPlugin`` is not passed), and ``train()``'s
prompts come from ``repeat_generator()`` over that prepared loader: once the loader has yielded its
last batch, ``Accelerator._do_sync`` syncs at every micro-batch, so each one is an optimizer step
of a 1/k-scaled gradient and the later micro-batches see a ratio off 1 before their mini-batch's step.

Counted: calls of the wrapped torch optimizer's ``step`` in each iteration. Expected (one step per
mini-batch per PPO epoch): ``num_ppo_epochs * num_mini_batches`` = 4 * 1 = 4 at TRL's defaults,
whatever k; and max |new_logprobs - old logprobs| over the action tokens of the first epoch's
micro-batches ~0 (no step has been taken yet; generation's and the forward's temperature
divisions match). Triggering setting (exit 1): k = 2 (TRL's ``ppo.py`` recipe uses
``--gradient_accumulation_steps 16``, ``ppo_tldr.py`` 64 or 4). Also run: TRL's default k = 1.
``learning_rate`` is raised to 1e-3 so that the extra steps move the ratio visibly (the step count
does not depend on it).
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
PROMPT, RESPONSE, PER_DEVICE = 4, 8, 4


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


def run(k: int, seed: int = 0) -> dict[int, dict[str, float]]:
    """Two train() iterations; per iteration: optimizer steps and epoch-0 max |log-ratio|."""
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    m = models_(seed)
    g = torch.Generator().manual_seed(seed)
    batch = PER_DEVICE * k
    prompts = torch.randint(2, VOCAB, (2 * batch, PROMPT), generator=g).tolist()  # two loader batches
    with tempfile.TemporaryDirectory() as out:
        config = PPOConfig(
            output_dir=out, per_device_train_batch_size=PER_DEVICE, gradient_accumulation_steps=k,
            total_episodes=2 * batch, response_length=RESPONSE, learning_rate=1e-3,
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
        seen: dict[int, dict[str, float]] = {}
        current = {"update": 0}
        backward = trainer.accelerator.backward

        def spy(loss: Any, **kwargs: Any) -> Any:
            f = sys._getframe(1).f_locals  # PPOTrainer.train's frame
            current["update"] = f["update"]
            stats = seen.setdefault(f["update"], {"steps": 0, "ratio": 0.0})
            if f["ppo_epoch_idx"] == 0:
                action = ~f["padding_mask"][f["micro_batch_inds"]]
                diff = f["logprobs_diff"].detach()[action].abs()
                stats["ratio"] = max(stats["ratio"], float(diff.max()))
            return backward(loss, **kwargs)

        inner = trainer.optimizer.optimizer  # the torch optimizer under accelerate's wrapper
        step = inner.step

        def counted(*args: Any, **kwargs: Any) -> Any:
            seen[current["update"]]["steps"] += 1
            return step(*args, **kwargs)

        inner.step = counted
        trainer.accelerator.backward = spy
        np.random.seed(seed)  # train()'s mini-batch shuffle (np.random.permutation) is not seeded by TRL
        trainer.train()
        expected = config.num_ppo_epochs * config.num_mini_batches
    for stats in seen.values():
        stats["expected"] = expected
    return seen


def main() -> int:
    torch.set_num_threads(1)
    wrong = False
    for label, k in (
        ("trigger: gradient_accumulation_steps=2", 2),
        ("defaults: gradient_accumulation_steps=1", 1),
    ):
        for update, s in sorted(run(k).items()):
            where = "draws the loader's last batch" if update == 2 else "mid-pass"
            print(
                f"{label}, iteration {update} ({where}): optimizer steps expected {s['expected']:.0f}, "
                f"got {s['steps']:.0f}; epoch-0 max |logp - old_logp| expected ~0 (float rounding), "
                f"got {s['ratio']:.3g}"
            )
            wrong |= k > 1 and s["steps"] != s["expected"]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
