"""swift-bnpo-micro-batch-mean: ms-swift's GRPO ``loss_type="bnpo"`` on its transformers backend divides
each micro-batch's token-loss sum by that micro-batch's own completion-token count, and transformers'
``Trainer`` then divides by the accumulation steps: with ``gradient_accumulation_steps > 1`` and
micro-batches of unequal token counts the step's gradient is a mean of micro-batch means, not the
batch-wide token mean ms-swift documents for bnpo (and that its Megatron backend computes, normalising
bnpo by the whole step's token count).

Interpreter: ``.envs/swift/bin/python findings/repro/swift-bnpo-micro-batch-mean.py`` (from the repository
root; standalone: ``pip install ms-swift==4.6.0 trl==0.29.1 transformers==5.19.0 msgspec torch``).

What it drives: ms-swift's own pipeline, ``swift.pipelines.train.rlhf.SwiftRLHF`` with
``RLHFArguments(rlhf_type="grpo", tuner_type="full")`` on a tiny Llama built from its config and saved
with a word-level tokenizer (``model_type="llama"``, ``template="dummy"``, float32, CPU), a local JSONL
of 2 prompts, and a reward function registered in ``swift.rewards.orms`` returning fixed scores; one
optimizer step of ``GRPOTrainer.train()`` (``max_steps=1``). The generation engine's ``infer`` is the
one stand-in: it returns fixed completions (EOS-ended, ``finish_reason="stop"``), so nothing is
sampled. A ``TrainerCallback`` reads the gradient at ``on_pre_optimizer_step``. ``check_model=False``
(no hub access).

Trigger: ``loss_type="bnpo"`` with ``gradient_accumulation_steps=2`` (``per_device_train_batch_size=2``:
the two groups' rows, 7 and 5 completion tokens, land in different micro-batches). Also run: bnpo with
one micro-batch of 4 and ``loss_type="dapo"`` with 2 micro-batches.

Expected, computed inline with plain torch from the formula of ms-swift's loss-types page
(``L_BNPO = sum_i sum_t L_{i,t} / sum_i T_i`` over the batch): at the first step the ratio is exactly 1,
so the gradient is that of ``-(1/N) sum_{i,t} A_i log p_{i,t}`` (log-probs of the logits over ms-swift's
default temperature 0.9; ``A_i = (r_i - mean_g) / (std_g + 1e-4)``; N = 12 the batch's completion tokens),
whatever the split.

Exit 1 when bnpo with 2 micro-batches gives a gradient other than the formula's (relative difference
> 1e-4 of its largest entry); 0 when it does not (a fixed release).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, TrainerCallback

warnings.filterwarnings("ignore")

VOCAB, PAD, EOS = 16, 0, 1
TEMPERATURE = 0.9  # ms-swift's default temperature (the loss divides the logits by it)
# prompt ids, its two completions (EOS-ended) and their scores
GROUPS = [
    ([3, 4, 5], [[11, 12, 1], [13, 14, 15, 1]], [1.0, 0.0]),
    ([6, 7, 8], [[9, 1], [10, 11, 1]], [0.5, -1.0]),
]


def text(ids: list[int]) -> str:
    return " ".join("<eos>" if t == EOS else f"t{t}" for t in ids)


def build(directory: str) -> str:
    """A tiny Llama (no BOS) and a word-level tokenizer, saved for ms-swift to load."""
    words = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(WordLevel(words, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.0, tie_word_embeddings=False,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    path = os.path.join(directory, "model")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def swift_step(
    path: str, directory: str, **settings: object
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One GRPOTrainer step through ms-swift's pipeline: the gradient and the logged metrics."""
    from swift.arguments import RLHFArguments
    from swift.infer_engine.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
        UsageInfo,
    )
    from swift.pipelines.train.rlhf import SwiftRLHF
    from swift.rewards import orms

    data = os.path.join(directory, "prompts.jsonl")
    with open(data, "w", encoding="utf-8") as handle:
        for prompt, _, _ in GROUPS:
            handle.write(json.dumps({"messages": [{"role": "user", "content": text(prompt)}]}) + "\n")
    served: dict[str, int] = {}
    given: list[float] = []

    def infer(requests: list, request_config: object = None, **_: object) -> list:
        out = []
        for request in requests:
            query = request.messages[0]["content"]
            group = [text(p) for p, _, _ in GROUPS].index(query)
            k = served.get(query, 0)
            served[query] = k + 1
            completion = GROUPS[group][1][k % 2]
            given.append(GROUPS[group][2][k % 2])
            choice = ChatCompletionResponseChoice(
                index=0, message=ChatMessage(role="assistant", content=text(completion)),
                finish_reason="stop",
                token_ids=list(completion),
            )  # fmt: skip
            out.append(
                ChatCompletionResponse(model="tiny", choices=[choice], usage=UsageInfo(3, len(completion), 3))
            )
        return out

    class Scores:  # an ms-swift ORM plugin: completions come in request order
        def __init__(self, *_: object, **__: object) -> None:
            self.calls = 0

        def __call__(self, completions: list, **_: object) -> list[float]:
            values = given[self.calls : self.calls + len(completions)]
            self.calls += len(completions)
            return values

    orms["fixed_scores"] = Scores
    record: dict[str, object] = {}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(
            self, args: object, state: object, control: object, **kwargs: object
        ) -> None:
            model = kwargs["model"]
            record["gradient"] = {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}

        def on_log(
            self, args: object, state: object, control: object, logs: dict | None = None, **_: object
        ) -> None:
            if logs and "loss" in logs:
                record["logs"] = dict(logs)

    class Pipeline(SwiftRLHF):
        def train(self, trainer: object) -> object:
            trainer.engine.infer = infer  # the stand-in for generation
            trainer.add_callback(Capture())
            return super().train(trainer)

    args = RLHFArguments(
        model=path, model_type="llama", template="dummy", rlhf_type="grpo", tuner_type="full",
        torch_dtype="float32",
        dataset=[data], split_dataset_ratio=0, dataset_shuffle=False, reward_funcs=["fixed_scores"], beta=0.0,
        num_generations=2, max_completion_length=6, max_steps=1,
        learning_rate=1e-3, max_grad_norm=0.0, use_vllm=False, gradient_checkpointing=False,
        report_to=["none"],
        output_dir=os.path.join(directory, "out"), save_strategy="no", logging_steps=1,
        dataloader_num_workers=0,
        seed=0, check_model=False, **settings,
    )  # fmt: skip
    Pipeline(args).main()
    return record["gradient"], record["logs"]


def expected_gradient(path: str) -> tuple[dict[str, torch.Tensor], float]:
    """The gradient of ``-(1/N) sum A_i log p_{i,t}`` on the same model; the share of tokens with A > 0."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    rows = [(p, c, a) for p, cs, ss in GROUPS for c, a in zip(cs, ss, strict=True)]
    scores = torch.tensor([s for _, _, ss in GROUPS for s in ss]).view(len(GROUPS), -1)
    adv = ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-4)).flatten()
    tokens = sum(len(c) for _, c, _ in rows)
    loss = torch.zeros(())
    positive = 0
    for i, (prompt, completion, _) in enumerate(rows):
        ids = torch.tensor([prompt + completion])
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / TEMPERATURE
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion).view(-1, 1)).squeeze(-1)
        loss = loss - (adv[i] * logp).sum() / tokens
        positive += len(completion) if adv[i] > 0 else 0
    loss.backward()
    return {n: p.grad.detach().double() for n, p in model.named_parameters()}, positive / tokens


def main() -> int:
    logging.disable(logging.WARNING)
    directory = tempfile.mkdtemp()
    path = build(directory)
    expected, _ = expected_gradient(path)
    scale = max(float(g.abs().max()) for g in expected.values())
    wrong = False
    runs = (
        ("loss_type='bnpo', 2 micro-batches (gradient_accumulation_steps=2)",
         {"loss_type": "bnpo", "gradient_accumulation_steps": 2, "per_device_train_batch_size": 2}),
        ("loss_type='bnpo', 1 micro-batch", {"loss_type": "bnpo", "per_device_train_batch_size": 4}),
        ("loss_type='dapo', 2 micro-batches",
         {"loss_type": "dapo", "gradient_accumulation_steps": 2, "per_device_train_batch_size": 2}),
    )  # fmt: skip
    lines = []
    for label, settings in runs:
        gradient, _ = swift_step(path, directory, **settings)
        got = max(float(g.abs().max()) for g in gradient.values())
        diff = max(float((gradient[n] - expected[n]).abs().max()) for n in expected)
        bad = diff / scale > 1e-4
        lines.append(
            f"{label}: largest gradient entry, got / expected {got / scale:.4f}; "
            f"|got - expected| {diff / scale:.3g} of the largest entry (expected 0)"
            + ("  <- WRONG" if bad else "")
        )
        wrong = wrong or (
            bad and settings["loss_type"] == "bnpo" and "gradient_accumulation_steps" in settings
        )
    print("\n".join(lines))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
