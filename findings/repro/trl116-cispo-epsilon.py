"""trl116-cispo-epsilon: GRPOTrainer's ``loss_type="cispo"`` clamps the importance weight at
``max=epsilon_high`` (ScaleRL's absolute bound eps_max), but ``epsilon_high`` falls back to ``epsilon``
(0.2, a relative clip range) when not given: every on-policy token (ratio exactly 1) gets weight 0.2,
so the gradient is 1/5 of CISPO's, and the logged ``cispo_clip_ratio`` counts only the
positive-advantage tokens although every token is clamped.

Interpreter: ``.envs/trl116/bin/python findings/repro/trl116-cispo-epsilon.py`` (from the repository
root; standalone: ``pip install trl==1.16.0 transformers==5.24.0 torch datasets``).

What it drives: one optimizer step of ``trl.GRPOTrainer.train()`` (``max_steps=1``), completions given
by the public ``rollout_func`` argument (fixed token ids, so no sampling), a reward function returning
fixed scores; TRL computes the group advantages and runs ``_compute_loss`` and backward. A
``TrainerCallback`` reads the gradient at ``on_pre_optimizer_step`` and the logged metrics at
``on_log`` (``logging_steps=1``). A tiny GPT-2 (the family does not matter), prompts of equal length.

Trigger: ``loss_type="cispo"`` without ``epsilon_high`` (every other setting TRL's default). Also run:
``loss_type="cispo", epsilon_high=5.0`` (the value TRL's docstring recommends) and ``loss_type="dapo"``
(TRL's default loss).

Expected, computed inline with plain torch from the formula: with ``num_iterations=1`` the ratio is
exactly 1, and CISPO's weight ``sg(clip(r, 1 - eps_low, 1 + eps_high))`` (MiniMax-M1, eq. 4-5) or
``sg(min(r, eps_max))`` with eps_max > 1 (ScaleRL) is 1, so for cispo and dapo alike the gradient is that
of ``-(1/N) sum_{i,t} A_i log p_{i,t}`` (``A_i = (r_i - mean_g) / (std_g + 1e-4)``, N the completion
tokens), and no token is clipped (``cispo_clip_ratio`` 0). Got: TRL's gradient (0.2 of the expected) and
its logged ``cispo_clip_ratio`` (the share of tokens with positive advantage, while the share of tokens
whose weight is clamped is 1).

Exit 1 when cispo without ``epsilon_high`` gives the wrong gradient (relative difference > 1e-4 of its
largest entry); 0 when it does not (a fixed release).
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
# group -> prompt ids, its two completions (EOS-ended) and their scores
GROUPS = {
    "g0": ([3, 4, 5], [[11, 12, 1], [13, 14, 15, 1]], [1.0, 0.0]),
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


def grpo_step(path: str, out: str, **settings: object) -> tuple[dict, dict]:
    """One GRPOTrainer.train() step: (the gradient by parameter name before the optimizer step, the logs
    and the trainer's ``epsilon_high``)."""
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
    logs: dict = {}

    class Read(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            for name, p in kwargs["model"].named_parameters():
                if p.grad is not None:
                    gradient[name] = p.grad.detach().clone()

        def on_log(self, args, state, control, logs=None, **kwargs):
            seen_logs.update(logs or {})

    seen_logs = logs
    args = GRPOConfig(
        output_dir=out, use_cpu=True, report_to="none", logging_strategy="steps", logging_steps=1,
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, dataloader_pin_memory=False, seed=0,
        num_generations=2, per_device_train_batch_size=4, max_completion_length=4, max_steps=1,
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
        callbacks=[Read()],
    )
    trainer.remove_callback(PrinterCallback)  # the metrics lines
    trainer.train()
    logs["epsilon_high"] = trainer.epsilon_high  # the bound _compute_loss clamps at
    return gradient, logs


def expected(path: str) -> tuple[dict, float]:
    """The formula's gradient at ratio 1 (module docstring), and the share of tokens with A > 0."""
    model = AutoModelForCausalLM.from_pretrained(path)
    loss, tokens, positive = torch.zeros(()), 0, 0
    for prompt, completions, scores in GROUPS.values():
        s = torch.tensor(scores)
        for completion, score in zip(completions, scores, strict=True):
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).sum()
            advantage = (score - s.mean()) / (s.std() + 1e-4)
            loss = loss - advantage * logp
            tokens += len(completion)
            positive += len(completion) if advantage > 0 else 0
    (loss / tokens).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, positive / tokens


RUNS = (  # label, GRPOConfig settings, trigger?
    ("loss_type='cispo' (epsilon_high unset: 0.2)", {"loss_type": "cispo"}, True),
    ("loss_type='cispo', epsilon_high=5.0", {"loss_type": "cispo", "epsilon_high": 5.0}, False),
    ("loss_type='dapo' (TRL's default)", {}, False),
)
wrong = []
with tempfile.TemporaryDirectory() as tmp:
    path = save_model(os.path.join(tmp, "gpt2"))
    want, positive_share = expected(path)
    scale = max(float(g.abs().max()) for g in want.values())
    for label, settings, trigger in RUNS:
        got, logs = grpo_step(path, os.path.join(tmp, "out"), **settings)
        error = max(float((got[n] - want[n]).abs().max()) for n in want) / scale
        ratio = max(float(g.abs().max()) for g in got.values()) / scale
        bad = error > 1e-4
        print(
            f"{label}: largest gradient entry, got / expected {ratio:.4f} (expected 1); "
            f"|got - expected| {error:.3g} of the largest entry" + ("  <- WRONG" if bad else "")
        )
        if "cispo_clip_ratio" in logs:
            clamped = 1.0 if 1.0 > logs["epsilon_high"] else 0.0  # every token has ratio exactly 1
            print(
                f"    logged cispo_clip_ratio: got {logs['cispo_clip_ratio']:.4f}, expected 0 (ratio 1); "
                f"tokens with A > 0: {positive_share:.4f} of all; tokens whose weight is clamped at "
                f"epsilon_high={logs['epsilon_high']}: {clamped:.4f} of all"
            )
        if bad and trigger:
            wrong.append(label)
sys.exit(1 if wrong else 0)
