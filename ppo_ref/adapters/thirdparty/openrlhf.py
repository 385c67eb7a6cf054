"""The built-in adapter ``openrlhf``: OpenRLHF's own PPO functions under the conformance suite.

Environment: ``python tools/thirdparty_envs.py openrlhf`` builds ``.envs/openrlhf`` (OpenRLHF 0.11.2
on CPU torch), then ``.envs/openrlhf/bin/python -m pytest conformance/ --impl=openrlhf``.

OpenRLHF's modules import ``flash_attn`` and ``vllm`` at top level, which do not install without
CUDA; ``make_adapter`` first installs the allow-listed import stubs of
:mod:`ppo_ref.adapters.thirdparty._openrlhf_stubs` (a finder at the end of ``sys.meta_path``,
stand-ins that raise if called), so OpenRLHF's own ``except ImportError`` fallbacks still run.

Every op calls an OpenRLHF function (``provenance`` names each one with its file and line, read from
the installed package). Besides the call, the adapter only converts arguments, mirroring what
OpenRLHF's trainer does before it calls the same function:

- masks are passed as 0/1 tensors of the data's float dtype;
- ``token_logprobs`` / ``entropy``: half-precision logits are cast to float32 first, as
  ``Actor.forward`` does (``openrlhf/models/actor.py``: ``output["logits"].to(torch.float32)``;
  float32/float64 logits are passed as they are); ``token_logprobs`` scores ``input_ids[:, 1:]``
  with ``logits[:, :-1]`` (OpenRLHF rolls the ids by one and drops the last column: the same
  pairs) and hands the temperature to ``log_probs_from_logits`` (its own parameter: it divides the
  logits in place, the same division ``Actor.forward`` applies before its call), so the adapter
  passes a copy when the temperature is not 1;
- ``entropy`` calls ``compute_entropy`` as OpenRLHF does, ``@torch.compile``d: compiling for the
  shapes the suite draws took about 50 s of a conformance run on a loaded 2-core CPU (the ENT-1
  property test: 51 s), kept because the compiled kernel is what OpenRLHF runs;
- ``kl_penalty`` / ``token_rewards`` with a mask multiply both log-prob tensors by the mask before
  ``compute_approx_kl``: ``Actor.forward`` returns ``log_probs * action_mask.float()`` for the
  policy and for the reference model, and those are what the experience maker passes;
- ``gae`` calls ``RemoteExperienceMaker.get_advantages_and_returns`` unbound: it never reads
  ``self``;
- ``policy_loss`` builds ``PolicyLoss(clip_eps_low=clip_eps, clip_eps_high=clip_eps_high or
  clip_eps, dual_clip=dual_clip, token_level_loss=(loss_agg == "token-mean"))`` as ``PPOActor``
  does from ``--actor.eps_clip_low_high``, ``--actor.dual_clip`` and ``--actor.loss_agg_mode``
  (``openrlhf/trainer/ray/ppo_actor.py``); ``value_loss`` builds ``ValueLoss(clip_eps,
  token_level_loss=...)``; both pass ``token_count`` / ``row_count`` as ``batch_num_tokens`` /
  ``global_batch_size``, as ``PPOActor`` passes ``get_loss_batch_info``'s result;
- the PPO-family ops come from ``openrlhf_family.OpenRLHFFamilyOps`` (issue 14).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.base import OP_NAMES, LossReport
from ppo_ref.adapters.registry import AdapterLoadError
from ppo_ref.adapters.thirdparty import _openrlhf_stubs
from ppo_ref.adapters.thirdparty._common import float_mask as _float_mask
from ppo_ref.adapters.thirdparty._common import import_library, missing_library
from ppo_ref.adapters.thirdparty._common import library_location as _where
from ppo_ref.adapters.thirdparty.openrlhf_family import (
    FAMILY_CONVENTION_SOURCES,
    FAMILY_CONVENTIONS,
    OpenRLHFFamilyOps,
    loss_batch_info,
)

__all__ = ["CONVENTIONS", "CONVENTION_SOURCES", "NOT_PROVIDED", "OpenRLHFAdapter", "make_adapter"]

LIBRARY = "openrlhf"
REQUIRED_MODULES = (
    "openrlhf.models.loss",
    "openrlhf.models.utils",
    "openrlhf.trainer.ppo_utils.experience_maker",
)

CONVENTIONS: Mapping[str, object] = MappingProxyType(
    {
        "gae_bootstrap": "none",
        "kl_clamp": 10.0,
        "log_ratio_clamp": 20.0,
        "approx_kl": "k1",
        "loss_aggregations": ["token-mean", "seq-mean-token-mean"],
        "policy_loss_options": ["clip_eps_high", "dual_clip", "counts"],
        "masked_fill": "finite",
        "edge_inputs": ["holes"],
        "log_ratio_clamp_statistics": "raw",
        "compute_dtype": {"kl_penalty": "float32", "token_rewards": "float32", "kl_loss": "float32"},
        "score_clip": 10.0,
        **FAMILY_CONVENTIONS,
    }
)
"""OpenRLHF's documented deviations from the reference conventions (sources in CONVENTION_SOURCES)."""

CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "gae_bootstrap": "openrlhf/trainer/ppo_utils/experience_maker.py "
        "RemoteExperienceMaker.get_advantages_and_returns(values, rewards, action_mask, gamma, lambd): no "
        "bootstrap argument, `nextvalues = ... else 0.0` after the last column",
        "kl_clamp": "openrlhf/models/utils.py compute_approx_kl: `value = value.clamp(min=-10, max=10)` "
        "for every estimator (k1, k2, k3)",
        "log_ratio_clamp": "openrlhf/models/loss.py PolicyLoss.forward: `policy_log_ratio = "
        "raw_policy_log_ratio.clamp(min=-20.0, max=20.0)` before the ratio (ppo_kl uses the raw log-ratio)",
        "approx_kl": "openrlhf/models/loss.py PolicyLoss.forward: `ppo_kl = masked_mean("
        "-raw_policy_log_ratio.detach(), action_mask)`, i.e. mean(old - new)",
        "loss_aggregations": "openrlhf/cli/train_ppo_ray.py --actor.loss_agg_mode choices "
        "['token-mean', 'seq-mean-token-mean'], mapped to PolicyLoss(token_level_loss=...) in "
        "openrlhf/trainer/ray/ppo_actor.py; openrlhf/models/loss.py aggregate_loss",
        "policy_loss_options": "openrlhf/models/loss.py PolicyLoss(clip_eps_low, clip_eps_high, dual_clip, "
        "...) from --actor.eps_clip_low_high and --actor.dual_clip (openrlhf/trainer/ray/ppo_actor.py); "
        "PolicyLoss.forward and ValueLoss.forward take batch_num_tokens and global_batch_size (the counts, "
        "from openrlhf/utils/loss_utils.py get_loss_batch_info); no norm_constant (OpenRLHF has no "
        "seq-mean-token-sum-norm)",
        "masked_fill": "openrlhf/trainer/ppo_utils/experience_maker.py make_experience: action log-probs, "
        "values and the reference log-probs come from forward passes over the padded sequences (finite at "
        "pad tokens); compute_reward puts the score on the last action token of zeros",
        "edge_inputs": "openrlhf/utils/agent.py MultiTurnAgentExecutor returns one action range per turn "
        "and trainer/ppo_utils/samples_generator.py SamplesGenerator._process_response_into_experience sets "
        "action_mask to 1 on those ranges only, so the environment's tokens between two turns are holes "
        "(--train.agent_func_path; docs/findings.md openrlhf-2)",
        "log_ratio_clamp_statistics": "openrlhf/models/loss.py PolicyLoss.forward: the ratio uses "
        "`raw_policy_log_ratio.clamp(-20, 20)`, `ppo_kl = masked_mean(-raw_policy_log_ratio.detach(), "
        "action_mask)` the unclamped one",
        "compute_dtype": "openrlhf/models/utils.py compute_approx_kl: `log_ratio = log_probs.float() - "
        "log_probs_base.float()` (KL in float32 on purpose, OpenRLHF #620), so kl_penalty, the KL of "
        "token_rewards and kl_loss compute in float32 whatever they are given",
        "score_clip": "openrlhf/models/utils.py compute_reward: `r = r.clamp(min=reward_clip_range[0], "
        "max=reward_clip_range[1])`, called with args.reward.clip_range "
        "(openrlhf/trainer/ppo_utils/experience_maker.py), default (-10, 10) "
        "(openrlhf/cli/train_ppo_ray.py --reward.clip_range)",
        **FAMILY_CONVENTION_SOURCES,
    }
)
"""Where each declared convention shows in OpenRLHF's code."""

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {
        "masked_whiten": "OpenRLHF whitens advantages inline in RemoteExperienceMaker."
        "compute_advantages_and_returns (openrlhf/trainer/ppo_utils/experience_maker.py: over all "
        "experiences, biased variance, var.clamp(min=1e-8).rsqrt(), no shift_mean), which needs the "
        "whole experience pipeline; openrlhf.models.utils.masked_normalize whitens each row separately "
        "(dim=1) and nothing in OpenRLHF 0.11.2 calls it",
        "ppo_penalty_loss": "OpenRLHF has no PPO-Penalty (adaptive-beta KL-penalised surrogate) loss",
    }
)
"""Ops of the contract this adapter does not provide, and why."""


def _as_actor_logits(logits: Tensor) -> Tensor:
    """Half-precision logits cast to float32, as ``Actor.forward`` does; wider ones unchanged."""
    return logits.to(torch.float32) if logits.dtype in (torch.float16, torch.bfloat16) else logits


class OpenRLHFAdapter(OpenRLHFFamilyOps):
    """Each op is an OpenRLHF function; see the module docstring for the argument conversions."""

    name = LIBRARY
    conventions = CONVENTIONS
    convention_sources = CONVENTION_SOURCES

    def __init__(self, modules: Mapping[str, ModuleType]) -> None:
        self._loss = modules["openrlhf.models.loss"]
        self._utils = modules["openrlhf.models.utils"]
        self._maker = modules["openrlhf.trainer.ppo_utils.experience_maker"].RemoteExperienceMaker
        self._policy_losses: dict[tuple[float, float, float | None, str], Any] = {}
        self.version = importlib.metadata.version("openrlhf")
        utils = self._utils
        kl = _where(utils.compute_approx_kl)
        sources = {
            "token_logprobs": _where(utils.log_probs_from_logits),
            "entropy": _where(utils.compute_entropy) + " (the torch.compile'd function, called as is)",
            "masked_mean": _where(utils.masked_mean),
            "kl_penalty": f"{kl} on log-probs multiplied by the mask (as Actor.forward returns them)",
            "token_rewards": f"{_where(utils.compute_reward)} (reward_clip_range=(-10, 10), the trainer's "
            f"default --reward.clip_range) with kl from {kl}",
            "gae": _where(self._maker.get_advantages_and_returns) + " called unbound (self unused)",
            "policy_loss": _where(self._loss.PolicyLoss.forward),
            "value_loss": _where(self._loss.ValueLoss.forward),
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
        return f"OpenRLHFAdapter(version={self.version!r})"

    def token_logprobs(self, logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
        actor_logits = _as_actor_logits(logits)
        shifted = actor_logits[:, :-1]
        if temperature != 1.0 and actor_logits is logits:
            shifted = shifted.clone()  # log_probs_from_logits divides its argument in place
        result: Tensor = self._utils.log_probs_from_logits(shifted, input_ids[:, 1:], temperature=temperature)
        return result

    def entropy(self, logits: Tensor) -> Tensor:
        result: Tensor = self._utils.compute_entropy(_as_actor_logits(logits))
        return result

    def masked_mean(self, x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
        result: Tensor = self._utils.masked_mean(x, _float_mask(mask, x), dim=dim)
        return result

    def _kl(self, logp: Tensor, ref_logp: Tensor, estimator: str, mask: Tensor | None) -> Tensor:
        if mask is not None:
            logp, ref_logp = logp * _float_mask(mask, logp), ref_logp * _float_mask(mask, ref_logp)
        kl: Tensor = self._utils.compute_approx_kl(logp, ref_logp, kl_estimator=estimator)
        return kl

    def kl_penalty(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        return self._kl(logp, ref_logp, estimator, mask)

    def token_rewards(
        self,
        scores: Tensor,
        logp: Tensor,
        ref_logp: Tensor,
        mask: Tensor,
        kl_coef: float,
        estimator: str = "k1",
    ) -> Tensor:
        kl = self._kl(logp, ref_logp, estimator, mask)
        rewards: Tensor = self._utils.compute_reward(
            scores, kl_coef, kl, action_mask=_float_mask(mask, kl), reward_clip_range=(-10.0, 10.0)
        )
        return rewards

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
                "last_values: OpenRLHF's get_advantages_and_returns has no bootstrap input "
                "(declared gae_bootstrap='none')"
            )
        advantages, returns = self._maker.get_advantages_and_returns(
            None, values, rewards, _float_mask(mask, values), gamma, lam
        )
        return advantages, returns

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
        token_count: int | Tensor | None = None,
        row_count: int | Tensor | None = None,
    ) -> LossReport:
        if norm_constant is not None:
            raise ValueError("norm_constant: OpenRLHF has no seq-mean-token-sum-norm mode")
        if loss_agg not in ("token-mean", "seq-mean-token-mean"):
            raise ValueError(
                "loss_agg: OpenRLHF's PolicyLoss has token-mean and seq-mean-token-mean only, "
                f"got {loss_agg!r}"
            )
        high = clip_eps if clip_eps_high is None else clip_eps_high
        key = (clip_eps, high, dual_clip, loss_agg)
        if key not in self._policy_losses:
            self._policy_losses[key] = self._loss.PolicyLoss(
                clip_eps_low=clip_eps,
                clip_eps_high=high,
                dual_clip=dual_clip,
                token_level_loss=loss_agg == "token-mean",
            )
        loss, clip_ratio, ppo_kl, _vllm_kl, _filtered = self._policy_losses[key](
            logp,
            old_logp,
            advantages,
            action_mask=_float_mask(mask, logp),
            **loss_batch_info(token_count, row_count),
        )
        return LossReport(loss=loss, clipfrac=clip_ratio, approx_kl=ppo_kl)

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
        loss_agg: str = "token-mean",
        *,
        norm_constant: float | None = None,
        token_count: int | Tensor | None = None,
        row_count: int | Tensor | None = None,
    ) -> Tensor:
        if norm_constant is not None:
            raise ValueError("norm_constant: OpenRLHF has no seq-mean-token-sum-norm mode")
        if loss_agg not in ("token-mean", "seq-mean-token-mean"):
            raise ValueError(
                f"loss_agg: OpenRLHF's ValueLoss has token-mean and seq-mean-token-mean, got {loss_agg!r}"
            )
        loss: Tensor = self._loss.ValueLoss(clip_eps=clip_eps, token_level_loss=loss_agg == "token-mean")(
            values,
            old_values,
            returns,
            action_mask=_float_mask(mask, values),
            **loss_batch_info(token_count, row_count),
        )
        return loss


def make_adapter() -> OpenRLHFAdapter:
    """Install the import stubs, import OpenRLHF (only now) and return its adapter.

    Nothing is installed when OpenRLHF itself is missing; the stubs are removed again when an
    import fails."""
    if importlib.util.find_spec(LIBRARY) is None:
        missing = ModuleNotFoundError(f"No module named {LIBRARY!r}", name=LIBRARY)
        raise missing_library(LIBRARY, "OpenRLHF", missing)
    _openrlhf_stubs.install()
    try:
        modules = {name: import_library(LIBRARY, "OpenRLHF", name) for name in REQUIRED_MODULES}
    except AdapterLoadError:
        _openrlhf_stubs.uninstall()
        raise
    return OpenRLHFAdapter(modules)
