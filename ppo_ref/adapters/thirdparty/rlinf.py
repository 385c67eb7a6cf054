"""``--impl=rlinf``: RLinf 0.3.0's PPO/GRPO math (``rlinf.algorithms``), called as its FSDP actor calls it.

- ``gae``: ``rlinf.algorithms.advantages.compute_gae_advantages_and_returns`` on time-major tensors
  (rewards ``[T, B]``, values ``[T + 1, B]``, dones ``[T + 1, B]``), ``normalize_advantages=False``.
  It takes no mask, only done flags: a row's episode ends at its last action token
  (``dones[t + 1]`` at and after it), as ``preprocess_reasoning_advantages_inputs`` ends every
  episode at the last position (``dones[-1] = True``, values padded with one 0 column): the
  reasoning pipeline never bootstraps (``gae_bootstrap: none``) and holes cannot be expressed.
- ``policy_loss``: ``rlinf.algorithms.losses.compute_ppo_actor_loss`` with ``loss_mask`` (bool) and
  ``loss_agg_func = get_loss_agg_func(loss_agg)``, the arguments ``FSDPActor`` passes
  (``rlinf/workers/actor/fsdp_actor_worker.py:786``); clipfrac = ``actor/clip_fraction``,
  approx_kl = ``actor/approx_kl``.
- ``value_loss``: ``compute_ppo_critic_loss`` with ``huber_delta=10000`` (what
  ``rlinf/workers/critic/megatron_critic_worker.py:93`` passes: 0.5 e^2 below it).
- ``kl_penalty``: ``rlinf.algorithms.utils.kl_penalty``, then 0 off the mask (``torch.where``).
- ``masked_mean``: ``rlinf.utils.utils.masked_mean`` with a bool mask; ``masked_whiten``:
  ``rlinf.algorithms.utils.safe_normalize`` (shift-mean only).
- ``group_advantages``: ``compute_grpo_advantages`` called once per group (``group_size`` = its
  size; rlinf's batch is ``[num_groups * group_size]`` in group order, ``rewards.view(-1,
  group_size)``, advantages.py:107).
- ``aggregate_loss``: ``get_loss_agg_func(loss_agg)(per_token, mask)``.

Build the environment with ``python tools/thirdparty_envs.py rlinf``.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import Tensor

from ppo_ref.adapters.thirdparty._common import import_library, library_location
from ppo_ref.adapters.thirdparty._inline import LibraryPolicyLoss
from ppo_ref.kl import last_action_index

__all__ = ["RlinfAdapter", "make_adapter"]

REQUIRES = "RLinf 0.3.0"
"""What the adapter needs (named in the error when it cannot be imported)."""

HUBER_DELTA = 10000.0
"""The critic's Huber delta (rlinf/workers/critic/megatron_critic_worker.py:93)."""

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
"""rlinf/utils/utils.py:345 get_loss_agg_func: the three it knows."""

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {
        "token_logprobs": "compute_logprobs_from_logits: the reasoning actor's default op_type is "
        "flash_attn (fsdp_actor_worker.py:204), which needs flash-attn (CUDA); not wired here",
        "entropy": "compute_entropy_from_logits runs in the logits' dtype after the model's forward; "
        "not wired here (issue 28: left for later)",
        "token_rewards": "preprocess_reasoning_advantages_inputs puts the score at the last column of "
        "the padded width, inside calculate_adv_and_returns; no standalone function",
        "ppo_penalty_loss": "no KL-penalty PPO loss",
        "gspo_loss": "no GSPO loss in 0.3.0",
        "cispo_loss": "no CISPO loss in 0.3.0",
        "kl_loss": "no KL-loss function: kl_penalty enters the REINFORCE++ rewards only",
        "rollout_correction": "importance_sampling_fix multiplies the advantages inline "
        "(fsdp_actor_worker.py:773-784), no callable",
    }
)

_A = "rlinf/algorithms/advantages.py"
_L = "rlinf/algorithms/losses.py"
_U = "rlinf/algorithms/utils.py"
_UU = "rlinf/utils/utils.py"


class RlinfAdapter:
    """RLinf 0.3.0; see the module docstring for how each op reaches RLinf's code."""

    name = "rlinf"
    ops: frozenset[str] = frozenset(
        {
            "masked_mean",
            "masked_whiten",
            "kl_penalty",
            "gae",
            "policy_loss",
            "value_loss",
            "group_advantages",
            "aggregate_loss",
        }
    )
    conventions: Mapping[str, object] = MappingProxyType(
        {
            "approx_kl": "k1",
            "whiten_eps": 1e-5,
            "whiten_eps_placement": "outside-sqrt",
            "whiten_modes": ("shift-mean",),
            "kl_clamp": {"k3": 10.0},
            "gae_bootstrap": "none",
            "prefix_masks": ("gae",),
            "loss_aggregations": AGGREGATIONS,
            "policy_loss_options": ("clip_eps_high", "dual_clip"),
            "value_clip_modes": ("clipped",),
            "group_methods": ("grpo",),
            "group_std_scopes": ("group",),
            "group_std_eps": 1e-6,
            "group_singleton": "unguarded",
            "constant_groups": "rounding",
            "compute_dtype": {"policy_loss": "float32"},
            "off_mask_outputs": ("masked_whiten",),
            "masked_fill": "finite",
        }
    )
    convention_sources: Mapping[str, str] = MappingProxyType(
        {
            "approx_kl": f"{_L}:247,275 approx_kl = -sum(where(mask, logp - old_logp, 0)) / n "
            "= mean(old - new)",
            "whiten_eps": f"{_U}:396 (array - mean) / (std + 1e-5) in safe_normalize",
            "whiten_eps_placement": f"{_U}:396 the epsilon is added to the std, outside the sqrt",
            "whiten_modes": f"{_U}:391 safe_normalize always shifts the mean",
            "kl_clamp": f"{_U}:52-58 low_var_kl/k3: log-ratio clamped to [-20, 20], estimate to [-10, 10]",
            "gae_bootstrap": f"{_U}:225-255 preprocess_reasoning_advantages_inputs pads values with 0 and "
            "sets dones[-1] = True: no bootstrap value",
            "prefix_masks": f"{_A}:25 compute_gae_advantages_and_returns takes dones, not a mask "
            "(loss_mask only for the normalisation): a step inside an episode cannot be skipped",
            "loss_aggregations": f"{_UU}:345-368 get_loss_agg_func: token-mean, seq-mean-token-mean, "
            "seq-mean-token-sum (no -norm)",
            "policy_loss_options": f"{_L}:167 compute_ppo_actor_loss(clip_ratio_low, clip_ratio_high, "
            "clip_ratio_c): no whole-batch counts (each micro-batch reduced by loss_agg_func)",
            "value_clip_modes": f"{_L}:347 value_clip is required: prev_values + clamp(values - "
            "prev_values, -value_clip, value_clip) always",
            "group_methods": f"{_A}:90 compute_grpo_advantages (grpo); reinpp/raw are other estimators",
            "group_std_scopes": f"{_A}:112 grouped_rewards.std(dim=-1): the group's std only",
            "group_std_eps": f"{_A}:117 advantages / (grouped_reward_std + 1e-6)",
            "group_singleton": f"{_A}:112 torch.std of one score is NaN (n - 1 = 0): a group of one gets NaN",
            "constant_groups": f"{_A}:116 grouped_rewards - mean: the float mean's rounding stays",
            "compute_dtype": f"{_L}:229-237 asserts logprobs, old_logprobs, advantages are float32",
            "off_mask_outputs": f"{_U}:396 safe_normalize normalises every entry, masked-out ones too",
            "masked_fill": "fsdp_actor_worker.py forward_batch: log-probs and values off the response "
            "mask come from the model's forward (finite)",
        }
    )
    not_provided: Mapping[str, str] = NOT_PROVIDED

    def __init__(self) -> None:
        self._adv = import_library("rlinf", REQUIRES, "rlinf.algorithms.advantages")
        self._losses = import_library("rlinf", REQUIRES, "rlinf.algorithms.losses")
        self._autils = import_library("rlinf", REQUIRES, "rlinf.algorithms.utils")
        self._utils = import_library("rlinf", REQUIRES, "rlinf.utils.utils")
        self.version: str = importlib.metadata.version("rlinf")
        where = library_location
        self.provenance: str = (
            f"RLinf {self.version}. gae: {where(self._adv.compute_gae_advantages_and_returns)} "
            "time-major, dones at and after each row's last action token, normalize_advantages=False, "
            "outputs off the mask 0; policy_loss: "
            f"{where(self._losses.compute_ppo_actor_loss)} with loss_agg_func=get_loss_agg_func(loss_agg); "
            f"value_loss: {where(self._losses.compute_ppo_critic_loss)} huber_delta={HUBER_DELTA:g}; "
            f"kl_penalty: {where(self._autils.kl_penalty)}; masked_mean: {where(self._utils.masked_mean)}; "
            f"masked_whiten: {where(self._autils.safe_normalize)}; group_advantages: "
            f"{where(self._adv.compute_grpo_advantages)} per group; aggregate_loss: "
            f"{where(self._utils.get_loss_agg_func)}. Not provided: "
            + "; ".join(f"{op} ({why})" for op, why in NOT_PROVIDED.items())
        )

    def __repr__(self) -> str:
        return f"RlinfAdapter(version={self.version!r})"

    def masked_mean(self, x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
        out: Tensor = self._utils.masked_mean(x, mask.bool(), axis=dim)
        return out

    def masked_whiten(self, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
        if not shift_mean:
            raise ValueError("shift_mean: rlinf's safe_normalize always shifts the mean")
        out: Tensor = self._autils.safe_normalize(x, mask.bool())
        return out

    def kl_penalty(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        if estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"estimator: expected k1, k2 or k3, got {estimator!r}")
        kl: Tensor = self._autils.kl_penalty(logp, ref_logp, kl_penalty=estimator)
        return kl if mask is None else torch.where(mask.bool(), kl, torch.zeros((), dtype=kl.dtype))

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
            raise ValueError("last_values: rlinf's reasoning GAE never bootstraps (dones[-1] = True)")
        keep = mask != 0
        rows, steps = keep.shape
        last = last_action_index(keep).unsqueeze(1)
        columns = torch.arange(steps).expand(rows, steps)
        ended = columns >= last  # done after this step: at and after the last action token
        dones = torch.zeros(steps + 1, rows, dtype=torch.bool)
        dones[1:] = ended.T
        padded_values = torch.cat([values, torch.zeros(rows, 1, dtype=values.dtype)], dim=1)
        advantages, returns = self._adv.compute_gae_advantages_and_returns(
            rewards=rewards.T,
            gamma=gamma,
            gae_lambda=lam,
            values=padded_values.T,
            normalize_advantages=False,
            dones=dones,
        )
        zero = torch.zeros((), dtype=advantages.dtype)
        return torch.where(keep, advantages.T, zero), torch.where(keep, returns.T, zero)

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
    ) -> LibraryPolicyLoss:
        if loss_agg not in AGGREGATIONS:
            raise ValueError(f"loss_agg: expected one of {AGGREGATIONS}, got {loss_agg!r}")
        # float32, as the actor's log-probs reach it (compute_logprobs_from_logits ends in .float(),
        # rlinf/utils/utils.py:477); compute_ppo_actor_loss asserts it (losses.py:229-237).
        loss, metrics = self._losses.compute_ppo_actor_loss(
            logprobs=logp.float(),
            old_logprobs=old_logp.float(),
            clip_ratio_low=clip_eps,
            clip_ratio_high=clip_eps if clip_eps_high is None else clip_eps_high,
            advantages=advantages.float(),
            loss_mask=mask.bool(),
            clip_ratio_c=dual_clip,
            loss_agg_func=self._utils.get_loss_agg_func(loss_agg),
        )
        return LibraryPolicyLoss(loss, metrics["actor/clip_fraction"], metrics["actor/approx_kl"])

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
    ) -> Tensor:
        if clip_eps is None:
            raise ValueError("clip_eps: rlinf's compute_ppo_critic_loss always clips (value_clip)")
        loss: Tensor
        loss, _metrics = self._losses.compute_ppo_critic_loss(
            values=values,
            returns=returns,
            prev_values=old_values,
            value_clip=clip_eps,
            huber_delta=HUBER_DELTA,
            loss_mask=mask.bool(),
        )
        return loss

    def group_advantages(
        self,
        scores: Tensor,
        group_ids: Tensor,
        method: str = "grpo",
        *,
        std_scope: str = "group",
        eps: float = 1e-6,
        singleton: str = "zero",
    ) -> Tensor:
        if method != "grpo" or std_scope != "group":
            raise ValueError(
                f"method/std_scope: rlinf has grpo with the group's std, got {method!r}, {std_scope!r}"
            )
        out = torch.empty_like(scores)
        for gid in torch.unique(group_ids):
            rows = (group_ids == gid).nonzero().squeeze(1)
            adv, _ = self._adv.compute_grpo_advantages(
                rewards=scores[rows],
                loss_mask=torch.ones(1, len(rows), dtype=scores.dtype),
                group_size=len(rows),
            )
            out[rows] = adv.reshape(-1)
        return out

    def aggregate_loss(self, per_token: Tensor, mask: Tensor, loss_agg: str = "token-mean") -> Tensor:
        if loss_agg not in AGGREGATIONS:
            raise ValueError(f"loss_agg: expected one of {AGGREGATIONS}, got {loss_agg!r}")
        out: Tensor = self._utils.get_loss_agg_func(loss_agg)(per_token, mask.bool())
        return out


def make_adapter() -> RlinfAdapter:
    """The ``rlinf`` adapter (imports RLinf; AdapterLoadError naming the env command if missing)."""
    return RlinfAdapter()
