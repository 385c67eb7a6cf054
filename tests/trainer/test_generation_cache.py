"""The preallocated KV cache of ``generate`` (issue 12, part 4) gives bit for bit the samples of
transformers' own growing ``DynamicCache``: same tokens, masks and sampling log-probs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import (
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

from ppo_ref.trainer import generation
from ppo_ref.trainer.generation import generate, left_pad, preallocated_cache

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


def _prompts(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = [
        torch.randint(2, VOCAB, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 9, (7,), generator=g)
    ]
    ids, mask = left_pad(rows, pad_id=0)
    uniforms = torch.rand(len(rows), 12, generator=g, dtype=torch.float64)
    return ids, mask, uniforms


def _generate(model: Any, seed: int, preallocate: bool, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    ids, mask, uniforms = _prompts(seed)
    with monkeypatch.context() as patch:
        if not preallocate:  # the model builds its own DynamicCache, as before the preallocation
            patch.setattr(generation, "preallocated_cache", lambda model, capacity: None)
        return generate(model, ids, mask, uniforms, eos_id=3, pad_id=0, return_logprobs=True, **kw)


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize(
    "sampling", [{}, {"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.8, "temperature": 1.3}], ids=str
)
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_preallocated_cache_is_bitwise_the_dynamic_cache(
    build: Any, sampling: dict[str, float], bf16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build()
    assert preallocated_cache(model, 20) is not None  # the fast path is the one under test
    for seed in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            fast = _generate(model, seed, True, monkeypatch, **sampling)
            plain = _generate(model, seed, False, monkeypatch, **sampling)
        for name in ("response_ids", "response_mask", "ended", "logprobs"):
            a, b = getattr(fast, name), getattr(plain, name)
            assert a.dtype == b.dtype and torch.equal(a, b), f"{name} differs (seed {seed})"


def test_layers_fill_their_storage_and_return_views() -> None:
    cache = preallocated_cache(_gpt2(), 6)
    assert cache is not None
    layer = cache.layers[0]
    k1, v1 = torch.randn(2, 2, 4, 16), torch.randn(2, 2, 4, 16)
    keys, values = layer.update(k1, v1)
    assert keys.shape == (2, 2, 4, 16) and torch.equal(keys, k1) and torch.equal(values, v1)
    k2, v2 = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)
    keys, values = layer.update(k2, v2)
    assert torch.equal(keys, torch.cat([k1, k2], dim=2)) and torch.equal(values, torch.cat([v1, v2], dim=2))
    assert layer.get_seq_length() == 5
    # Past the capacity it falls back to concatenation: still the right keys, only slower.
    k3, v3 = torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 16)
    keys, _ = layer.update(k3, v3)
    assert torch.equal(keys, torch.cat([k1, k2, k3], dim=2)) and layer.get_seq_length() == 8


def test_only_plain_full_attention_caches_are_preallocated() -> None:
    assert preallocated_cache(lambda **kw: None, 8) is None  # no config: the model builds its own
    config = MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB
    )
    config.sliding_window = 4  # its own cache is made of sliding-window layers: left to the model
    assert any(type(layer).__name__ != "DynamicLayer" for layer in DynamicCache(config=config).layers)
    assert preallocated_cache(MistralForCausalLM(config), 8) is None
    with pytest.raises(ValueError, match="capacity"):
        preallocated_cache(_gpt2(), 0)
