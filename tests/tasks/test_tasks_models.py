"""Tiny GPT-2 helpers: configs, left padding, warm-up, reward-model training, sampling (fast)."""

from __future__ import annotations

import pytest
import torch

from ppo_ref.tasks.models import (
    build_policy,
    build_reward_model,
    encode_left_padded,
    position_ids_from_mask,
    reward_model_scores,
    sample_responses,
    sft_warmup,
    tiny_gpt2_config,
    train_reward_model,
)
from ppo_ref.tasks.tokenizer import build_char_tokenizer

TEXTS = ["the movie was good and fun.", "my book was dull.", "1234=4321"]


def test_config_has_no_dropout_and_the_tokenizer_ids() -> None:
    tok = build_char_tokenizer(pad_equals_eos=True)
    config = tiny_gpt2_config(tok)
    assert config.resid_pdrop == config.embd_pdrop == config.attn_pdrop == config.summary_first_dropout == 0.0
    assert (config.pad_token_id, config.eos_token_id, config.bos_token_id) == (2, 2, 1)
    assert config.vocab_size == len(tok)
    with pytest.raises(ValueError, match="n_embd"):
        tiny_gpt2_config(tok, n_head=3)


def test_position_ids_ignore_left_padding() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_encode_left_padded() -> None:
    tok = build_char_tokenizer()
    ids, mask = encode_left_padded(tok, ["ab", "abcd"], append_eos=True)
    assert ids.tolist() == [[0, 0, 4, 5, 2], [4, 5, 6, 7, 2]]
    assert mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    with pytest.raises(ValueError, match="texts: entry 1"):
        encode_left_padded(tok, ["ab", "aBc"])
    with pytest.raises(ValueError, match="texts"):
        encode_left_padded(tok, "ab")


@pytest.mark.parametrize("pad_equals_eos", [False, True])
def test_padding_does_not_change_logits_or_scores(pad_equals_eos: bool) -> None:
    tok = build_char_tokenizer(pad_equals_eos=pad_equals_eos)
    policy = build_policy(tiny_gpt2_config(tok), seed=0)
    reward_model = build_reward_model(tiny_gpt2_config(tok), seed=1)
    alone_ids, alone_mask = encode_left_padded(tok, TEXTS[1:2])
    batch_ids, batch_mask = encode_left_padded(tok, TEXTS)  # row 1 gets 10 padding tokens
    assert int((batch_mask[1] == 0).sum()) == 10
    with torch.no_grad():
        alone = policy(
            input_ids=alone_ids, attention_mask=alone_mask, position_ids=position_ids_from_mask(alone_mask)
        ).logits[0]
        batch = policy(
            input_ids=batch_ids, attention_mask=batch_mask, position_ids=position_ids_from_mask(batch_mask)
        ).logits[1, 10:]
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-5)
    scores = reward_model_scores(reward_model, tok, TEXTS)
    torch.testing.assert_close(
        scores[1:2], reward_model_scores(reward_model, tok, TEXTS[1:2]), atol=1e-5, rtol=0
    )


def test_builds_are_seeded_and_leave_the_global_rng_alone() -> None:
    config = tiny_gpt2_config(build_char_tokenizer())
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first, again, other = build_policy(config, 5), build_policy(config, 5), build_policy(config, 6)
    assert torch.equal(torch.rand(1), before)
    for a, b in zip(first.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.transformer.wte.weight, other.transformer.wte.weight)
    assert build_reward_model(config, 5).config.num_labels == 1


def test_sft_warmup_learns_and_is_deterministic() -> None:
    tok = build_char_tokenizer()
    config = tiny_gpt2_config(tok)
    texts = ["ab ab ab.", "cd cd cd."] * 8
    runs = []
    for _ in range(2):
        model = build_policy(config, 0)
        losses = sft_warmup(model, tok, texts, steps=30, lr=3e-3, seed=7, batch_size=8)
        runs.append((losses, model))
    (losses, model), (losses_again, model_again) = runs
    assert losses == losses_again
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
    assert torch.equal(model.lm_head.weight, model_again.lm_head.weight)
    assert not model.training
    with pytest.raises(ValueError, match="lr"):
        sft_warmup(model, tok, texts, steps=1, lr=0.0, seed=0, batch_size=1)
    with pytest.raises(ValueError, match="batch_size"):
        sft_warmup(model, tok, texts, steps=1, lr=1e-3, seed=0, batch_size=0)


def test_train_reward_model_learns_a_preference() -> None:
    tok = build_char_tokenizer()
    reward_model = build_reward_model(tiny_gpt2_config(tok), seed=0)
    pairs = [("x was good.", "x was bad."), ("y was good.", "y was bad.")]
    losses = train_reward_model(reward_model, tok, pairs, steps=40, lr=3e-3, seed=0, batch_size=4)
    assert losses[0] == pytest.approx(0.693, abs=0.05)  # log 2 at a near-zero head
    assert losses[-1] < 0.1
    good, bad = reward_model_scores(reward_model, tok, ["z was good.", "z was bad."]).tolist()
    assert good > bad
    with pytest.raises(ValueError, match="pairs"):
        train_reward_model(reward_model, tok, [("a", "")], steps=1, lr=1e-3, seed=0, batch_size=1)


def test_sample_responses_is_seeded_and_stops_at_eos() -> None:
    tok = build_char_tokenizer(pad_equals_eos=True)
    policy = build_policy(tiny_gpt2_config(tok), seed=0)
    # Warm up on "ab" followed by 1 to 6 "c"s, so that about half the answers outlast 4 new tokens.
    sft_warmup(policy, tok, ["ab" + "c" * k for k in range(1, 7)], steps=60, lr=1e-2, seed=0, batch_size=12)
    prompts = ["ab"] * 32
    first = sample_responses(policy, tok, prompts, max_new_tokens=4, temperature=1.0, seed=3)
    assert first == sample_responses(policy, tok, prompts, max_new_tokens=4, temperature=1.0, seed=3)
    assert first != sample_responses(policy, tok, prompts, max_new_tokens=4, temperature=1.0, seed=4)
    texts, ended = first
    assert 0 < sum(ended) < len(ended)
    for text, stopped in zip(texts, ended, strict=True):
        assert "<" not in text  # neither EOS (== pad) nor any other special token
        assert len(text) < 4 if stopped else len(text) == 4
