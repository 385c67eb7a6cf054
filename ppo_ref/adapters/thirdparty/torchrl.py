"""``--impl=torchrl``: TorchRL 0.14.1, driven the way a TorchRL user drives it.

- ``gae``: ``torchrl.objectives.value.functional.generalized_advantage_estimate`` on ``[B, T, 1]``
  tensors (time dim -2). TorchRL has no mask: a row's episode ends at its last action token
  (``done``; ``terminated`` too unless ``last_values`` is given, then ``next_state_value`` there is
  the bootstrap value), and every padded step after it is its own ended step. ``next_state_value`` is
  the next position's value (TorchRL's ``("next", "state_value")``); holes cannot be expressed and
  stay ordinary steps. Outputs at positions that are not action tokens (steps a TorchRL user would
  discard) are set to 0; no action-token value is touched.
- ``policy_loss``, ``value_loss``: ``torchrl.objectives.ClipPPOLoss.forward`` on a ``TensorDict``
  of batch ``[B, T]``. The mask goes where TorchRL's own padded batches carry it,
  ``("collector", "mask")`` (read by ``loss_mask_key="auto"``). The actor is a
  ``ProbabilisticTensorDictModule`` whose distribution's ``log_prob`` returns the given per-token
  log-probs (a stand-in for an LLM policy's token distribution); the critic writes the given values
  to ``"state_value"``, whose input entry holds the old values, as after a rollout.
- ``kl_penalty``: ``torchrl.envs.llm.transforms.kl.KLComputation`` (``gen - ref``, k1), after
  masking both log-probs with ``masked_fill(~mask, 0.0)`` as ``RetrieveLogProb`` does for
  non-assistant tokens.

Build the environment with ``python tools/thirdparty_envs.py torchrl``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.thirdparty._common import import_library
from ppo_ref.adapters.thirdparty._inline import LibraryPolicyLoss
from ppo_ref.kl import last_action_index

__all__ = ["TorchRLAdapter", "make_adapter"]

REQUIRES = "TorchRL 0.14.1"
"""What the adapter needs (named in the error when it cannot be imported)."""
POLICY_LOG_PROB = "policy_log_prob"
CURRENT_VALUE = "current_value"
_FEATURE_KEYS = frozenset({"advantage", "state_value", "value_target", CURRENT_VALUE})
"""Entries TorchRL expects with a trailing feature dimension of 1 ([B, T, 1])."""

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {
        "token_logprobs": "no standalone function: an LLM wrapper's log-probs come from its model call",
        "entropy": "ClipPPOLoss takes the entropy from the distribution object, not from given logits",
        "masked_mean": "no public masked-mean function (LossModule._reduce_loss is private)",
        "masked_whiten": "ClipPPOLoss(normalize_advantage=True) standardises inside the loss "
        "(biased std clamped at 1e-4), not as a callable",
        "token_rewards": "KLComputation subtracts coeff * kl from a caller-given per-token reward; "
        "where the score goes is left to the caller (the legacy KLRewardTransform expands it over every "
        "token and needs an LLM reference-model wrapper inside an env)",
        "ppo_penalty_loss": "KLPENPPOLoss estimates KL(old || new) from the distribution objects "
        "(samples_mc_kl), not from given per-token log-probs",
    }
)


class _GivenLogProb(torch.distributions.Distribution):
    """A distribution whose ``log_prob`` of the taken action is the given per-token log-prob."""

    arg_constraints: dict[str, Any] = {}  # noqa: RUF012 (torch.distributions API)
    has_rsample = False

    def __init__(self, given: Tensor) -> None:
        self.given = given
        super().__init__(batch_shape=given.shape, validate_args=False)

    def log_prob(self, value: Tensor) -> Tensor:
        return self.given


class TorchRLAdapter:
    """TorchRL 0.14.1; see the module docstring for how each op reaches TorchRL's code."""

    name = "torchrl"
    ops: frozenset[str] = frozenset({"gae", "policy_loss", "value_loss", "kl_penalty"})
    conventions: Mapping[str, object] = MappingProxyType(
        {
            "clipfrac": "ratio-outside",
            "approx_kl": "k1",
            "loss_aggregations": ("token-mean",),
            "value_loss_scale": 1.0,
            "reward_kl_estimators": ("k1",),
            "policy_loss_options": (),
            "masked_fill": "finite",
            "prefix_masks": ("gae",),
            "compute_dtype": {"gae": "float32"},
        }
    )
    convention_sources: Mapping[str, str] = MappingProxyType(
        {
            "clipfrac": "clip_fraction = (log_weight_clip != log_weight).mean(): the log-ratio outside "
            "[log1p(-eps), log1p(eps)], torchrl/objectives/ppo.py ClipPPOLoss.forward",
            "approx_kl": "kl_approx = (prox_log_prob - log_prob).mean() = mean(old - new), "
            "torchrl/objectives/ppo.py PPOLoss._log_weight and ClipPPOLoss.forward",
            "loss_aggregations": "loss_objective reduced by LossModule._reduce_loss: reduction 'mean' over "
            "the masked-in positions (torchrl/objectives/common.py); 'sum' is not a spec mode",
            "value_loss_scale": "loss_critic = critic_coeff * distance_loss(value_target, state_value, 'l2') "
            "= F.mse_loss without 1/2 (torchrl/objectives/utils.py distance_loss, "
            "torchrl/objectives/ppo.py PPOLoss.loss_critic); the adapter sets loss_critic_type='l2', "
            "critic_coeff=1 (the default 'smooth_l1' is a Huber loss)",
            "reward_kl_estimators": "kl = gen_lp - ref_lp only, torchrl/envs/llm/transforms/kl.py "
            "KLComputation._step",
            "policy_loss_options": "torchrl/objectives/ppo.py ClipPPOLoss(clip_epsilon=...): this adapter "
            "predates CLIP-1..3 and AGG-1..3 and wires none of clip_eps_high, dual_clip, norm_constant, "
            "token_count, row_count: not provided",
            "masked_fill": "a collector's steps after a done flag are the next episode's real, finite "
            "transitions (torchrl/collectors); the value and loss inputs there come from forward passes",
            "prefix_masks": "torchrl/objectives/value/functional.py:120 generalized_advantage_estimate("
            "gamma, lmbda, state_value, next_state_value, reward, done, terminated) takes no mask: only "
            "done/terminated flags, so a step inside an episode cannot be skipped (no holes)",
            "compute_dtype": "torchrl/objectives/value/functional.py generalized_advantage_estimate: "
            "`not_done = (~done).int()` and `discount = lmbda * gamma * not_done` make the discount a "
            "float32 tensor whatever the inputs' dtype, so float64 inputs get gamma * lambda rounded to "
            "float32 (lambda 0.8: 1.5e-7 off after 12 steps; float32 inputs are exact)",
        }
    )
    not_provided: Mapping[str, str] = NOT_PROVIDED

    def __init__(self) -> None:
        self._functional = import_library("torchrl", REQUIRES, "torchrl.objectives.value.functional")
        self._objectives = import_library("torchrl", REQUIRES, "torchrl.objectives")
        self._kl = import_library("torchrl", REQUIRES, "torchrl.envs.llm.transforms.kl")
        self._tensordict = import_library("torchrl", REQUIRES, "tensordict")
        self._tensordict_nn = import_library("torchrl", REQUIRES, "tensordict.nn")
        self.version: str = importlib.metadata.version("torchrl")
        self.provenance: str = (
            f"TorchRL {self.version} (tensordict {importlib.metadata.version('tensordict')}). gae: "
            "torchrl.objectives.value.functional.generalized_advantage_estimate "
            "(torchrl/objectives/value/functional.py) on [B, T, 1] tensors; done = at and after each row's "
            "last action token, terminated = done except at the last action token when last_values is "
            "given; next_state_value = next position's value, last_values (or 0) at the last action token; "
            "holes are ordinary steps (not expressible); outputs off the mask set to 0. policy_loss, "
            "value_loss: torchrl.objectives.ClipPPOLoss(actor, critic, clip_epsilon, entropy_bonus=False, "
            "loss_critic_type='l2', critic_coeff=1, clip_value, log_explained_variance=False).forward "
            "(torchrl/objectives/ppo.py) on a "
            "TensorDict [B, T] with the mask in ('collector', 'mask'); loss = loss_objective / loss_critic, "
            "clipfrac = ratio_outside_frac = clip_fraction, approx_kl = kl_approx, ratio_mean = mean_ratio, "
            "ratio_max = max_ratio. kl_penalty: torchrl.envs.llm.transforms.kl.KLComputation("
            "add_to_reward=False) (torchrl/envs/llm/transforms/kl.py) on log-probs masked with "
            "masked_fill(~mask, 0.0). Not provided: "
            + "; ".join(f"{op} ({why})" for op, why in NOT_PROVIDED.items())
        )

    def __repr__(self) -> str:
        return f"TorchRLAdapter(version={self.version!r})"

    def gae(
        self,
        rewards: Tensor,
        values: Tensor,
        mask: Tensor,
        gamma: float,
        lam: float,
        last_values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        keep = mask != 0
        rows, steps = keep.shape
        last = last_action_index(keep).unsqueeze(1)
        columns = torch.arange(steps).expand(rows, steps)
        at_last, after_last = columns == last, columns > last
        done = at_last | after_last
        terminated = done.clone() if last_values is None else after_last
        bootstrap = torch.zeros(rows, dtype=values.dtype) if last_values is None else last_values
        shifted = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
        next_values = torch.where(at_last, bootstrap.to(values.dtype).unsqueeze(1), shifted)
        advantages, returns = self._functional.generalized_advantage_estimate(
            gamma,
            lam,
            values.unsqueeze(-1),
            next_values.unsqueeze(-1),
            rewards.unsqueeze(-1),
            done.unsqueeze(-1),
            terminated.unsqueeze(-1),
        )
        zero = torch.zeros((), dtype=advantages.dtype)
        return torch.where(keep, advantages.squeeze(-1), zero), torch.where(keep, returns.squeeze(-1), zero)

    def _loss_module(self, clip_eps: float, value_clip: float | None) -> Any:
        nn = self._tensordict_nn
        actor = nn.ProbabilisticTensorDictSequential(
            nn.ProbabilisticTensorDictModule(
                in_keys={"given": POLICY_LOG_PROB}, out_keys=["action"], distribution_class=_GivenLogProb
            )
        )
        critic = nn.TensorDictModule(torch.nn.Identity(), in_keys=[CURRENT_VALUE], out_keys=["state_value"])
        return self._objectives.ClipPPOLoss(
            actor,
            critic,
            clip_epsilon=clip_eps,
            entropy_bonus=False,
            loss_critic_type="l2",
            critic_coeff=1.0,
            clip_value=value_clip,
            log_explained_variance=False,
        )

    def _forward(self, clip_eps: float, value_clip: float | None, **entries: Tensor) -> Any:
        mask = entries.pop("mask") != 0
        shape = tuple(mask.shape)
        columns: dict[object, Tensor] = {
            "action": torch.zeros(shape),
            ("collector", "mask"): mask,
            **{key: value.unsqueeze(-1) if key in _FEATURE_KEYS else value for key, value in entries.items()},
        }
        batch = self._tensordict.TensorDict(columns, batch_size=shape)
        return self._loss_module(clip_eps, value_clip)(batch)

    def policy_loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip_eps: float,
        loss_agg: str = "token-mean",
    ) -> LibraryPolicyLoss:
        if loss_agg != "token-mean":
            raise ValueError(f"loss_agg: ClipPPOLoss reduces with a masked mean, got {loss_agg!r}")
        zeros = torch.zeros_like(old_logp)
        out = self._forward(
            clip_eps,
            None,
            mask=mask,
            advantage=advantages,
            action_log_prob=old_logp,
            **{POLICY_LOG_PROB: logp},
            state_value=zeros,
            value_target=zeros,
            **{CURRENT_VALUE: zeros},
        )
        clip_fraction = out["clip_fraction"]
        return LibraryPolicyLoss(
            out["loss_objective"],
            clip_fraction,
            out["kl_approx"],
            ratio_outside_frac=clip_fraction,
            ratio_mean=out["mean_ratio"],
            ratio_max=out["max_ratio"],
        )

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
    ) -> Tensor:
        zeros = torch.zeros_like(old_values)
        out = self._forward(
            0.2,
            clip_eps,
            mask=mask,
            advantage=zeros,
            action_log_prob=zeros,
            **{POLICY_LOG_PROB: zeros},
            state_value=old_values,
            value_target=returns,
            **{CURRENT_VALUE: values},
        )
        loss: Tensor = out["loss_critic"]
        return loss

    def kl_penalty(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        if estimator != "k1":
            raise ValueError(f"estimator: TorchRL's KLComputation computes k1 (gen - ref), got {estimator!r}")
        if mask is not None:
            keep = mask != 0
            logp, ref_logp = torch.masked_fill(logp, ~keep, 0.0), torch.masked_fill(ref_logp, ~keep, 0.0)
        batch = self._tensordict.TensorDict(
            {("log_probs", "full"): logp, ("ref_log_probs", "full"): ref_logp}, batch_size=[logp.shape[0]]
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype")
            kl = self._kl.KLComputation(add_to_reward=False)(batch).get("kl_penalty")
        if getattr(kl, "is_nested", False):
            kl = torch.stack(list(kl.unbind())) if logp.shape[0] else torch.zeros_like(logp)
        result: Tensor = kl
        return result


def make_adapter() -> TorchRLAdapter:
    """The ``torchrl`` adapter (imports TorchRL; AdapterLoadError naming the env command if missing)."""
    return TorchRLAdapter()
