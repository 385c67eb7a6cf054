"""Stage 2: sampling, response masks from the first EOS, and sampling noise keyed per sample."""

from __future__ import annotations

import torch
from tiny_task import tiny_policy, tiny_tokenizer

from ppo_ref.trainer.generation import first_eos_mask, generate, left_pad, sample_from_logits
from ppo_ref.trainer.models import disable_dropout
from ppo_ref.trainer.seeding import Stream, sampling_uniforms


def test_first_eos_mask_includes_the_eos_and_ignores_pads_equal_to_eos() -> None:
    eos = 1
    ids = torch.tensor([[5, 6, eos, eos, eos], [5, eos, 7, 8, 9], [5, 6, 7, 8, 9], [eos, eos, eos, eos, eos]])
    mask, ended = first_eos_mask(ids, eos)
    assert mask.tolist() == [
        [True, True, True, False, False],
        [True, True, False, False, False],
        [True, True, True, True, True],
        [True, False, False, False, False],
    ]
    assert ended.tolist() == [True, True, False, True]


def test_sampling_respects_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(400, 4)
    uniforms = (torch.arange(400, dtype=torch.float64) + 0.5) / 400  # an even grid over [0, 1)
    counts = torch.bincount(sample_from_logits(logits, uniforms, 1.0, 0, 1.0), minlength=4)
    assert counts.tolist() == [200, 120, 60, 20]  # inverse CDF on an even grid reproduces p
    top_k = torch.bincount(sample_from_logits(logits, uniforms, 1.0, 2, 1.0), minlength=4)
    assert top_k.tolist() == [250, 150, 0, 0]  # renormalised over the 2 most probable
    top_p = torch.bincount(sample_from_logits(logits, uniforms, 1.0, 0, 0.7), minlength=4)
    assert top_p.tolist() == [250, 150, 0, 0]  # 0.5 + 0.3 is the smallest set reaching 0.7
    cold = torch.bincount(sample_from_logits(logits, uniforms, 0.5, 0, 1.0), minlength=4)
    expected = torch.softmax(logits[0] / 0.5, dim=-1) * 400
    assert torch.allclose(cold.double(), expected.double(), atol=1.0)


def test_a_sample_does_not_depend_on_its_batch_or_its_padding() -> None:
    tokenizer = tiny_tokenizer()
    policy = disable_dropout(tiny_policy(tokenizer))
    prompts = [[3, 4, 5], [6], [7, 8, 9, 10, 11], [4, 4]]
    noise = sampling_uniforms(0, Stream.SAMPLING, 3, torch.arange(4), 8)
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    together = generate(policy, ids, mask, noise, eos_id=1, pad_id=0)
    for row, prompt in enumerate(prompts):
        alone_ids, alone_mask = left_pad([prompt], tokenizer.pad_token_id)
        # Five more pad columns on the left must not change anything either.
        alone_ids = torch.cat([torch.zeros(1, 5, dtype=torch.long), alone_ids], dim=1)
        alone_mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), alone_mask], dim=1)
        alone = generate(policy, alone_ids, alone_mask, noise[row : row + 1], eos_id=1, pad_id=0)
        width = alone.response_ids.shape[1]
        assert torch.equal(alone.response_ids[0], together.response_ids[row, :width])
        assert torch.equal(alone.response_mask[0], together.response_mask[row, :width])
        assert not together.response_mask[row, width:].any()


def test_noise_is_keyed_by_seed_iteration_and_sample_index() -> None:
    first = sampling_uniforms(0, Stream.SAMPLING, 2, torch.tensor([0, 1, 2, 3]), 5)
    subset = sampling_uniforms(0, Stream.SAMPLING, 2, torch.tensor([2, 3]), 5)
    assert torch.equal(first[2:], subset)  # the same sample index gives the same noise on any shard
    assert not torch.equal(first, sampling_uniforms(0, Stream.SAMPLING, 3, torch.arange(4), 5))
    assert not torch.equal(first, sampling_uniforms(1, Stream.SAMPLING, 2, torch.arange(4), 5))
    assert not torch.equal(first, sampling_uniforms(0, Stream.EVAL_SAMPLING, 2, torch.arange(4), 5))
