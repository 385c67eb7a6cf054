"""The built-in adapter ``skyrl``: skyrl 0.4.0's own PPO functions under the conformance suite.

Environment: ``python tools/thirdparty_envs.py skyrl`` builds ``.envs/skyrl`` (skyrl 0.4.0, whose
trainer is the ``skyrl-train`` extra, on CPU torch), then ``.envs/skyrl/bin/python -m pytest
conformance/ --impl=skyrl``. skyrl-train 0.3.1 (module ``skyrl_train``, the column until issue 22) is
not supported: 0.4.0 moved the functions to ``skyrl.backends.skyrl_train.utils`` and changed the losses'
reduction (see ``skyrl_family``).

skyrl 0.4.0 declares Python >=3.12; on 3.11 every ``skyrl.backends`` import fails in pydantic
("Please use `typing_extensions.TypedDict` instead of `typing.TypedDict` on Python < 3.12",
``skyrl/tinker/types.py:132``, imported by ``skyrl/backends/__init__.py``). ``_load`` imports that one
module with ``typing.TypedDict`` bound to ``typing_extensions.TypedDict`` (what 3.12's is) and
restores it; no skyrl code is changed.

Every op calls a skyrl function (``provenance`` names each one with its file and line, read
from the installed package). Besides the call, the adapter only converts arguments:

- masks are passed as 0/1 tensors of the data's float dtype (skyrl annotates them ``Float``);
- ``token_logprobs`` divides the logits by the temperature (out of place) and scores
  ``input_ids[:, 1:]`` with ``logits[:, :-1]``, as ``HFModelWrapper.forward``
  (``skyrl/backends/skyrl_train/workers/model_wrapper.py``) does before ``logprobs_from_logits`` (it
  divides in place, rolls the ids by one and keeps the response slice: the same pairs); the logits
  keep their dtype;
- ``policy_loss`` calls the loss registered as ``"regular"`` (``PolicyLossRegistry``) with skyrl's
  ``AlgorithmConfig`` at its defaults except ``eps_clip_low = clip_eps``, ``eps_clip_high =
  clip_eps_high`` (or ``clip_eps``), on advantages scaled for ``loss_agg`` by
  ``apply_loss_reduction_to_advantages_minibatch`` (what ``RayPPOTrainer._normalize_advantages`` does
  to each mini-batch; the loss is then a masked sum): ``token-mean`` -> ``token_mean``,
  ``seq-mean-token-mean`` -> ``sequence_mean``, ``seq-mean-token-sum-norm`` ->
  ``seq_mean_token_sum_norm`` with ``max_seq_len = norm_constant``, ``seq-mean-token-sum`` -> the same
  with ``max_seq_len = 1``; a ``dual_clip`` selects the loss registered as ``"dual_clip"`` with
  ``clip_ratio_c = dual_clip``;
- the PPO-family ops come from ``skyrl_family.SkyRLFamilyOps`` (issue 14);
- ``value_loss`` calls ``ppo_critic_loss`` with ``value_clip = clip_eps`` (None: unclipped).

``make_normalize_adapter`` is a second, narrower adapter (``--impl=ppo_ref.adapters.thirdparty.skyrl:
make_normalize_adapter``) whose only op, ``masked_whiten``, is ``RayPPOTrainer._normalize_advantages``
with ``advantage_batch_normalize`` set: the batch advantage normalisation of skyrl's trainer.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
import typing
from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Any

from torch import Tensor

from ppo_ref.adapters.base import OP_NAMES, LossReport
from ppo_ref.adapters.thirdparty._common import float_mask as _float_mask
from ppo_ref.adapters.thirdparty._common import import_library
from ppo_ref.adapters.thirdparty._common import library_location as _where
from ppo_ref.adapters.thirdparty.skyrl_family import (
    FAMILY_CONVENTION_SOURCES,
    FAMILY_CONVENTIONS,
    REDUCTIONS,
    SkyRLFamilyOps,
)

__all__ = [
    "CONVENTIONS",
    "CONVENTION_SOURCES",
    "NOT_PROVIDED",
    "SkyRLAdapter",
    "SkyRLNormalizeAdapter",
    "make_adapter",
    "make_normalize_adapter",
]

LIBRARY = "skyrl"
DISTRIBUTION = "skyrl"
PPO_UTILS_MODULE = "skyrl.backends.skyrl_train.utils.ppo_utils"
TORCH_UTILS_MODULE = "skyrl.backends.skyrl_train.utils.torch_utils"
REQUIRED_MODULES = (
    PPO_UTILS_MODULE,
    TORCH_UTILS_MODULE,
    "skyrl.train.config",
    "skyrl.train.trainer",
    "skyrl.backends.skyrl_train.training_batch",
)
PPO_UTILS = "skyrl/backends/skyrl_train/utils/ppo_utils.py"
TORCH_UTILS = "skyrl/backends/skyrl_train/utils/torch_utils.py"

LOSS_REDUCTIONS: Mapping[str, str] = REDUCTIONS
"""ppo-ref's loss_agg -> skyrl's loss_reduction (``skyrl_family.REDUCTIONS``)."""

CONVENTIONS: Mapping[str, object] = MappingProxyType(
    {
        "gae_whitening": "unbiased",
        "gae_bootstrap": "none",
        "kl_clamp": {"k3": 10.0},
        "log_ratio_clamp": 20.0,
        "approx_kl": None,
        "value_loss_agg": "seq-mean-token-mean",
        "loss_aggregations": [
            "token-mean",
            "seq-mean-token-mean",
            "seq-mean-token-sum",
            "seq-mean-token-sum-norm",
        ],
        "policy_loss_options": ["clip_eps_high", "dual_clip"],
        **FAMILY_CONVENTIONS,
        "masked_fill": "finite",
        "edge_inputs": ["empty_rows", "holes"],
        "off_mask_outputs": ["gae", "masked_whiten"],
        "compute_dtype": {"policy_loss": "float32"},
    }
)
"""skyrl 0.4.0's documented deviations from the reference conventions (sources in CONVENTION_SOURCES)."""

CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "gae_whitening": f"{PPO_UTILS}:1339 compute_gae_advantage_return: always ends with "
        "`advantages = masked_whiten(advantages, response_mask)` (:147 masked_whiten: masked mean, "
        ":129 unbiased masked_var, rsqrt(var + 1e-8) at :150); returns = raw advantages + values",
        "gae_bootstrap": f"{PPO_UTILS}:1312 compute_gae_advantage_return(token_level_rewards, "
        "values, response_mask, gamma, lambd): no bootstrap argument, `nextvalues = ... else 0.0` (:1332)",
        "kl_clamp": f"{PPO_UTILS}:118 compute_approx_kl: k3 is `torch.clamp(kld, min=-10, max=10)` "
        "(k1, k2, abs are not clamped)",
        "log_ratio_clamp": f"{PPO_UTILS}:567 ppo_policy_loss: `ratio = safe_exp_delta(log_probs - "
        f"old_log_probs, clip=20.0, out_dtype=log_probs.dtype)` ({TORCH_UTILS}:188 safe_exp_delta clamps "
        "the log-ratio to +-20 before exp, in float32)",
        "approx_kl": f"{PPO_UTILS}:555 ppo_policy_loss returns `(loss, {{'clip_ratio': ...}})` plus "
        "off-policy metrics: no approx-KL",
        "value_loss_agg": f"{PPO_UTILS}:173 ppo_critic_loss: "
        "`loss = masked_mean(loss, loss_mask, dim=-1).mean()` (per-row token means, then the mean over rows)",
        "loss_aggregations": f"{PPO_UTILS}:1152 apply_loss_reduction_to_advantages_minibatch scales the "
        "advantages (token_mean: / the mini-batch's token count; sequence_mean: / (rows * the row's "
        "tokens); seq_mean_token_sum_norm: / (rows * max_seq_len), norm_constant here; seq-mean-token-sum "
        "is that mode with max_seq_len = 1: skyrl_family.REDUCTIONS), then :1145 reduce_loss sums; also "
        "token_mean_legacy and prompt_mean, which the contract has no name for",
        "policy_loss_options": f"{PPO_UTILS}:555 ppo_policy_loss reads eps_clip_high "
        "(clip_eps_high) and, with policy_loss_type 'dual_clip', clip_ratio_c (dual_clip); skyrl 0.4.0 "
        "reads the reduction's counts off the mini-batch tensors (apply_loss_reduction_to_advantages_"
        "minibatch) and the losses take none: 'counts' not provided",
        **FAMILY_CONVENTION_SOURCES,
        "masked_fill": "skyrl/train/trainer.py:1334 fwd_logprobs_values_reward: log-probs and values come "
        "from forward passes over the padded sequences (finite at pad tokens); token-level rewards are 0 "
        "except the score",
        "edge_inputs": "skyrl/train/generators/utils.py:393 apply_overlong_filtering (generator."
        "apply_overlong_filtering: true) sets the loss mask of a response without EOS to all zeros: a row "
        "without action tokens in every loss (docs/findings.md skyrl-4); the multi-turn SkyRLGymGenerator "
        "(skyrl/train/generators/skyrl_gym_generator.py:1371) builds `loss_mask_for_turn = [1] * "
        "len(new_resp_tokens) + [0] * len(obs_ids_to_add)` per turn: the environment's observation "
        "tokens are holes",
        "off_mask_outputs": f"{PPO_UTILS}:147 masked_whiten is verl's: it transforms every "
        "entry ((values - mean) * rsqrt(var + 1e-8)), and compute_gae_advantage_return ends with it, "
        "leaving masked-out advantages and returns non-zero; the losses read them only through "
        "loss_mask (docs/findings.md skyrl-6-whiten)",
        "compute_dtype": f"{TORCH_UTILS}:192 safe_exp_delta: `torch.clamp(delta.to("
        "torch.float32), -clip, clip).exp()` then `.to(out_dtype or delta.dtype)`: ppo_policy_loss's ratio "
        "is computed in float32 whatever the log-probs' dtype",
    }
)
"""Where each declared convention shows in skyrl 0.4.0's code (file:line in the installed release)."""

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {
        "token_rewards": "the KL-in-reward step is the trainer method RayPPOTrainer.apply_reward_kl_penalty "
        "(skyrl/train/trainer.py:1439, subtracts kl * coef from token rewards the generator already "
        "built); score placement happens in the generators; no function maps (scores, logp, ref_logp, "
        "mask) to token rewards",
        "ppo_penalty_loss": "skyrl has no PPO-Penalty (adaptive-beta KL-penalised surrogate) loss",
    }
)
"""Ops of the contract this adapter does not provide, and why."""


def _import_tinker_types() -> None:
    """Import ``skyrl.tinker.types`` with ``typing.TypedDict`` bound to ``typing_extensions.TypedDict``.

    On Python < 3.12 pydantic refuses the ``typing.TypedDict`` that module uses (skyrl 0.4.0 declares
    Python >=3.12), and ``skyrl/backends/__init__.py`` imports it, so no ``skyrl.backends`` module
    would import. The binding is restored at once; only that module's class sees the backport.
    """
    if sys.version_info >= (3, 12) or "skyrl.tinker.types" in sys.modules:
        return
    import typing_extensions

    original = typing.TypedDict
    typing.TypedDict = typing_extensions.TypedDict
    try:
        import_library(LIBRARY, "skyrl 0.4.0", "skyrl.tinker.types")
    finally:
        typing.TypedDict = original


def _load() -> dict[str, ModuleType]:
    _import_tinker_types()
    return {name: import_library(LIBRARY, "skyrl 0.4.0", name) for name in REQUIRED_MODULES}


class SkyRLAdapter(SkyRLFamilyOps):
    """Each op is a skyrl 0.4.0 function; see the module docstring for the argument conversions."""

    name = LIBRARY
    conventions = CONVENTIONS
    convention_sources = CONVENTION_SOURCES

    def __init__(self, modules: Mapping[str, ModuleType]) -> None:
        self._ppo = modules[PPO_UTILS_MODULE]
        self._torch_utils = modules[TORCH_UTILS_MODULE]
        self._config = modules["skyrl.train.config"]
        self._configs: dict[tuple[float, float, float | None], Any] = {}
        self.version = importlib.metadata.version(DISTRIBUTION)
        ppo, torch_utils = self._ppo, self._torch_utils
        sources = {
            "token_logprobs": _where(torch_utils.logprobs_from_logits) + " on logits / temperature",
            "entropy": _where(torch_utils.chunked_entropy_from_logits),
            "masked_mean": _where(torch_utils.masked_mean),
            "masked_whiten": _where(ppo.masked_whiten),
            "kl_penalty": _where(ppo.compute_approx_kl)
            + " (kl_estimator_type k1, k2, k3 as given; loss_mask)",
            "gae": _where(ppo.compute_gae_advantage_return)
            + " (registered as AdvantageEstimatorRegistry 'gae')",
            "policy_loss": _where(ppo.PolicyLossRegistry.get("regular"))
            + " via PolicyLossRegistry.get('regular'), advantages scaled by "
            + _where(ppo.apply_loss_reduction_to_advantages_minibatch),
            "value_loss": _where(ppo.ppo_critic_loss),
        }
        family, family_missing = self.family_sources()
        sources.update(family)
        not_provided = {**NOT_PROVIDED, **family_missing}
        sources = {op: sources[op] for op in OP_NAMES if op in sources}
        self.ops: frozenset[str] = frozenset(sources)
        self.not_provided: Mapping[str, str] = MappingProxyType(not_provided)
        self.provenance = "; ".join(
            [f"{op}: {source}" for op, source in sources.items()]
            + [f"not provided: {op} ({reason})" for op, reason in not_provided.items()]
        )

    def __repr__(self) -> str:
        return f"SkyRLAdapter(version={self.version!r})"

    def token_logprobs(self, logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
        scaled = logits / temperature
        result: Tensor = self._torch_utils.logprobs_from_logits(scaled[:, :-1], input_ids[:, 1:])
        return result

    def entropy(self, logits: Tensor) -> Tensor:
        result: Tensor = self._torch_utils.chunked_entropy_from_logits(logits)
        return result

    def masked_mean(self, x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
        result: Tensor = self._torch_utils.masked_mean(x, _float_mask(mask, x), dim=dim)
        return result

    def masked_whiten(self, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
        result: Tensor = self._ppo.masked_whiten(x, _float_mask(mask, x), shift_mean=shift_mean)
        return result

    def kl_penalty(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        loss_mask = None if mask is None else _float_mask(mask, logp)
        kl: Tensor = self._ppo.compute_approx_kl(
            logp, ref_logp, loss_mask=loss_mask, kl_estimator_type=estimator
        )
        return kl

    def gae(
        self,
        rewards: Tensor,
        values: Tensor,
        mask: Tensor,
        gamma: float,
        lam: float,
        last_values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        if last_values is not None:
            raise ValueError(
                "last_values: skyrl's compute_gae_advantage_return has no bootstrap input "
                "(declared gae_bootstrap='none')"
            )
        advantages, returns = self._ppo.compute_gae_advantage_return(
            token_level_rewards=rewards,
            values=values,
            response_mask=_float_mask(mask, values),
            gamma=gamma,
            lambd=lam,
        )
        return advantages, returns

    def _policy_config(self, clip_eps: float, clip_eps_high: float | None, dual_clip: float | None) -> Any:
        high = clip_eps if clip_eps_high is None else clip_eps_high
        key = (clip_eps, high, dual_clip)
        if key not in self._configs:
            self._configs[key] = self._algorithm_config(
                policy_loss_type="regular" if dual_clip is None else "dual_clip",
                eps_clip_low=clip_eps,
                eps_clip_high=high,
                clip_ratio_c=3.0 if dual_clip is None else dual_clip,
            )
        return self._configs[key]

    def policy_loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_eps: float,
        loss_agg: str = "token-mean",
        *,
        clip_eps_high: float | None = None,
        dual_clip: float | None = None,
        norm_constant: float | None = None,
    ) -> LossReport:
        keep = _float_mask(mask, logp)
        scaled = self._scaled(advantages, keep, loss_agg, norm_constant)
        loss_fn = self._ppo.PolicyLossRegistry.get("regular" if dual_clip is None else "dual_clip")
        loss, metrics = loss_fn(
            logp, old_logp, scaled, self._policy_config(clip_eps, clip_eps_high, dual_clip), loss_mask=keep
        )
        return LossReport(loss=loss, clipfrac=metrics["clip_ratio"])

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
    ) -> Tensor:
        config = self._algorithm_config(value_clip=clip_eps)
        loss, _clipfrac = self._ppo.ppo_critic_loss(
            values, old_values, returns, config, loss_mask=_float_mask(mask, values)
        )
        result: Tensor = loss
        return result


class SkyRLNormalizeAdapter:
    """``masked_whiten`` only, through ``RayPPOTrainer._normalize_advantages`` (shift_mean=True only)."""

    name = "skyrl-normalize-advantages"
    ops: frozenset[str] = frozenset({"masked_whiten"})
    conventions: Mapping[str, object] = MappingProxyType(
        {"whiten_variance": "biased", "whiten_eps_placement": "clamp", "whiten_modes": ["shift-mean"]}
    )
    convention_sources: Mapping[str, str] = MappingProxyType(
        {
            "whiten_variance": "skyrl/train/trainer.py:1497 RayPPOTrainer._normalize_advantages (step 1, "
            "advantage_batch_normalize): `std = ((advantages - mean).pow(2) * response_mask).sum()`, "
            "`rstd = (std / num_actions).clamp(min=1e-8).rsqrt()` (1/n)",
            "whiten_eps_placement": "the same line: `.clamp(min=1e-8).rsqrt()`, the epsilon as a floor "
            "of the variance, not added to it",
            "whiten_modes": "_normalize_advantages always centres: no shift_mean=False",
        }
    )

    def __init__(self, modules: Mapping[str, ModuleType]) -> None:
        self._normalize = modules["skyrl.train.trainer"].RayPPOTrainer._normalize_advantages
        self._batch = modules["skyrl.backends.skyrl_train.training_batch"].TrainingInputBatch
        self.version = importlib.metadata.version(DISTRIBUTION)
        self.provenance = (
            f"masked_whiten: {_where(self._normalize)} with trainer.algorithm.advantage_batch_normalize "
            "true, on one mini-batch {'advantages': x, 'response_mask': mask, 'loss_mask': mask}; its step 2 "
            "(the loss reduction folded into the advantages, token_mean: / the token count) is undone by "
            "multiplying by the token count; `self` is a stand-in holding only the config fields it reads "
            "(shift_mean=False: the method has no such mode, declared by whiten_modes); every other op "
            "is not provided (see --impl=skyrl)"
        )

    def __repr__(self) -> str:
        return f"SkyRLNormalizeAdapter(version={self.version!r})"

    def masked_whiten(self, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
        if not shift_mean:
            raise ValueError(
                "shift_mean: skyrl's RayPPOTrainer._normalize_advantages always centres (no shift_mean=False)"
            )
        keep = _float_mask(mask, x)
        rows = x.reshape(1, -1) if x.dim() == 1 else x
        keep_rows = keep.reshape(rows.shape)
        algorithm = types.SimpleNamespace(
            advantage_batch_normalize=True, loss_reduction="token_mean", max_seq_len=None
        )
        trainer = types.SimpleNamespace(
            cfg=types.SimpleNamespace(
                trainer=types.SimpleNamespace(
                    algorithm=algorithm, micro_train_batch_size_per_gpu=rows.shape[0]
                )
            )
        )
        data = self._batch({"advantages": rows, "response_mask": keep_rows, "loss_mask": keep_rows})
        out = self._normalize(trainer, data, [(0, rows.shape[0])])
        result: Tensor = (out["advantages"] * keep_rows.sum().clamp(min=1)).reshape(x.shape)
        return result


def make_adapter() -> SkyRLAdapter:
    """Import skyrl 0.4.0 (only now) and return its adapter; a clear error if it is not installed."""
    return SkyRLAdapter(_load())


def make_normalize_adapter() -> SkyRLNormalizeAdapter:
    """The adapter whose ``masked_whiten`` is skyrl's ``normalize_advantages_dict``."""
    return SkyRLNormalizeAdapter(_load())
