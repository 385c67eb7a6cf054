"""trl116-step-position-ids: GRPOTrainer scores left-padded prompts without position ids, so a
GPT-2-family model (learned absolute positions numbered from the first column) trains on shifted
positions whenever the prompts of a generation batch have unequal lengths.

Interpreter: ``.envs/trl116/bin/python findings/repro/trl116-step-position-ids.py`` (from the
repository root; standalone: ``pip install trl==1.16.0 transformers==5.24.0 torch datasets``).

What it drives: one optimizer step of ``trl.GRPOTrainer.train()`` (``max_steps=1``), its
completions given by the public ``rollout_func`` argument (fixed token ids, so no sampling), a
reward function returning fixed scores; TRL itself left-pads the prompts, computes the group
advantages and runs ``_compute_loss`` and backward. A ``TrainerCallback`` reads the gradient at
``on_pre_optimizer_step``; a wrapper records (never changes) the log-probs of the training forward
``_get_per_token_logps_and_entropies``.

Trigger: prompts of unequal length in one generation batch (here 5 and 3 tokens: the short one gets
2 left pads), which is TRL's default path; the model family decides. Also run: the same rows with
prompts of equal length (no padding: GPT-2 is right there too).

Expected, computed inline with plain torch from the formula: each completion token's log-prob is
``log_softmax(model(prompt + completion))`` of the row alone, unpadded (what ``generate`` sampled from:
transformers builds generation position ids from the attention mask); with TRL's defaults
(``loss_type="dapo"``, ``num_iterations=1``, ``beta=0``: ratio exactly 1 and no clipping) the gradient
is that of ``-sum_{i,t} A_i log p_{i,t} / N_tokens`` with ``A_i = (r_i - mean_g) / (std_g + 1e-4)``
(Bessel-corrected std over the group of 2). Got: TRL's log-probs and gradient. A model family is
"wrong" when the log-probs differ by more than 1e-4 or the gradient by more than 1e-4 of its largest
entry.

Exit 1 when GPT-2 (and its family: GPT-Neo, GPT-BigCode) gets the wrong number with unequal prompts;
0 when it does not (a fixed release).
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

VOCAB = 16
PAD, EOS, BOS = 0, 1, 2
# group -> prompt ids, its two completions (EOS-ended) and their scores
UNEQUAL = {
    "g0": ([3, 4, 5, 6, 7], [[11, 12, 1], [13, 14, 15, 1]], [1.0, 0.0]),
    "g1": ([8, 9, 10], [[5, 6, 1], [7, 1]], [0.0, 1.0]),
}
EQUAL = {"g0": UNEQUAL["g0"], "g1": ([8, 9, 10, 4, 3], *UNEQUAL["g1"][1:])}
TINY = dict(vocab_size=VOCAB, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS)
FAMILIES = {  # tiny configs, dropout 0; the first three use learned absolute positions
    "gpt2": dict(
        n_embd=32, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    ),
    "gpt_neo": dict(
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global", "local"], 1]],
        max_position_embeddings=64,
        window_size=16,
        embed_dropout=0.0,
        attention_dropout=0.0,
        resid_dropout=0.0,
    ),
    "gpt_bigcode": dict(
        n_embd=32, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    ),
    "opt": dict(
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=2,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
        dropout=0.0,
        attention_dropout=0.0,
    ),
    "llama": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ),
    "qwen2": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ),
}
ABSOLUTE = ("gpt2", "gpt_neo", "gpt_bigcode")
logging.set_verbosity_error()
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5's checkpointing renames
logging.disable_progress_bar()


def tokenizer() -> PreTrainedTokenizerFast:
    words = {"<pad>": PAD, "<eos>": EOS, "<bos>": BOS, **{f"t{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(WordLevel(words, unk_token="<bos>"))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<bos>",
        padding_side="left",
    )  # fmt: skip


def save_model(family: str, directory: str) -> str:
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, **FAMILIES[family], **TINY)
    if family != "gpt2" and hasattr(config, "tie_word_embeddings"):
        config.tie_word_embeddings = False
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    tokenizer().save_pretrained(directory)
    return directory


def grpo_step(path: str, groups: dict, out: str) -> tuple[dict, list]:
    """One GRPOTrainer.train() step: (gradient by parameter name, the training forwards' records)."""
    seen: dict[str, int] = {}

    def rollout(prompts: list, trainer: object) -> dict:
        rows = []
        for prompt in prompts:  # the sampler repeats each dataset prompt num_generations times
            rows.append((prompt, seen.get(prompt, 0)))
            seen[prompt] = seen.get(prompt, 0) + 1
        return {
            "prompt_ids": [list(groups[g][0]) for g, _ in rows],
            "completion_ids": [list(groups[g][1][j]) for g, j in rows],
            "logprobs": None,
            "score": [groups[g][2][j] for g, j in rows],  # an extra field: passed to the reward function
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
        num_generations=2, per_device_train_batch_size=4, max_completion_length=4, max_steps=1,
        learning_rate=1e-3, optim="sgd", max_grad_norm=0.0, lr_scheduler_type="constant", warmup_steps=0,
        use_vllm=False, bf16=False, gradient_checkpointing=False,  # float32, CPU; else TRL's defaults
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": sorted(groups)}),
        processing_class=PreTrainedTokenizerFast.from_pretrained(path),
        rollout_func=rollout,
        callbacks=[ReadGradient()],
    )
    trainer.remove_callback(PrinterCallback)  # the end-of-training metrics line
    forwards: list = []
    original = trainer._get_per_token_logps_and_entropies

    def record(model, input_ids, attention_mask, logits_to_keep, *a, **k):
        result = original(model, input_ids, attention_mask, logits_to_keep, *a, **k)
        if torch.is_grad_enabled():  # the training forward of _compute_loss
            forwards.append((input_ids, attention_mask, logits_to_keep, result[0].detach()))
        return result

    trainer._get_per_token_logps_and_entropies = record
    trainer.train()
    return gradient, forwards


def expected(path: str, groups: dict, forwards: list) -> tuple[dict, float]:
    """The formula's gradient, and max |TRL's log-prob - the unpadded row's log-prob|."""
    model = AutoModelForCausalLM.from_pretrained(path)
    score = {tuple(c): s for _, cs, ss in groups.values() for c, s in zip(cs, ss, strict=True)}
    group_of = {tuple(c): g for g, (_, cs, _) in groups.items() for c in cs}
    advantage = {}
    for c, s in score.items():
        scores = torch.tensor(groups[group_of[c]][2])
        advantage[c] = (s - scores.mean()) / (scores.std() + 1e-4)
    loss, tokens, worst = torch.zeros(()), 0, 0.0
    for input_ids, attention_mask, keep, trl_logps in forwards:
        for row in range(input_ids.shape[0]):
            ids = input_ids[row][attention_mask[row].bool()]  # the row alone: no pad on either side
            completion = [
                int(t) for t, m in zip(input_ids[row, -keep:], attention_mask[row, -keep:], strict=True) if m
            ]
            logits = model(input_ids=ids[None]).logits[0, -len(completion) - 1 : -1]
            logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
            worst = max(worst, float((logps.detach() - trl_logps[row, : len(completion)]).abs().max()))
            loss = loss - (advantage[tuple(completion)] * logps).sum()
            tokens += len(completion)
    (loss / tokens).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, worst


def relative(got: dict, want: dict) -> float:
    scale = max(float(g.abs().max()) for g in want.values())
    return max(float((got[n] - want[n]).abs().max()) for n in want) / scale


wrong = []
with tempfile.TemporaryDirectory() as tmp:
    for family in FAMILIES:
        path = save_model(family, os.path.join(tmp, family))
        for label, groups in (("unequal prompts (5, 3)", UNEQUAL), ("equal prompts (5, 5)", EQUAL)):
            if label.startswith("equal") and family not in ("gpt2",):
                continue  # defaults check: equal lengths need no padding; shown for GPT-2
            gradient, forwards = grpo_step(path, groups, os.path.join(tmp, "out"))
            want, logp_error = expected(path, groups, forwards)
            grad_error = relative(gradient, want)
            bad = logp_error > 1e-4 or grad_error > 1e-4
            print(
                f"{family:12s} {label}: expected log-prob difference 0, got {logp_error:.3g}; "
                f"expected gradient difference 0, got {grad_error:.3g} of the largest entry"
                + ("  <- WRONG" if bad else "")
            )
            if bad and label.startswith("unequal") and family in ABSOLUTE:
                wrong.append(family)
sys.exit(1 if wrong else 0)
