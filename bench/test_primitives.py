"""Primitive ops at the shapes of issue 6, timed through an adapter (warm-up excluded).

``token_logprobs`` at B = 4, L = 512, V = 32k and 150k; ``gae``, ``policy_loss`` and
``masked_whiten`` at B in {16, 256}, T in {128, 2048}. Inputs have right padding (a quarter of
each row's positions masked out on average) so masked code paths are exercised.

Every benchmark also checks the result of the call it timed: finite, of the expected shape, and,
for ppo-ref's own adapter, equal (to float32 round-off) to the plain-loop oracles of
``tests/oracles.py`` on a slice of the batch (a few rows: the oracles are pure Python). A
third-party adapter may legitimately differ from the reference (a declared convention, or one of
its documented failures), so there the largest difference from the reference under its declared
conventions is recorded in ``extra_info["max_abs_diff_vs_reference"]`` instead of asserted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from bench.conftest import require
from conformance.variant import ReferenceVariant
from ppo_ref.adapters import parse_conventions
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


def _run(benchmark: Any, call: Callable[[], Any], group: str, adapter: Adapter) -> Any:
    """Time ``call`` (after one untimed warm-up call) and return its result."""
    benchmark.group = group
    benchmark.extra_info["impl"] = adapter.name
    benchmark.extra_info["version"] = adapter.version
    benchmark.extra_info["torch_threads"] = torch.get_num_threads()
    call()  # warm-up (and compilation, for libraries that compile)
    return benchmark(call)


def _is_mine(adapter: Adapter) -> bool:
    return adapter.name == "mine"


def _check(
    benchmark: Any,
    adapter: Adapter,
    got: Tensor,
    shape: tuple[int, ...],
    reference: Callable[[], Tensor],
    oracle: Callable[[], tuple[Tensor, object]],
) -> None:
    """``got`` is finite and of ``shape``; for ppo-ref it matches the oracle on the oracle's slice
    (``oracle() -> (got's slice, the oracle's values)``), for a third party the difference from
    ``reference()`` (the reference under its declared conventions) is recorded."""
    got = got.detach()
    assert tuple(got.shape) == shape
    assert bool(torch.isfinite(got).all()), "non-finite result"
    if _is_mine(adapter):
        import tests.oracles as oracles

        sliced, expected = oracle()
        oracles.assert_close_to_oracle(sliced.detach(), expected, sliced.dtype)
    else:
        difference = (got.double() - reference().detach().double()).abs().max()
        benchmark.extra_info["max_abs_diff_vs_reference"] = float(difference)


def _reference(adapter: Adapter) -> Any:
    return ReferenceVariant(parse_conventions(adapter.conventions))


@pytest.mark.parametrize(("rows", "steps"), BT_SHAPES, ids=[f"B{b}-T{t}" for b, t in BT_SHAPES])
def test_gae(benchmark: Any, adapter: Any, rows: int, steps: int) -> None:
    require(adapter, "gae")
    b = _batch(rows, steps)
    advantages, returns = _run(
        benchmark,
        lambda: adapter.gae(b["rewards"], b["values"], b["mask"], gamma=1.0, lam=0.95),
        f"gae B{rows} T{steps}",
        adapter,
    )
    few = slice(0, 4)

    def oracle() -> tuple[Tensor, object]:
        import tests.oracles as oracles

        inputs = (b["rewards"][few], b["values"][few], b["mask"][few])
        return advantages[few], oracles.gae(*inputs, gamma=1.0, lam=0.95)[0]

    def reference() -> Tensor:
        result: tuple[Tensor, Tensor] = _reference(adapter).gae(
            b["rewards"], b["values"], b["mask"], gamma=1.0, lam=0.95
        )
        return result[0]

    _check(benchmark, adapter, advantages, (rows, steps), reference, oracle)
    assert returns.shape == advantages.shape and bool(torch.isfinite(returns).all())


@pytest.mark.parametrize(("rows", "steps"), BT_SHAPES, ids=[f"B{b}-T{t}" for b, t in BT_SHAPES])
def test_policy_loss(benchmark: Any, adapter: Any, rows: int, steps: int) -> None:
    require(adapter, "policy_loss")
    b = _batch(rows, steps)
    logp = b["logp"].requires_grad_()

    def forward_backward() -> Tensor:
        logp.grad = None
        result = adapter.policy_loss(logp, b["old_logp"], b["advantages"], b["mask"], clip_eps=0.2)
        loss: Tensor = result.loss
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    loss = _run(benchmark, forward_backward, f"policy_loss B{rows} T{steps}", adapter)
    assert logp.grad is not None and logp.grad.shape == (rows, steps)
    assert bool(torch.isfinite(logp.grad).all())
    few = slice(0, 2)

    def oracle() -> tuple[Tensor, object]:
        import tests.oracles as oracles

        part = (logp[few], b["old_logp"][few], b["advantages"][few], b["mask"][few])
        mine = adapter.policy_loss(*part, clip_eps=0.2).loss
        return mine, oracles.policy_loss(*part, clip_eps=0.2, loss_agg="token-mean", tie_tol=0.0).loss

    def reference() -> Tensor:
        variant = _reference(adapter)
        result = variant.policy_loss(logp, b["old_logp"], b["advantages"], b["mask"], clip_eps=0.2)
        loss: Tensor = result.loss
        return loss

    _check(benchmark, adapter, loss, (), reference, oracle)


@pytest.mark.parametrize(("rows", "steps"), BT_SHAPES, ids=[f"B{b}-T{t}" for b, t in BT_SHAPES])
def test_masked_whiten(benchmark: Any, adapter: Any, rows: int, steps: int) -> None:
    require(adapter, "masked_whiten")
    b = _batch(rows, steps)
    whitened = _run(
        benchmark,
        lambda: adapter.masked_whiten(b["advantages"], b["mask"]),
        f"masked_whiten B{rows} T{steps}",
        adapter,
    )

    def oracle() -> tuple[Tensor, object]:
        import tests.oracles as oracles

        return whitened, oracles.masked_whiten(b["advantages"], b["mask"])

    def reference() -> Tensor:
        result: Tensor = _reference(adapter).masked_whiten(b["advantages"], b["mask"])
        return result

    _check(benchmark, adapter, whitened, (rows, steps), reference, oracle)


@pytest.mark.parametrize("vocab", VOCABS, ids=[f"V{v // 1000}k" for v in VOCABS])
def test_token_logprobs(benchmark: Any, adapter: Any, vocab: int) -> None:
    require(adapter, "token_logprobs")
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 512, vocab, generator=generator)
    input_ids = torch.randint(0, vocab, (4, 512), generator=generator)
    logp = _run(
        benchmark,
        lambda: adapter.token_logprobs(logits, input_ids, temperature=1.0),
        f"token_logprobs B4 L512 V{vocab // 1000}k",
        adapter,
    )

    def oracle() -> tuple[Tensor, object]:
        import tests.oracles as oracles

        # One row, four positions: the oracle loops over the vocabulary in Python.
        expected = oracles.token_logprobs(logits[:1, :5], input_ids[:1, :5], temperature=1.0)
        return logp[:1, :4], expected

    def reference() -> Tensor:
        result: Tensor = _reference(adapter).token_logprobs(logits, input_ids, temperature=1.0)
        return result

    _check(benchmark, adapter, logp, (4, 511), reference, oracle)
