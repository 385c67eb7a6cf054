"""Tiny GPT-2 models for the built-in tasks: construction, supervised warm-up, reward-model training.

Everything runs on the CPU in seconds and is deterministic given a seed: model initialisation runs
under a forked, seeded torch RNG (the caller's global RNG state is left untouched) and batches are
drawn from a private ``torch.Generator``. All dropout probabilities are 0, so train and eval mode
compute the same function.

Batches are left-padded, and every forward pass receives ``position_ids = cumsum(attention_mask) - 1``
(clamped at 0), so a sequence gets the same positions whatever padding precedes it. Models are
always called with keyword arguments (transformers 5 reads a second positional argument as a cache).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import (
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

__all__ = [
    "build_policy",
    "build_reward_model",
    "encode_left_padded",
    "position_ids_from_mask",
    "reward_model_scores",
    "sample_responses",
    "sft_warmup",
    "tiny_gpt2_config",
    "train_reward_model",
]


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run torch on one CPU thread inside the block, restoring the previous count afterwards.

    Used around all model work in this module.

    Models this small gain nothing from intra-op threads; on a busy machine, two threads that
    spin-wait for each other made the warm-up about 3x slower (measured: 26 s against 9 s).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _check_int(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
    return value


def _check_positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
    return float(value)


def _check_texts(texts: object, name: str) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence) or len(texts) == 0:
        raise ValueError(f"{name}: expected a non-empty sequence of str, got {type(texts).__name__}")
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not text:
            raise ValueError(f"{name}: entry {index} is {text!r}, expected a non-empty str")
    return list(texts)


def _token_id(tokenizer: PreTrainedTokenizerBase, attribute: str) -> int:
    value = getattr(tokenizer, attribute, None)
    if not isinstance(value, int):
        raise ValueError(f"tokenizer: expected {attribute} to be set, got {value!r}")
    return value


def tiny_gpt2_config(
    tokenizer: PreTrainedTokenizerBase,
    n_layer: int = 2,
    n_head: int = 2,
    n_embd: int = 64,
    n_positions: int = 128,
) -> GPT2Config:
    """A small GPT-2 config for ``tokenizer``'s vocabulary, with every dropout set to 0.

    The special token ids (pad, bos, eos) are copied from the tokenizer into the config.
    """
    _check_int(n_layer, "n_layer", 1)
    _check_int(n_head, "n_head", 1)
    _check_int(n_embd, "n_embd", 1)
    _check_int(n_positions, "n_positions", 2)
    if n_embd % n_head:
        raise ValueError(f"n_embd: expected a multiple of n_head={n_head}, got {n_embd}")
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        bos_token_id=_token_id(tokenizer, "bos_token_id"),
        eos_token_id=_token_id(tokenizer, "eos_token_id"),
        pad_token_id=_token_id(tokenizer, "pad_token_id"),
    )


def build_policy(config: GPT2Config, seed: int) -> GPT2LMHeadModel:
    """A freshly initialised ``GPT2LMHeadModel``, identical for identical ``(config, seed)``."""
    if not isinstance(config, GPT2Config):
        raise ValueError(f"config: expected a GPT2Config, got {type(config).__name__}")
    _check_int(seed, "seed", 0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return torch.nn.Module.eval(model)


def build_reward_model(config: GPT2Config, seed: int) -> GPT2ForSequenceClassification:
    """A freshly initialised one-output ``GPT2ForSequenceClassification``, identical for identical inputs.

    ``config`` is copied with ``num_labels = 1``; its ``pad_token_id`` must be set, because that is
    how the model finds the last real token of a left-padded row (the rightmost non-pad token).
    """
    if not isinstance(config, GPT2Config):
        raise ValueError(f"config: expected a GPT2Config, got {type(config).__name__}")
    if config.pad_token_id is None:
        raise ValueError("config: expected pad_token_id to be set")
    _check_int(seed, "seed", 0)
    config = GPT2Config.from_dict(config.to_dict())
    config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        reward_model = GPT2ForSequenceClassification(config)
    return torch.nn.Module.eval(reward_model)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """``cumsum(attention_mask, -1) - 1`` clamped at 0: positions that ignore left padding."""
    if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2:
        raise ValueError("attention_mask: expected a (B, L) tensor")
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def encode_left_padded(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], append_eos: bool = False
) -> tuple[Tensor, Tensor]:
    """Encode ``texts`` as a left-padded batch: ``(input_ids, attention_mask)``, both (B, L) int64.

    With ``append_eos`` an EOS token ends every row. Raises ``ValueError`` if a text contains a
    character the tokenizer does not know.
    """
    texts = _check_texts(texts, "texts")
    pad_id = _token_id(tokenizer, "pad_token_id")
    eos_id = _token_id(tokenizer, "eos_token_id")
    unk_id = getattr(tokenizer, "unk_token_id", None)
    rows: list[list[int]] = tokenizer(texts, add_special_tokens=False)["input_ids"]
    if append_eos:
        rows = [[*row, eos_id] for row in rows]
    for index, row in enumerate(rows):
        if unk_id is not None and unk_id in row:
            raise ValueError(f"texts: entry {index} ({texts[index]!r}) has a character the tokenizer lacks")
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        attention_mask[index, width - len(row) :] = 1
    return input_ids, attention_mask


def _lm_loss(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean next-token cross-entropy over the real (non-padding) target tokens."""
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
    ).logits
    targets = input_ids[:, 1:]
    target_mask = attention_mask[:, 1:].bool()
    return F.cross_entropy(logits[:, :-1][target_mask].float(), targets[target_mask])


def sft_warmup(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    steps: int,
    lr: float,
    seed: int,
    batch_size: int,
) -> list[float]:
    """Supervised warm-up in place: next-token prediction on ``texts``, each followed by EOS.

    Each of ``steps`` AdamW steps (weight decay 0, learning rate decaying linearly from ``lr`` to
    0) trains on ``batch_size`` texts drawn with replacement by a generator seeded with ``seed``;
    the loss covers every real token of the row, the first excepted. Deterministic given the
    model's initial weights, ``texts`` and ``seed``. Returns the loss of each step; the model is
    left in eval mode.
    """
    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"model: expected a transformers PreTrainedModel, got {type(model).__name__}")
    texts = _check_texts(texts, "texts")
    _check_int(steps, "steps", 0)
    _check_positive(lr, "lr")
    _check_int(seed, "seed", 0)
    _check_int(batch_size, "batch_size", 1)
    all_ids, all_mask = encode_left_padded(tokenizer, texts, append_eos=True)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / max(steps, 1))
    losses: list[float] = []
    torch.nn.Module.train(model)
    with _one_thread():
        for _ in range(steps):
            rows = torch.randint(len(texts), (batch_size,), generator=generator)
            width = int(all_mask[rows].sum(-1).max())  # drop the columns that are padding in every row
            loss = _lm_loss(model, all_ids[rows, -width:], all_mask[rows, -width:])
            optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
    torch.nn.Module.eval(model)
    return losses


def _check_pairs(pairs: object) -> list[tuple[str, str]]:
    if not isinstance(pairs, Sequence) or len(pairs) == 0:
        raise ValueError(
            f"pairs: expected a non-empty sequence of (chosen, rejected), got {type(pairs).__name__}"
        )
    checked: list[tuple[str, str]] = []
    for index, pair in enumerate(pairs):
        if not isinstance(pair, tuple) or len(pair) != 2 or not all(isinstance(t, str) and t for t in pair):
            raise ValueError(f"pairs: entry {index} is {pair!r}, expected a (chosen, rejected) tuple of str")
        checked.append((pair[0], pair[1]))
    return checked


def _sequence_scores(reward_model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    logits = reward_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
    ).logits
    scores: Tensor = logits[:, 0].float()
    return scores


def train_reward_model(
    reward_model: GPT2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[tuple[str, str]],
    steps: int,
    lr: float,
    seed: int,
    batch_size: int,
) -> list[float]:
    """Bradley-Terry training in place on ``(chosen, rejected)`` text pairs.

    Loss: ``-mean(log sigmoid(r(chosen) - r(rejected)))``, ``r`` read at the last real token of the
    left-padded text (no EOS appended). AdamW with weight decay 0 and a learning rate decaying
    linearly from ``lr`` to 0; ``batch_size`` pairs per step drawn with replacement by a generator
    seeded with ``seed``. Returns the loss of each step; the model is left in eval mode.
    """
    if not isinstance(reward_model, GPT2ForSequenceClassification):
        raise ValueError(
            f"reward_model: expected a GPT2ForSequenceClassification, got {type(reward_model).__name__}"
        )
    if reward_model.config.pad_token_id is None:
        raise ValueError(
            "reward_model: expected config.pad_token_id to be set (the last real token is found with it)"
        )
    checked = _check_pairs(pairs)
    _check_int(steps, "steps", 0)
    _check_positive(lr, "lr")
    _check_int(seed, "seed", 0)
    _check_int(batch_size, "batch_size", 1)
    texts = [chosen for chosen, _ in checked] + [rejected for _, rejected in checked]
    all_ids, all_mask = encode_left_padded(tokenizer, texts)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(reward_model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / max(steps, 1))
    losses: list[float] = []
    torch.nn.Module.train(reward_model)
    with _one_thread():
        for _ in range(steps):
            pair_rows = torch.randint(len(checked), (batch_size,), generator=generator)
            rows = torch.cat([pair_rows, pair_rows + len(checked)])  # chosen texts, then their rejected ones
            width = int(all_mask[rows].sum(-1).max())
            input_ids, attention_mask = all_ids[rows, -width:], all_mask[rows, -width:]
            scores = _sequence_scores(reward_model, input_ids, attention_mask)
            loss = -F.logsigmoid(scores[:batch_size] - scores[batch_size:]).mean()
            optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
    torch.nn.Module.eval(reward_model)
    return losses


@torch.no_grad()
def reward_model_scores(
    reward_model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    batch_size: int = 256,
) -> Tensor:
    """The reward model's score of each text (prompt + response, no EOS), as a float32 (N,) tensor."""
    texts = _check_texts(texts, "texts")
    _check_int(batch_size, "batch_size", 1)
    parts = []
    with _one_thread():
        for start in range(0, len(texts), batch_size):
            input_ids, attention_mask = encode_left_padded(tokenizer, texts[start : start + batch_size])
            parts.append(_sequence_scores(reward_model, input_ids, attention_mask))
    return torch.cat(parts)


@torch.no_grad()
def sample_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> tuple[list[str], list[bool]]:
    """Sample one response per prompt; a plain reference sampler for checks (the trainer has its own).

    Tokens are drawn from ``softmax(logits / temperature)`` with a generator seeded with ``seed``,
    recomputing the whole left-padded sequence at each step. Returns the response texts (decoded up
    to, not including, the first EOS) and whether each response ended with EOS.
    """
    prompts = _check_texts(prompts, "prompts")
    _check_int(max_new_tokens, "max_new_tokens", 1)
    _check_positive(temperature, "temperature")
    _check_int(seed, "seed", 0)
    eos_id = _token_id(tokenizer, "eos_token_id")
    input_ids, attention_mask = encode_left_padded(tokenizer, prompts)
    generator = torch.Generator().manual_seed(seed)
    finished = torch.zeros(len(prompts), dtype=torch.bool)
    new_tokens: list[Tensor] = []
    with _one_thread():
        for _ in range(max_new_tokens):
            logits = (
                model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids_from_mask(attention_mask),
                )
                .logits[:, -1]
                .float()
            )
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            token = torch.where(finished, torch.full_like(token, eos_id), token)
            new_tokens.append(token)
            finished |= token == eos_id
            input_ids = torch.cat([input_ids, token[:, None]], dim=1)
            attention_mask = torch.cat([attention_mask, torch.ones_like(token)[:, None]], dim=1)
            if bool(finished.all()):
                break
    generated = torch.stack(new_tokens, dim=1)
    texts: list[str] = []
    ended: list[bool] = []
    for row in generated.tolist():
        stop = row.index(eos_id) if eos_id in row else len(row)
        text = tokenizer.decode(row[:stop], skip_special_tokens=False)
        texts.append(text if isinstance(text, str) else "".join(text))
        ended.append(stop < len(row))
    return texts, ended
