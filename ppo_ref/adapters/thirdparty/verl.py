"""The built-in adapter ``verl``: verl's own PPO functions under the conformance suite.

Environment: ``python tools/thirdparty_envs.py verl`` builds ``.envs/verl`` (verl 0.9.1 on CPU
torch), then ``.envs/verl/bin/python -m pytest conformance/ --impl=verl``.

Every op calls a verl function (``provenance`` names each one with its file and line, read from the
installed package). Besides the call, the adapter only converts arguments:

- masks are passed as 0/1 tensors of the data's float dtype (verl's ``response_mask``);
- ``token_logprobs`` scores ``input_ids[:, 1:]`` with ``logits[:, :-1]`` (verl rolls the ids by one
  and drops the last column: the same pairs) after scaling the logits by the temperature with
  verl's own ``_scale_logits_by_temperature`` (``verl/workers/engine/fsdp/transformer_impl.py``),
  which is what verl's engine does before it calls ``logprobs_from_logits``; the logits keep their
  dtype (verl's engine does not up-cast them);
- ``kl_penalty`` with a mask multiplies the estimate by the mask afterwards, as verl's
  ``apply_kl_penalty`` (``verl/trainer/ppo/ray_trainer.py``) does with ``response_mask``;
- ``policy_loss`` builds an ``ActorConfig`` whose ``clip_ratio`` and ``clip_ratio_low`` are
  ``clip_eps``, ``clip_ratio_high`` is ``clip_eps_high`` (or ``clip_eps``), ``clip_ratio_c`` is
  ``dual_clip`` (or verl's default 3), and whose ``global_batch_info`` holds the counts
  (``verl_family.policy_options_config``);
- the PPO-family ops come from ``verl_family.VerlFamilyOps`` (issue 14).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Mapping
from types import MappingProxyType, ModuleType

import torch
from torch import Tensor

from ppo_ref.adapters.base import OP_NAMES, LossReport
from ppo_ref.adapters.thirdparty._common import float_mask as _float_mask
from ppo_ref.adapters.thirdparty._common import import_library
from ppo_ref.adapters.thirdparty._common import library_location as _where
from ppo_ref.adapters.thirdparty.verl_family import (
    FAMILY_CONVENTION_SOURCES,
    FAMILY_CONVENTIONS,
    VerlFamilyOps,
    engine_row_count,
)

__all__ = ["CONVENTIONS", "CONVENTION_SOURCES", "NOT_PROVIDED", "VerlAdapter", "make_adapter"]

LIBRARY = "verl"
REQUIRED_MODULES = ("verl.trainer.ppo.core_algos", "verl.utils.torch_functional", "verl.workers.config")
ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"

CONVENTIONS: Mapping[str, object] = MappingProxyType(
    {
        "gae_whitening": "unbiased",
        "gae_bootstrap": "none",
        "dual_clip": 3.0,
        "log_ratio_clamp": 20.0,
        "approx_kl": "k1",
        "kl_clamp": {"k3": 10.0},
        "value_clip_modes": ["clipped"],
        "loss_aggregations": [
            "token-mean",
            "seq-mean-token-mean",
            "seq-mean-token-sum",
            "seq-mean-token-sum-norm",
        ],
        "policy_loss_options": ["clip_eps_high", "dual_clip", "counts"],
        "masked_fill": "finite",
        "edge_inputs": ["holes"],
        "call_context": "batch-token-count",
        "off_mask_outputs": ["gae", "masked_whiten"],
        **FAMILY_CONVENTIONS,
    }
)
"""verl's documented deviations from the reference conventions (sources in CONVENTION_SOURCES)."""

CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "gae_whitening": "verl/trainer/ppo/core_algos.py compute_gae_advantage_return: always ends with "
        "`advantages = verl_F.masked_whiten(advantages, response_mask)` (verl/utils/torch_functional.py "
        "masked_whiten: unbiased masked_var, rsqrt(var + 1e-8)); returns = raw advantages + values",
        "gae_bootstrap": "verl/trainer/ppo/core_algos.py compute_gae_advantage_return(token_level_rewards, "
        "values, response_mask, gamma, lam): no bootstrap argument, `nextvalues = 0` after the last column",
        "dual_clip": "verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla: `pg_losses3 = -advantages "
        "* clip_ratio_c`, applied where advantages < 0, clip_ratio_c = config.get('clip_ratio_c', 3.0); "
        "verl/workers/config/actor.py ActorConfig.clip_ratio_c = 3.0",
        "log_ratio_clamp": "verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla: "
        "`negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)` before the ratio "
        "and ppo_kl",
        "approx_kl": "verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla: "
        "`ppo_kl = verl_F.masked_mean(-negative_approx_kl, response_mask)`, i.e. mean(old - new)",
        "kl_clamp": "verl/trainer/ppo/core_algos.py kl_penalty_forward: low_var_kl/k3 is "
        "`torch.clamp(exp(kl) - kl - 1, min=-10, max=10)` (kl, abs, mse/k2 are not clamped)",
        "value_clip_modes": "verl/trainer/ppo/core_algos.py compute_value_loss(vpreds, returns, values, "
        "response_mask, cliprange_value, ...): cliprange_value is required and always applied; verl has no "
        "unclipped value loss",
        "loss_aggregations": "verl/trainer/ppo/core_algos.py agg_loss: the four modes; "
        "'seq-mean-token-sum-norm' divides by loss_scale_factor (norm_constant here), which defaults to "
        "loss_mask.shape[-1], the padded width, when the config leaves it None (verl #3741; "
        "docs/findings-family.md)",
        "policy_loss_options": "verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla reads "
        "clip_ratio_high (clip_eps_high), clip_ratio_c (dual_clip; always on, 3.0 unless given) and "
        "ActorConfig.global_batch_info (batch_num_tokens, global_batch_size, loss_scale_factor: the counts, "
        "as verl/workers/utils/losses.py ppo_loss fills them); compute_value_loss takes the same counts",
        "edge_inputs": "verl/experimental/agent_loop/tool_agent_loop.py (multi-turn with tools) merges tool "
        "responses into the response through verl/utils/tokenizer/continuous_token.py "
        "align_response_metadata: 'context tokens get mask/logprob 0', the assistant tokens after them 1: "
        "holes in response_mask",
        "masked_fill": "verl/workers/actor/dp_actor.py compute_log_prob and the critic's compute_values run "
        "forward passes over the padded responses (finite log-probs and values at pad tokens); "
        "token_level_rewards are 0 off the score (verl/trainer/ppo/ray_trainer.py apply_kl_penalty masks "
        "the KL with response_mask)",
        "call_context": "verl/workers/engine/fsdp/transformer_impl.py:729-735 forward_backward_batch sets "
        "batch_num_tokens = the global batch's loss_mask.sum() (and dp_size) for every call; "
        "verl/workers/utils/losses.py:65-68 ppo_loss copies it into config.global_batch_info, which "
        "core_algos.agg_loss divides the token sum by: the adapter passes the batch's token count "
        "when the suite gives none; verl/trainer/ppo/ray_trainer.py _update_actor / _update_critic set "
        "global_batch_size = ppo_mini_batch_size * rollout.n (the mini-batch's rows), which the adapter "
        "passes for seq-mean-token-sum-norm (the spec's B); the seq-mean modes get none, so verl counts "
        "the rows with an action token, which on verl's batches (every response has a token) is the "
        "engine's row count",
        "off_mask_outputs": "verl/trainer/ppo/core_algos.py compute_gae_advantage_return stores the "
        "carried lastgaelam at masked positions and takes returns = advantages + values everywhere; "
        "verl/utils/torch_functional.py masked_whiten transforms every entry ((x - mean) * rsqrt(var + "
        "1e-8)); the losses read them only through response_mask (docs/findings.md verl-1, verl-3)",
        **FAMILY_CONVENTION_SOURCES,
    }
)
"""Where each declared convention shows in verl's code."""

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {
        "token_rewards": "verl splits it: the reward managers place the score at "
        "valid_response_length - 1 (verl/workers/reward_manager/naive.py, needs a tokenizer and a DataProto) "
        "and apply_kl_penalty (verl/trainer/ppo/ray_trainer.py) subtracts beta * kl from those "
        "token_level_scores; no verl function maps (scores, logp, ref_logp, mask) to token rewards",
        "ppo_penalty_loss": "verl has no PPO-Penalty (adaptive-beta KL-penalised surrogate) loss",
    }
)
"""Ops of the contract this adapter does not provide, and why."""


class VerlAdapter(VerlFamilyOps):
    """Each op is a verl function; see the module docstring for the argument conversions."""

    name = LIBRARY
    conventions = CONVENTIONS
    convention_sources = CONVENTION_SOURCES

    def __init__(self, modules: Mapping[str, ModuleType], engine: ModuleType | None) -> None:
        self._core = modules["verl.trainer.ppo.core_algos"]
        self._functional = modules["verl.utils.torch_functional"]
        self._actor_config = modules["verl.workers.config"].ActorConfig
        self._engine = engine
        self.version = importlib.metadata.version("verl")
        core, functional = self._core, self._functional
        sources = {
            "entropy": _where(functional.entropy_from_logits),
            "masked_mean": _where(functional.masked_mean),
            "masked_whiten": _where(functional.masked_whiten),
            "kl_penalty": _where(core.kl_penalty) + " (estimator names k1, k2, k3 as given), times the "
            "mask afterwards as verl.trainer.ppo.ray_trainer.apply_kl_penalty does",
            "gae": _where(core.compute_gae_advantage_return),
            "policy_loss": _where(core.get_policy_loss_fn("vanilla"))
            + " via get_policy_loss_fn('vanilla'), with "
            + _where(self._actor_config),
            "value_loss": _where(core.compute_value_loss) + " (loss_agg_mode and the counts as given)",
        }
        not_provided = dict(NOT_PROVIDED)
        family, family_missing = self.family_sources()
        sources.update(family)
        not_provided.update(family_missing)
        if engine is None:
            not_provided["token_logprobs"] = f"{ENGINE_MODULE} (verl's temperature scaling) did not import"
        else:
            sources["token_logprobs"] = (
                f"{_where(functional.logprobs_from_logits)} on logits scaled by "
                f"{_where(engine._scale_logits_by_temperature)}"
            )
        sources = {op: sources[op] for op in OP_NAMES if op in sources}
        self.ops: frozenset[str] = frozenset(sources)
        self.not_provided: Mapping[str, str] = MappingProxyType(not_provided)
        self.provenance = "; ".join(
            [f"{op}: {source}" for op, source in sources.items()]
            + [f"not provided: {op} ({reason})" for op, reason in not_provided.items()]
        )

    def __repr__(self) -> str:
        return f"VerlAdapter(version={self.version!r})"

    def token_logprobs(self, logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
        if self._engine is None:
            raise RuntimeError(f"token_logprobs is not provided: {self.not_provided['token_logprobs']}")
        rows = logits.shape[0]
        per_row = torch.full((rows, 1, 1), float(temperature), dtype=torch.float32, device=logits.device)
        scaled = self._engine._scale_logits_by_temperature(
            logits, per_row, is_unit_temperature=self._engine._is_scalar_unit_temperature(temperature)
        )
        result: Tensor = self._functional.logprobs_from_logits(scaled[:, :-1], input_ids[:, 1:])
        return result

    def entropy(self, logits: Tensor) -> Tensor:
        result: Tensor = self._functional.entropy_from_logits(logits)
        return result

    def masked_mean(self, x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
        result: Tensor = self._functional.masked_mean(x, _float_mask(mask, x), axis=dim)
        return result

    def masked_whiten(self, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
        result: Tensor = self._functional.masked_whiten(x, _float_mask(mask, x), shift_mean=shift_mean)
        return result

    def kl_penalty(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        kl: Tensor = self._core.kl_penalty(logp, ref_logp, kl_penalty=estimator)
        return kl if mask is None else kl * _float_mask(mask, kl)

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
                "last_values: verl's compute_gae_advantage_return has no bootstrap input "
                "(declared gae_bootstrap='none')"
            )
        advantages, returns = self._core.compute_gae_advantage_return(
            rewards, values, _float_mask(mask, values), gamma, lam
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
        loss_fn = self._core.get_policy_loss_fn("vanilla")
        token_count = _engine_token_count(mask, loss_agg, token_count)
        row_count = engine_row_count(mask, loss_agg, row_count)
        counts = {"norm_constant": norm_constant, "token_count": token_count, "row_count": row_count}
        loss, metrics = loss_fn(
            old_log_prob=old_logp,
            log_prob=logp,
            advantages=advantages,
            response_mask=_float_mask(mask, logp),
            loss_agg_mode=loss_agg,
            config=self.policy_options_config(clip_eps, clip_eps_high, dual_clip, **counts),
        )
        return LossReport(
            loss=loss,
            clipfrac=metrics["actor/pg_clipfrac"],
            approx_kl=metrics["actor/ppo_kl"],
            extra={"clipfrac_lower": metrics["actor/pg_clipfrac_lower"]},  # verl's dual-clip share
        )

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
        if clip_eps is None:
            raise ValueError(
                "clip_eps: verl's compute_value_loss always clips (cliprange_value is required; declared "
                "value_clip_modes=['clipped'])"
            )
        loss, _clipfrac = self._core.compute_value_loss(
            vpreds=values,
            returns=returns,
            values=old_values,
            response_mask=_float_mask(mask, values),
            cliprange_value=clip_eps,
            loss_agg_mode=loss_agg,
            batch_num_tokens=_engine_token_count(mask, loss_agg, token_count),
            global_batch_size=engine_row_count(mask, loss_agg, row_count),
            loss_scale_factor=norm_constant,
        )
        result: Tensor = loss
        return result


def _engine_token_count(mask: Tensor, loss_agg: str, token_count: int | Tensor | None) -> int | Tensor | None:
    """``token_count``, or for a token mean without one the batch's action-token count: what verl's
    engine passes every loss (declared ``call_context='batch-token-count'``)."""
    if token_count is None and loss_agg == "token-mean":
        return int((mask != 0).sum())
    return token_count


def make_adapter() -> VerlAdapter:
    """Import verl (only now) and return its adapter; a clear error if verl is not installed."""
    modules = {name: import_library(LIBRARY, "verl", name) for name in REQUIRED_MODULES}
    try:
        with warnings.catch_warnings():  # it warns about every GPU engine it cannot load on a CPU
            warnings.simplefilter("ignore")
            engine: ModuleType | None = importlib.import_module(ENGINE_MODULE)
    except ImportError:
        engine = None
    return VerlAdapter(modules, engine)
