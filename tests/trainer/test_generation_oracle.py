"""``generate`` gives bit for bit the samples of a plain KV-cache loop written here (the model's own
growing cache, the explicit attention mask concatenated at every step): same tokens and sampling
log-probs, padded and unpadded prompts, fp32 and bf16 autocast. The oracle for any faster sampler
(issue 12, part 4: a preallocated cache and laid-out masks were tried, measured slower on CPU and
dropped; see bench/PERF-NOTES.md)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from ppo_ref.trainer.generation import (
    generate,
    left_pad,
    position_ids_from_mask,
    sample_from_logits,
    sampling_logprob,
)
from ppo_ref.trainer.models import call_model, output_cache

VOCAB = 50


def _gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=VOCAB, bos_token_id=1, eos_token_id=1
    )
    return GPT2LMHeadModel(config).eval()


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(1)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def _prompts(seed: int, padded: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (7,), generator=g) if padded else torch.full((7,), 6)
    rows = [torch.randint(2, VOCAB, (int(n),), generator=g).tolist() for n in lengths]
    ids, mask = left_pad(rows, pad_id=0)
    uniforms = torch.rand(len(rows), 12, generator=g, dtype=torch.float64)
    return ids, mask, uniforms


@torch.no_grad()
def _plain_loop(model: Any, ids: torch.Tensor, mask: torch.Tensor, uniforms: torch.Tensor, **kw: Any) -> Any:
    """The plain KV-cache loop (the sampler before issue 12): the model's own growing cache, the
    explicit attention mask concatenated at every step, the same sampling and stopping rule."""
    temperature, top_k, top_p = kw.get("temperature", 1.0), kw.get("top_k", 0), kw.get("top_p", 1.0)
    attention_mask = mask.long()
    positions = position_ids_from_mask(attention_mask)
    nxt = positions[:, -1:] + 1
    out = model(input_ids=ids, attention_mask=attention_mask, position_ids=positions, use_cache=True)
    finished = torch.zeros(len(ids), dtype=torch.bool)
    tokens, logprobs = [], []
    for step in range(uniforms.shape[1]):
        logits = out.logits[:, -1]
        token = sample_from_logits(logits, uniforms[:, step], temperature, top_k, top_p)
        logprob = sampling_logprob(logits, token, temperature, top_k, top_p)
        logprobs.append(torch.where(finished, torch.zeros_like(logprob), logprob))
        token = torch.where(finished, torch.zeros_like(token), token)
        tokens.append(token)
        finished = finished | (token == 3)
        if step == uniforms.shape[1] - 1 or bool(finished.all()):
            break
        attention_mask = torch.cat([attention_mask, torch.ones(len(ids), 1, dtype=torch.long)], dim=1)
        out = call_model(
            model,
            input_ids=token.unsqueeze(1),
            attention_mask=attention_mask,
            position_ids=nxt,
            cache=output_cache(out),
            use_cache=True,
        )
        nxt = nxt + 1
    return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1)


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("sampling", [{}, {"top_k": 5}, {"top_p": 0.8, "temperature": 1.3}], ids=str)
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_generate_is_bitwise_the_plain_kv_cache_loop(
    build: Any, sampling: dict[str, float], bf16: bool
) -> None:
    model = build()
    ended = []
    for seed, padded in [(0, True), (1, True), (2, True), (3, False), (4, False)]:
        ids, mask, uniforms = _prompts(seed, padded)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            fast = generate(model, ids, mask, uniforms, eos_id=3, pad_id=0, return_logprobs=True, **sampling)
            tokens, logprobs = _plain_loop(model, ids, mask, uniforms, **sampling)
        assert torch.equal(fast.response_ids, tokens), f"tokens differ (seed {seed}, padded {padded})"
        assert fast.logprobs is not None and fast.logprobs.dtype == logprobs.dtype
        assert torch.equal(fast.logprobs, logprobs), f"log-probs differ (seed {seed}, padded {padded})"
        ended.append(fast.ended)
    assert bool(torch.cat(ended).any()) and not bool(torch.cat(ended).all())  # EOS stops some rows
