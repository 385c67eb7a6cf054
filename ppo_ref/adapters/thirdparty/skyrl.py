"""The built-in adapter ``skyrl``: skyrl-train's own PPO functions under the conformance suite.

Environment: ``python tools/thirdparty_envs.py skyrl`` builds ``.envs/skyrl`` (skyrl-train 0.3.1 on
CPU torch), then ``.envs/skyrl/bin/python -m pytest conformance/ --impl=skyrl``.

Every op calls a skyrl-train function (``provenance`` names each one with its file and line, read
from the installed package). Besides the call, the adapter only converts arguments:

- masks are passed as 0/1 tensors of the data's float dtype (skyrl annotates them ``Float``);
- ``token_logprobs`` divides the logits by the temperature (out of place) and scores
  ``input_ids[:, 1:]`` with ``logits[:, :-1]``, as ``HFModelWrapper.forward``
  (``skyrl_train/model_wrapper.py``) does before ``logprobs_from_logits`` (it divides in place, rolls
  the ids by one and keeps the response slice: the same pairs); the logits keep their dtype;
- ``policy_loss`` calls the loss registered as ``"regular"`` (``PolicyLossRegistry``) with an
  ``omegaconf`` config holding skyrl's defaults (``ppo_base_config.yaml``) except ``eps_clip_low =
  clip_eps``, ``eps_clip_high = clip_eps_high`` (or ``clip_eps``) and ``loss_reduction``:
  ``token-mean`` -> ``token_mean``, ``seq-mean-token-mean`` -> ``sequence_mean``,
  ``seq-mean-token-sum-norm`` -> ``seq_mean_token_sum_norm`` with ``max_seq_len = norm_constant``,
  ``seq-mean-token-sum`` -> the same with ``max_seq_len = 1`` (the Dr. GRPO divisor set to 1 leaves
  the per-row token sums); a ``dual_clip`` selects the loss registered as ``"dual_clip"`` with
  ``clip_ratio_c = dual_clip``;
- the PPO-family ops come from ``skyrl_family.SkyRLFamilyOps`` (issue 14);
- ``value_loss`` calls ``ppo_critic_loss`` with ``value_clip = clip_eps`` (None: unclipped).

``make_normalize_adapter`` is a second, narrower adapter (``--impl=ppo_ref.adapters.thirdparty.skyrl:
make_normalize_adapter``) whose only op, ``masked_whiten``, is ``normalize_advantages_dict``: the
batch advantage normalisation skyrl's trainer applies when ``advantage_batch_normalize`` is set.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any

from torch import Tensor

from ppo_ref.adapters.base import OP_NAMES
from ppo_ref.adapters.thirdparty._common import float_mask as _float_mask
from ppo_ref.adapters.thirdparty._common import import_library
from ppo_ref.adapters.thirdparty._common import library_location as _where
from ppo_ref.adapters.thirdparty.skyrl_family import (
    FAMILY_CONVENTION_SOURCES,
    FAMILY_CONVENTIONS,
    REDUCTIONS,
    SkyRLFamilyOps,
    reduction_config,
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
DISTRIBUTION = "skyrl-train"
REQUIRED_MODULES = ("skyrl_train.utils.ppo_utils", "skyrl_train.utils.torch_utils", "omegaconf")

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
"""skyrl-train's documented deviations from the reference conventions (sources in CONVENTION_SOURCES)."""

CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "gae_whitening": "skyrl_train/utils/ppo_utils.py compute_gae_advantage_return: always ends with "
        "`advantages = masked_whiten(advantages, response_mask)` (ppo_utils.masked_whiten: masked mean, "
        "unbiased masked_var, rsqrt(var + 1e-8)); returns = raw advantages + values",
        "gae_bootstrap": "skyrl_train/utils/ppo_utils.py compute_gae_advantage_return(token_level_rewards, "
        "values, response_mask, gamma, lambd): no bootstrap argument, `nextvalues = ... else 0.0`",
        "kl_clamp": "skyrl_train/utils/ppo_utils.py compute_approx_kl: k3 is `torch.clamp(ratio - kl - 1, "
        "min=-10, max=10)` (k1, k2, abs are not clamped)",
        "log_ratio_clamp": "skyrl_train/utils/ppo_utils.py ppo_policy_loss: `ratio = "
        "_safe_exp_delta(log_probs - old_log_probs, clip=20.0)` (_safe_exp_delta clamps the log-ratio "
        "to +-20 before exp, in float32)",
        "approx_kl": "skyrl_train/utils/ppo_utils.py ppo_policy_loss returns `(loss, clip_ratio)`: "
        "no approx-KL",
        "value_loss_agg": "skyrl_train/utils/ppo_utils.py ppo_critic_loss: "
        "`loss = masked_mean(loss, loss_mask, dim=-1).mean()` (per-row token means, then the mean over rows)",
        "loss_aggregations": "skyrl_train/utils/ppo_utils.py reduce_loss: token_mean, sequence_mean and "
        "seq_mean_token_sum_norm, which divides by max_seq_len (norm_constant here; seq-mean-token-sum is "
        "that mode with max_seq_len = 1: skyrl_family.REDUCTIONS)",
        "policy_loss_options": "skyrl_train/utils/ppo_utils.py ppo_policy_loss reads eps_clip_high "
        "(clip_eps_high) and, with policy_loss_type 'dual_clip', clip_ratio_c (dual_clip); skyrl-train 0.3.1 "
        "reduces each micro-batch on its own and divides by the accumulation steps "
        "(skyrl_train/workers/worker.py), so it takes no whole-batch counts: 'counts' not provided",
        **FAMILY_CONVENTION_SOURCES,
        "masked_fill": "skyrl_train/trainer.py fwd_logprobs_values_reward: log-probs and values come from "
        "forward passes over the padded sequences (finite at pad tokens); token-level rewards are 0 "
        "except the score (skyrl_train/utils/ppo_utils.py)",
        "edge_inputs": "skyrl_train/generators/utils.py apply_overlong_filtering (generator."
        "apply_overlong_filtering: true) sets the loss mask of a response without EOS to all zeros: a row "
        "without action tokens in every loss (docs/findings.md skyrl-4); the multi-turn SkyRLGymGenerator "
        "(skyrl_train/generators/skyrl_gym_generator.py) builds `loss_mask_for_turn = [1] * "
        "len(new_resp_tokens) + [0] * len(obs_ids_to_add)` per turn: the environment's observation "
        "tokens are holes",
        "off_mask_outputs": "skyrl_train/utils/ppo_utils.py masked_whiten is verl's: it transforms every "
        "entry ((values - mean) * rsqrt(var + 1e-8)), and compute_gae_advantage_return ends with it, "
        "leaving masked-out advantages and returns non-zero; the losses read them only through "
        "loss_mask (docs/findings.md skyrl-6-whiten)",
        "compute_dtype": "skyrl_train/utils/ppo_utils.py _safe_exp_delta: `torch.clamp(delta.to("
        "torch.float32), -clip, clip).exp()` then `.to(out_dtype or delta.dtype)`: ppo_policy_loss's ratio "
        "is computed in float32 whatever the log-probs' dtype",
    }
)
"""Where each declared convention shows in skyrl-train's code."""

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {
        "token_rewards": "the KL-in-reward step is the trainer method RayPPOTrainer.apply_reward_kl_penalty "
        "(skyrl_train/trainer.py, subtracts kl * coef from token rewards the generator already built); score "
        "placement happens in the generators; no function maps (scores, logp, ref_logp, mask) to token "
        "rewards",
        "ppo_penalty_loss": "skyrl-train has no PPO-Penalty (adaptive-beta KL-penalised surrogate) loss",
    }
)
"""Ops of the contract this adapter does not provide, and why."""


@dataclass(frozen=True)
class PolicyLossResult:
    """skyrl's policy loss and its ``clip_ratio`` (clipfrac); skyrl reports no approx-KL."""

    loss: Tensor
    clipfrac: float
    approx_kl: None = None


def _load() -> dict[str, ModuleType]:
    return {name: import_library(LIBRARY, "skyrl-train", name) for name in REQUIRED_MODULES}


class SkyRLAdapter(SkyRLFamilyOps):
    """Each op is a skyrl-train function; see the module docstring for the argument conversions."""

    name = LIBRARY
    conventions = CONVENTIONS
    convention_sources = CONVENTION_SOURCES

    def __init__(self, modules: Mapping[str, ModuleType]) -> None:
        self._ppo = modules["skyrl_train.utils.ppo_utils"]
        self._torch_utils = modules["skyrl_train.utils.torch_utils"]
        self._omegaconf = modules["omegaconf"].OmegaConf
        self._configs: dict[tuple[float, float, float | None, str, float | None], Any] = {}
        self.version = importlib.metadata.version(DISTRIBUTION)
        ppo, torch_utils = self._ppo, self._torch_utils
        sources = {
            "token_logprobs": _where(torch_utils.logprobs_from_logits) + " on logits / temperature",
            "entropy": _where(torch_utils.chunked_entropy_from_logits),
            "masked_mean": _where(ppo.masked_mean),
            "masked_whiten": _where(ppo.masked_whiten),
            "kl_penalty": _where(ppo.compute_approx_kl)
            + " (kl_estimator_type k1, k2, k3 as given; loss_mask)",
            "gae": _where(ppo.compute_gae_advantage_return)
            + " (registered as AdvantageEstimatorRegistry 'gae')",
            "policy_loss": _where(ppo.PolicyLossRegistry.get("regular"))
            + " via PolicyLossRegistry.get('regular')",
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
        result: Tensor = self._ppo.masked_mean(x, _float_mask(mask, x), dim=dim)
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
                "last_values: skyrl-train's compute_gae_advantage_return has no bootstrap input "
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

    def _policy_config(
        self,
        clip_eps: float,
        loss_agg: str,
        clip_eps_high: float | None = None,
        dual_clip: float | None = None,
        norm_constant: float | None = None,
    ) -> Any:
        high = clip_eps if clip_eps_high is None else clip_eps_high
        key = (clip_eps, high, dual_clip, loss_agg, norm_constant)
        if key not in self._configs:
            self._configs[key] = self._omegaconf.create(
                {
                    "policy_loss_type": "regular" if dual_clip is None else "dual_clip",
                    "eps_clip_low": clip_eps,
                    "eps_clip_high": high,
                    "clip_ratio_c": 3.0 if dual_clip is None else dual_clip,
                    "use_tis": False,
                    "tis_imp_ratio_cap": -1.0,
                    **reduction_config(loss_agg, norm_constant),
                }
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
    ) -> PolicyLossResult:
        loss_fn = self._ppo.PolicyLossRegistry.get("regular" if dual_clip is None else "dual_clip")
        loss, clip_ratio = loss_fn(
            logp,
            old_logp,
            advantages,
            self._policy_config(clip_eps, loss_agg, clip_eps_high, dual_clip, norm_constant),
            loss_mask=_float_mask(mask, logp),
        )
        return PolicyLossResult(loss=loss, clipfrac=clip_ratio)

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
    ) -> Tensor:
        config = self._omegaconf.create({"value_clip": clip_eps})
        loss, _clipfrac = self._ppo.ppo_critic_loss(
            values, old_values, returns, config, loss_mask=_float_mask(mask, values)
        )
        result: Tensor = loss
        return result


class SkyRLNormalizeAdapter:
    """``masked_whiten`` only, through ``normalize_advantages_dict`` (shift_mean=True only)."""

    name = "skyrl-normalize-advantages"
    ops: frozenset[str] = frozenset({"masked_whiten"})
    conventions: Mapping[str, object] = MappingProxyType(
        {"whiten_variance": "biased", "whiten_eps_placement": "clamp", "whiten_modes": ["shift-mean"]}
    )
    convention_sources: Mapping[str, str] = MappingProxyType(
        {
            "whiten_variance": "skyrl_train/utils/ppo_utils.py normalize_advantages_dict: "
            "`std = ((advantages - mean).pow(2) * response_masks).sum()`, "
            "`rstd = (std / num_actions).clamp(min=1e-8).rsqrt()` (1/n)",
            "whiten_eps_placement": "the same line: `.clamp(min=1e-8).rsqrt()`, the epsilon as a floor "
            "of the variance, not added to it",
            "whiten_modes": "normalize_advantages_dict always centres: no shift_mean=False",
        }
    )

    def __init__(self, modules: Mapping[str, ModuleType]) -> None:
        self._normalize = modules["skyrl_train.utils.ppo_utils"].normalize_advantages_dict
        self.version = importlib.metadata.version(DISTRIBUTION)
        self.provenance = (
            f"masked_whiten: {_where(self._normalize)} on {{'advantages': x, 'response_mask': mask}} "
            "(shift_mean=False: the function has no such mode, declared by whiten_modes); every other op is "
            "not provided "
            "(see --impl=skyrl)"
        )

    def __repr__(self) -> str:
        return f"SkyRLNormalizeAdapter(version={self.version!r})"

    def masked_whiten(self, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
        if not shift_mean:
            raise ValueError(
                "shift_mean: skyrl's normalize_advantages_dict always centres (no shift_mean=False)"
            )
        batch = self._normalize({"advantages": x, "response_mask": _float_mask(mask, x)})
        result: Tensor = batch["advantages"]
        return result


def make_adapter() -> SkyRLAdapter:
    """Import skyrl-train (only now) and return its adapter; a clear error if it is not installed."""
    return SkyRLAdapter(_load())


def make_normalize_adapter() -> SkyRLNormalizeAdapter:
    """The adapter whose ``masked_whiten`` is skyrl's ``normalize_advantages_dict``."""
    return SkyRLNormalizeAdapter(_load())
