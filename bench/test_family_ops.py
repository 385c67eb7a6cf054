"""The PPO-family ops at the shapes of issue 14 (part 4), one implementation per run.

``pytest bench/test_family_ops.py --bench-impl=NAME`` times every case of ``bench/family/`` for
``NAME`` (``mine``, or ``verl``, ``openrlhf``, ``skyrl`` from their ``.envs/NAME``): group
advantages at B = 65,536 in groups of 16; the aggregation modes, the PPO loss with clip-higher and
dual clip, GSPO, CISPO, KL as a loss and the rollout corrections at B = 256, T = 2048, forward
(no autograd) and forward+backward. Under ``--benchmark-disable`` (CI's untimed run) the shapes
are small (B = 512 scores; B = 8, T = 64). Ratios measured side by side come from
``python bench/family_side.py --compare`` instead: see ``bench/RESULTS.md``.

Every call's result is checked: finite; ppo-ref's equal to the plain-loop oracles of
``tests/oracles.py`` on a slice (four groups, or two rows); a library's difference from ppo-ref
under the library's conventions recorded in ``extra_info`` (``max_abs_diff_vs_reference``).

Run in a library's own environment, a side whose cases cannot be built fails (it skips only in
another environment). :func:`test_library_side_serves_and_matches_ppo_ref` (``thirdparty``, from
``.venv``) starts each library's worker in its ``.envs/NAME`` as ``python bench/family_side.py
--compare`` does and fails where it dies (``--compare`` would leave that side out of the report with
only a "Not run" line) or where a case's value or gradient differs from ppo-ref's.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

import ppo_ref
from bench.family import cases as side
from bench.family.compare import Side
from bench.family.mine import mine_cases
from bench.family.sides import LIBRARIES, SIDES, cases_for
from ppo_ref.group import GROUP_METHODS
from tests.thirdparty_env import REPO, thirdparty_python

KEYS = [case.key for case in mine_cases(side.make_data(side.SMALL))]


@functools.cache
def _cases(name: str, shapes: side.Shapes) -> dict[tuple[str, str], side.Case] | str:
    """The cases of side ``name``, or why they cannot be built here."""
    try:
        return cases_for(name, shapes)
    except ImportError as error:
        if _in_own_env(name):  # the side's own environment: its worker would die the same way
            pytest.fail(f"{name}'s family side does not import in .envs/{name}: {error}", pytrace=False)
        return f"{name} is not importable in this environment ({error}); run this file under .envs/{name}"


def _in_own_env(name: str) -> bool:
    """Whether this interpreter is ``.envs/NAME``'s."""
    return Path(sys.prefix).resolve() == (REPO / ".envs" / name).resolve()


def _oracle(key: str, data: dict[str, Tensor]) -> tuple[Tensor, object]:
    """(ppo-ref's value on a slice of the inputs, the plain-loop oracle's value there)."""
    import tests.oracles as oracles

    op, _, rest = key.partition("/")
    variant = rest.rsplit("/", 1)[0] if rest.endswith("fwd") or rest.endswith("fwd+bwd") else rest
    if op == "group_advantages":
        size = int(torch.bincount(data["group_ids"]).max())
        scores, ids = data["scores"][: 4 * size], data["group_ids"][: 4 * size]
        return ppo_ref.group_advantages(scores, ids, variant), oracles.group_advantages(scores, ids, variant)
    two = slice(0, 2)
    logp, old, mask = data["logp"][two], data["old_logp"][two], data["mask"][two]
    adv, ref, rollout = data["advantages"][two], data["ref_logp"][two], data["rollout_logp"][two]
    if op == "aggregate_loss":
        x = data["per_token"][two]
        constant = float(mask.shape[1]) if variant == "seq-mean-token-sum-norm" else None
        mine = ppo_ref.aggregate_loss(x, mask, variant, norm_constant=constant)
        return mine, oracles.aggregate(x, mask, variant, constant)
    if op == "policy_loss":
        clipped = ppo_ref.policy_loss(
            logp, old, adv, mask, side.CLIP, clip_eps_high=side.CLIP_HIGH, dual_clip=side.DUAL
        )
        expected = oracles.clipped_policy_loss(
            logp, old, adv, mask, side.CLIP, side.CLIP_HIGH, side.DUAL, "token-mean", tie_tol=0.0
        )
        return clipped.loss, expected.loss
    if op == "gspo_loss":
        seq_adv = data["seq_advantages"][two]
        gspo = ppo_ref.gspo_loss(logp, old, seq_adv, mask, side.GSPO_CLIP, clip_eps_high=side.GSPO_CLIP_HIGH)
        return gspo.loss, oracles.gspo_loss(
            logp, old, seq_adv, mask, side.GSPO_CLIP, side.GSPO_CLIP_HIGH, tie_tol=0.0
        ).loss
    if op == "cispo_loss":
        cispo = ppo_ref.cispo_loss(logp, old, adv, mask, side.CISPO_LOW, side.CISPO_HIGH)
        return cispo.loss, oracles.cispo_loss(
            logp, old, adv, mask, side.CISPO_LOW, side.CISPO_HIGH, "token-mean"
        )[0]
    if op == "kl_loss":
        return ppo_ref.kl_loss(logp, ref, mask, variant), oracles.kl_loss(
            logp, ref, mask, variant, "token-mean"
        )[0]
    assert op == "rollout_correction", key
    if variant == "token-truncate":
        arguments: dict[str, Any] = {"level": "token", "mode": "truncate", "high": side.TIS_HIGH, "low": None}
    else:
        arguments = {"level": "sequence", "mode": "mask", "high": side.MASK_HIGH, "low": side.MASK_LOW}
    mine = ppo_ref.rollout_correction(old, rollout, mask, **arguments)
    return mine, oracles.rollout_correction(old, rollout, mask, **arguments)


@pytest.mark.parametrize("implementation", ["", "-loop"], ids=["main", "loop"])
@pytest.mark.parametrize("key", KEYS)
def test_family_op(benchmark: Any, request: pytest.FixtureRequest, key: str, implementation: str) -> None:
    name = str(request.config.getoption("--bench-impl"))
    if name not in SIDES:
        pytest.skip(f"{name} has no family-op side (bench/family_side.py knows {SIDES})")
    if implementation and name != "verl":
        pytest.skip("only verl ships a second implementation (its Python-loop grpo/rloo estimators)")
    shapes = side.SMALL if benchmark.disabled else side.FULL
    cases = _cases(name, shapes)
    if isinstance(cases, str):
        pytest.skip(cases)
    label = name + implementation
    case = cases.get((key, label))
    if case is None:
        pytest.skip(f"{label} does not provide {key} as a function of its own")
    benchmark.group = f"{key} ({'small' if benchmark.disabled else 'large'} shapes)"
    benchmark.extra_info.update(impl=label, torch_threads=torch.get_num_threads(), note=case.note)
    case.call()  # warm-up
    out = benchmark(case.call)
    value = case.value(out).detach()
    assert bool(torch.isfinite(value).all()), f"{label} {key}: non-finite result"
    if case.grad_of is not None:
        assert case.grad_of.grad is not None and bool(torch.isfinite(case.grad_of.grad).all())
    differences = side.check(case)
    benchmark.extra_info["max_abs_diff_vs_reference"] = differences
    if name == "mine":
        import tests.oracles as oracles

        mine, expected = _oracle(key, side.make_data(shapes))
        oracles.assert_close_to_oracle(mine.detach(), expected, mine.dtype)


TOLERANCE = 1e-5
"""Largest difference from ppo-ref's value (and gradient) accepted at the small shapes (float32)."""

SKYRL_KEYS = {
    *(f"group_advantages/{method}" for method in GROUP_METHODS),
    *(
        f"{op}/{p}"
        for op in (
            "aggregate_loss/token-mean",
            "aggregate_loss/seq-mean-token-mean",
            "aggregate_loss/seq-mean-token-sum-norm",
            "policy_loss/clip-higher+dual-clip",
            "gspo_loss",
            "cispo_loss",
            "kl_loss/k3",
        )
        for p in ("fwd", "fwd+bwd")
    ),
}
"""The cases skyrl 0.4.0's side offers (bench/family/skyrl.py): every op but seq-mean-token-sum, k3+
and the rollout corrections (inside its policy losses)."""


@pytest.mark.thirdparty
@pytest.mark.parametrize("name", LIBRARIES)
def test_library_side_serves_and_matches_ppo_ref(name: str, tmp_path: Path) -> None:
    python = thirdparty_python(name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(REPO), PYTHONNOUSERSITE="1", PPO_REF_BENCH_THREADS="1")
    log = tmp_path / "worker.log"
    worker = Side(name, python, env, log, small=True)
    try:
        assert worker.error is None, f"{name}'s worker died: {worker.error}\n{log.read_text()[-3000:]}"
        keys = {key for key, _ in worker.cases}
        assert keys, f"{name}'s worker offers no case"
        assert keys <= set(KEYS), f"{name} offers cases ppo-ref's side does not: {keys - set(KEYS)}"
        assert all(label.startswith(name) for _, label in worker.cases), worker.cases
        if name == "skyrl":
            assert keys == SKYRL_KEYS
        for key, label in worker.cases:
            differences = worker.ask(cmd="check", key=key, label=label)
            assert "value" in differences, (key, label, differences)
            if key.endswith("fwd+bwd"):
                assert "grad" in differences, (key, label, differences)
            assert max(differences.values()) <= TOLERANCE, (key, label, differences)
    finally:
        worker.close()
