"""trl116-f1: with ``mask_truncated_completions=True``, GRPOTrainer's ``loss_type="grpo"`` and
``"luspo"`` average over every completion, the masked-out truncated ones included, so each truncated
completion scales the other completions' gradient down by (kept / all).

Interpreter: ``.envs/trl116/bin/python findings/repro/trl116-f1.py`` (from the repository root;
standalone: ``pip install trl==1.16.0 transformers==5.24.0 torch datasets``).

What it drives: one optimizer step of ``trl.GRPOTrainer.train()`` (``max_steps=1``), completions given
by the public ``rollout_func`` argument (fixed token ids, so no sampling), a reward function returning
fixed scores; TRL itself masks the truncated completion (``_generate_and_score_completions``), computes
the group advantages and runs ``_compute_loss`` and backward. A ``TrainerCallback`` reads the gradient
at ``on_pre_optimizer_step``. A tiny GPT-2 (the family does not matter: this is the aggregation), the
prompts of equal length (no padding).

Batch: 2 prompts x 2 completions; one completion fills ``max_completion_length=4`` without EOS
(truncated), the other three end with EOS.

Trigger: ``mask_truncated_completions=True`` with ``loss_type="grpo"`` (and ``"luspo"``, with
``importance_sampling_level="sequence"`` as TRL requires). Also run: ``loss_type="dapo"`` (TRL's
default) with ``mask_truncated_completions=True``, and ``loss_type="grpo"`` with the default
``mask_truncated_completions=False``.

Expected, computed inline with plain torch from the formula (``num_iterations=1``, ``beta=0``: the
ratio is exactly 1, nothing is clipped, so the gradient is that of the policy-gradient surrogate):
``A_i = (r_i - mean_g) / (std_g + 1e-4)`` (TRL's group advantages over all 4 completions), ``log p_i =
sum_t log p_{i,t}`` of the completions the loss keeps (K of them), and

- grpo:  grad of ``-(1/K) sum_{i kept} A_i * log p_i / |o_i|`` (the mean over the completions in the loss)
- luspo: grad of ``-(1/K) sum_{i kept} A_i * log p_i``
- dapo:  grad of ``-(1/N_kept) sum_{i kept} A_i * log p_i`` (N_kept: the kept tokens)

TRL's own docs say truncated completions "are excluded from the loss calculation"; TRL PR #6439 fixed
the same dilution for the token-normalised losses (dapo/cispo/vespo), not for grpo/luspo. Got: TRL's
gradient. With one of four masked, grpo and luspo give 3/4 of the expected gradient.

Exit 1 when grpo or luspo with ``mask_truncated_completions=True`` gives the wrong gradient (relative
difference > 1e-4 of its largest entry); 0 when they do not (a fixed release).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
from datasets import Dataset
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from transformers.utils import logging
from trl import GRPOConfig, GRPOTrainer

logging.set_verbosity_error()
logging.disable_progress_bar()
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5's checkpointing renames

VOCAB, PAD, EOS, BOS = 16, 0, 1, 2
BUDGET = 4  # max_completion_length
# group -> prompt ids, its two completions and their scores; [11, 12, 13, 14] is cut at the budget
GROUPS = {
    "g0": ([3, 4, 5], [[11, 12, 13, 14], [13, 15, 1]], [1.0, 0.0]),
    "g1": ([8, 9, 10], [[5, 6, 1], [7, 1]], [0.0, 1.0]),
}


def tokenizer() -> PreTrainedTokenizerFast:
    words = {"<pad>": PAD, "<eos>": EOS, "<bos>": BOS, **{f"t{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(WordLevel(words, unk_token="<bos>"))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<bos>",
        padding_side="left",
    )  # fmt: skip


def save_model(directory: str) -> str:
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "gpt2", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    tokenizer().save_pretrained(directory)
    return directory


def grpo_step(path: str, out: str, **settings: object) -> dict:
    """One GRPOTrainer.train() step; the gradient by parameter name, read before the optimizer step."""
    seen: dict[str, int] = {}

    def rollout(prompts: list, trainer: object) -> dict:
        rows = []
        for prompt in prompts:  # the sampler repeats each dataset prompt num_generations times
            rows.append((prompt, seen.get(prompt, 0)))
            seen[prompt] = seen.get(prompt, 0) + 1
        return {
            "prompt_ids": [list(GROUPS[g][0]) for g, _ in rows],
            "completion_ids": [list(GROUPS[g][1][j]) for g, j in rows],
            "logprobs": None,
            "score": [GROUPS[g][2][j] for g, j in rows],  # an extra field: passed to the reward function
        }

    def reward(prompts: list, completions: list, score: list, **_: object) -> list:
        return list(score)

    gradient: dict = {}

    class ReadGradient(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            for name, p in kwargs["model"].named_parameters():
                if p.grad is not None:
                    gradient[name] = p.grad.detach().clone()

    args = GRPOConfig(
        output_dir=out, use_cpu=True, report_to="none", logging_strategy="no", save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, dataloader_pin_memory=False, seed=0,
        num_generations=2, per_device_train_batch_size=4, max_completion_length=BUDGET, max_steps=1,
        learning_rate=1e-3, optim="sgd", max_grad_norm=0.0, lr_scheduler_type="constant", warmup_steps=0,
        use_vllm=False, bf16=False, gradient_checkpointing=False,  # float32, CPU; else TRL's defaults
        **settings,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": sorted(GROUPS)}),
        processing_class=PreTrainedTokenizerFast.from_pretrained(path),
        rollout_func=rollout,
        callbacks=[ReadGradient()],
    )
    trainer.remove_callback(PrinterCallback)  # the end-of-training metrics line
    trainer.train()
    return gradient


def expected(path: str, loss_type: str, mask_truncated: bool) -> dict:
    """The formula's gradient (module docstring), from the unpadded rows, plain torch."""
    model = AutoModelForCausalLM.from_pretrained(path)
    terms, tokens = [], 0
    for prompt, completions, scores in GROUPS.values():
        s = torch.tensor(scores)
        for completion, score in zip(completions, scores, strict=True):
            if mask_truncated and completion[-1] != EOS:
                continue  # a truncated completion: not in the loss
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).sum()
            advantage = (score - s.mean()) / (s.std() + 1e-4)
            terms.append(-advantage * (logp / len(completion) if loss_type == "grpo" else logp))
            tokens += len(completion)
    loss = sum(terms) / (tokens if loss_type == "dapo" else len(terms))
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


RUNS = (  # loss_type, mask_truncated_completions, extra settings, trigger?
    ("grpo", True, {}, True),
    ("luspo", True, {"importance_sampling_level": "sequence"}, True),
    ("dapo", True, {}, False),
    ("grpo", False, {}, False),
)
wrong = []
with tempfile.TemporaryDirectory() as tmp:
    path = save_model(os.path.join(tmp, "gpt2"))
    for loss_type, mask_truncated, extra, trigger in RUNS:
        got = grpo_step(
            path,
            os.path.join(tmp, "out"),
            loss_type=loss_type,
            mask_truncated_completions=mask_truncated,
            **extra,
        )
        want = expected(path, loss_type, mask_truncated)
        scale = max(float(g.abs().max()) for g in want.values())
        error = max(float((got[n] - want[n]).abs().max()) for n in want) / scale
        ratio = max(float(g.abs().max()) for g in got.values()) / scale
        bad = error > 1e-4
        print(
            f"loss_type={loss_type!r} mask_truncated_completions={mask_truncated}: largest gradient entry, "
            f"got / expected {ratio:.4f} (expected 1); |got - expected| {error:.3g} of the largest entry"
            + ("  <- WRONG" if bad else "")
        )
        if bad and trigger:
            wrong.append(loss_type)
sys.exit(1 if wrong else 0)
