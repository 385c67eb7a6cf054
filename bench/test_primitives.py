"""Primitive ops at the shapes of issue 6, timed through an adapter (warm-up excluded).

``token_logprobs`` at B = 4, L = 512, V = 32k and 150k; ``gae``, ``policy_loss`` and
``masked_whiten`` at B in {16, 256}, T in {128, 2048}. Inputs have right padding (a quarter of
each row's positions masked out on average) so masked code paths are exercised.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from bench.conftest import require
from ppo_ref.adapters.base import Adapter

BT_SHAPES = [(16, 128), (16, 2048), (256, 128), (256, 2048)]
VOCABS = [32_000, 150_000]


def _batch(rows: int, steps: int, seed: int = 0) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(steps // 2, steps + 1, (rows,), generator=generator)
    mask = torch.arange(steps).expand(rows, steps) < lengths[:, None]
    logp = -torch.rand(rows, steps, generator=generator) * 3
    return {
        "mask": mask,
        "logp": logp,
        "old_logp": logp + 0.1 * torch.randn(rows, steps, generator=generator),
        "advantages": torch.randn(rows, steps, generator=generator),
        "rewards": torch.randn(rows, steps, generator=generator) * 0.1,
        "values": torch.randn(rows, steps, generator=generator),
    }


def _run(benchmark: pytest.FixtureRequest, call: object, group: str, adapter: Adapter) -> None:
    benchmark.group = group  # type: ignore[attr-defined]
    benchmark.extra_info["impl"] = adapter.name  # type: ignore[attr-defined]
    benchmark.extra_info["version"] = adapter.version  # type: ignore[attr-defined]
    benchmark.extra_info["torch_threads"] = torch.get_num_threads()  # type: ignore[attr-defined]
    call()  # type: ignore[operator]  # warm-up (and compilation, for libraries that compile)
    benchmark(call)  # type: ignore[operator]


@pytest.mark.parametrize(("rows", "steps"), BT_SHAPES, ids=[f"B{b}-T{t}" for b, t in BT_SHAPES])
def test_gae(benchmark: pytest.FixtureRequest, adapter: Adapter, rows: int, steps: int) -> None:
    require(adapter, "gae")
    b = _batch(rows, steps)
    _run(
        benchmark,
        lambda: adapter.gae(b["rewards"], b["values"], b["mask"], gamma=1.0, lam=0.95),
        f"gae B{rows} T{steps}",
        adapter,
    )


@pytest.mark.parametrize(("rows", "steps"), BT_SHAPES, ids=[f"B{b}-T{t}" for b, t in BT_SHAPES])
def test_policy_loss(benchmark: pytest.FixtureRequest, adapter: Adapter, rows: int, steps: int) -> None:
    require(adapter, "policy_loss")
    b = _batch(rows, steps)
    logp = b["logp"].requires_grad_()

    def forward_backward() -> None:
        result = adapter.policy_loss(logp, b["old_logp"], b["advantages"], b["mask"], clip_eps=0.2)
        result.loss.backward()  # type: ignore[union-attr]

    _run(benchmark, forward_backward, f"policy_loss B{rows} T{steps}", adapter)


@pytest.mark.parametrize(("rows", "steps"), BT_SHAPES, ids=[f"B{b}-T{t}" for b, t in BT_SHAPES])
def test_masked_whiten(benchmark: pytest.FixtureRequest, adapter: Adapter, rows: int, steps: int) -> None:
    require(adapter, "masked_whiten")
    b = _batch(rows, steps)
    _run(
        benchmark,
        lambda: adapter.masked_whiten(b["advantages"], b["mask"]),
        f"masked_whiten B{rows} T{steps}",
        adapter,
    )


@pytest.mark.parametrize("vocab", VOCABS, ids=[f"V{v // 1000}k" for v in VOCABS])
def test_token_logprobs(benchmark: pytest.FixtureRequest, adapter: Adapter, vocab: int) -> None:
    require(adapter, "token_logprobs")
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 512, vocab, generator=generator)
    input_ids = torch.randint(0, vocab, (4, 512), generator=generator)
    _run(
        benchmark,
        lambda: adapter.token_logprobs(logits, input_ids, temperature=1.0),
        f"token_logprobs B4 L512 V{vocab // 1000}k",
        adapter,
    )
