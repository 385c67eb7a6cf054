"""``--impl=sb3``: Stable-Baselines3 2.9.2, driven the way its PPO drives it.

- ``gae``: ``stable_baselines3.common.buffers.RolloutBuffer.compute_returns_and_advantage`` on a
  buffer with ``buffer_size = T`` steps and ``n_envs = B`` (numpy ``[n_steps, n_envs]``: time-major,
  so the contract's ``[B, T]`` tensors are transposed). A row's episode ends at its last action token:
  ``episode_starts`` is 1 on the step after it, ``dones`` is 1 for rows that end before or at the last
  column (0 for a truncated row that fills it, which bootstraps from ``last_values``). A truncated row
  that ends earlier is bootstrapped the way SB3's rollout loop does it for a time limit: the exact
  lines of ``OnPolicyAlgorithm.collect_rollouts`` that add ``gamma * V(terminal_obs)`` to that step's
  reward run first (``V(terminal_obs)`` = ``last_values[b]``). Holes cannot be expressed (every step
  of an env is an agent step) and stay ordinary steps; padded steps are the next episode's steps.
  The buffer arrays take the inputs' float dtype (SB3's own rollouts store float32). Outputs at
  positions that are not action tokens are set to 0; no action-token value is touched.
- ``policy_loss``, ``value_loss``: inline in ``PPO.train``; the exact installed lines run (pinned by
  content, :mod:`._inline`) on the action tokens only, flattened as ``RolloutBuffer.get`` flattens
  transitions (SB3 minibatches are flat transitions, so there is no padding to mask), with
  ``normalize_advantage=False`` (advantages as given; SB3's default normalises them per minibatch).

Build the environment with ``python tools/thirdparty_envs.py sb3``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping
from types import MappingProxyType, SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ppo_ref.adapters.thirdparty._common import import_library
from ppo_ref.adapters.thirdparty._inline import (
    InlineBlock,
    InlineSourceError,
    LibraryPolicyLoss,
    LocatedBlock,
    locate,
)
from ppo_ref.kl import last_action_index

__all__ = ["BLOCKS", "SB3Adapter", "make_adapter"]

REQUIRES = "stable-baselines3 2.9.2"
"""What the adapter needs (named in the error when it cannot be imported)."""
PPO_TRAIN = ("stable_baselines3.ppo.ppo", "PPO.train")

BLOCKS: Mapping[str, InlineBlock] = MappingProxyType(
    {
        "policy_loss": InlineBlock(
            *PPO_TRAIN,
            "ratio = th.exp(log_prob - rollout_data.old_log_prob)",
            "clip_fractions.append(clip_fraction)",
            "5c739ab7c6f0c2a5",
        ),
        "approx_kl": InlineBlock(
            *PPO_TRAIN,
            "log_ratio = log_prob - rollout_data.old_log_prob",
            "approx_kl_div = th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()",
            "e2cda629dd7c6d18",
        ),
        "value_loss": InlineBlock(
            *PPO_TRAIN,
            "if self.clip_range_vf is None:",
            "value_loss = F.mse_loss(rollout_data.returns, values_pred)",
            "39c93fb5df2d9cbc",
        ),
        "timeout_bootstrap": InlineBlock(
            "stable_baselines3.common.on_policy_algorithm",
            "OnPolicyAlgorithm.collect_rollouts",
            "for idx, done in enumerate(dones):",
            "rewards[idx] += self.gamma * terminal_value",
            "875ce56f7e271a2e",
        ),
    }
)
"""The lines of SB3's own methods each inline step runs (first line, last line, digest)."""

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {
        "token_logprobs": "SB3 takes log-probs from its policy's distribution (evaluate_actions), no logits "
        "function",
        "entropy": "from the policy's distribution object, not from given logits",
        "masked_mean": "SB3 has no masks (flat transitions)",
        "masked_whiten": "advantage normalisation is inline in PPO.train, per minibatch, (A - mean) / "
        "(std + 1e-8) without a mask",
        "kl_penalty": "SB3 has no KL-to-reference penalty",
        "token_rewards": "SB3 has no KL-shaped rewards",
        "ppo_penalty_loss": "SB3's PPO is the clipped variant only",
    }
)


class _ValuePolicy:
    """The two policy methods SB3's time-limit lines call; the 'observation' is the bootstrap value."""

    def obs_to_tensor(self, observation: Tensor) -> tuple[Tensor, bool]:
        return observation.reshape(1), True

    def predict_values(self, observation: Tensor) -> Tensor:
        return observation.reshape(1, 1)


class SB3Adapter:
    """Stable-Baselines3 2.9.2; see the module docstring for how each op reaches SB3's code."""

    name = "sb3"
    ops: frozenset[str] = frozenset({"gae", "policy_loss", "value_loss"})
    conventions: Mapping[str, object] = MappingProxyType(
        {
            "clipfrac": "ratio-outside",
            "loss_aggregations": ("token-mean",),
            "value_loss_scale": 1.0,
            "value_clip_form": "clipped-only",
            "policy_loss_options": (),
            "masked_fill": "finite",
            "prefix_masks": ("gae",),
        }
    )
    not_provided: Mapping[str, str] = NOT_PROVIDED

    def __init__(self) -> None:
        self._buffers = import_library("sb3", REQUIRES, "stable_baselines3.common.buffers")
        self._spaces = import_library("sb3", REQUIRES, "gymnasium.spaces")
        import_library("sb3", REQUIRES, PPO_TRAIN[0])
        self.version: str = importlib.metadata.version("stable-baselines3")
        self._located: dict[str, LocatedBlock] = {}
        self._errors: dict[str, str] = {}
        for key, block in BLOCKS.items():
            try:
                self._located[key] = locate(block)
            except InlineSourceError as error:
                self._errors[key] = str(error)
        self.convention_sources: Mapping[str, str] = MappingProxyType(
            {
                "clipfrac": "clip_fraction = th.mean((th.abs(ratio - 1) > clip_range).float()), "
                f"PPO.train, {self._where('policy_loss')}",
                "loss_aggregations": "policy_loss = -th.min(policy_loss_1, policy_loss_2).mean() over the "
                f"minibatch's transitions, PPO.train, {self._where('policy_loss')}",
                "value_loss_scale": "value_loss = F.mse_loss(rollout_data.returns, values_pred) (no 1/2), "
                f"PPO.train, {self._where('value_loss')}",
                "value_clip_form": "values_pred = old_values + th.clamp(values - old_values, "
                "-clip_range_vf, clip_range_vf), the clipped prediction only (no max), PPO.train, "
                f"{self._where('value_loss')}",
                "policy_loss_options": "PPO.train has one symmetric clip_range, no dual clip and no "
                f"whole-batch counts (the minibatch mean): {self._where('policy_loss')}",
                "masked_fill": "the RolloutBuffer holds real transitions only: the steps after an episode "
                "end are the next episode's finite rewards and values (stable_baselines3/common/"
                "buffers.py RolloutBuffer.add)",
                "prefix_masks": "stable_baselines3/common/buffers.py:403 RolloutBuffer."
                "compute_returns_and_advantage(last_values, dones) reads episode_starts only, no mask: a "
                "step inside an episode cannot be skipped (no holes)",
            }
        )
        blocks = "; ".join(f"{key} = {self._where(key)}" for key in BLOCKS)
        self.provenance: str = (
            f"stable-baselines3 {self.version}. gae: stable_baselines3.common.buffers.RolloutBuffer."
            "compute_returns_and_advantage(last_values, dones) (stable_baselines3/common/buffers.py) on "
            "[T, B] arrays of the inputs' dtype; episode_starts = 1 after each row's last action token; "
            "a truncated row ending before the last column gets the time-limit bootstrap of "
            "OnPolicyAlgorithm.collect_rollouts (timeout_bootstrap lines, run as installed); holes are "
            "ordinary steps (not expressible); outputs off the mask set to 0. policy_loss (policy_loss + "
            "approx_kl lines) and value_loss (value_loss lines): inline in stable_baselines3.ppo.ppo.PPO."
            "train, the exact installed lines run by ppo_ref.adapters.thirdparty._inline on the action "
            f"tokens, flattened like RolloutBuffer.get, normalize_advantage=False: {blocks}. clipfrac = "
            "ratio_outside_frac = clip_fraction. Not provided: "
            + "; ".join(f"{op} ({why})" for op, why in NOT_PROVIDED.items())
        )

    def __repr__(self) -> str:
        return f"SB3Adapter(version={self.version!r})"

    def _where(self, key: str) -> str:
        located = self._located.get(key)
        return f"NOT FOUND ({self._errors[key]})" if located is None else located.where()

    def _run(self, key: str, /, **bindings: Any) -> dict[str, Any]:
        located = self._located.get(key)
        if located is None:
            raise InlineSourceError(self._errors[key])
        return located.run(**bindings)

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
        envs, steps = keep.shape
        dtype = torch.promote_types(rewards.dtype, values.dtype)
        numpy_dtype = torch.empty((), dtype=dtype).numpy().dtype
        if steps == 0 or envs == 0:
            return torch.zeros(keep.shape, dtype=dtype), torch.zeros(keep.shape, dtype=dtype)
        last = last_action_index(keep).tolist()
        buffer = self._buffers.RolloutBuffer(
            steps, self._spaces.Discrete(2), self._spaces.Discrete(2), "cpu", lam, gamma, envs
        )
        buffer.rewards = rewards.detach().to(dtype).T.contiguous().numpy().copy()
        buffer.values = values.detach().to(dtype).T.contiguous().numpy().copy()
        buffer.advantages = np.zeros((steps, envs), dtype=numpy_dtype)
        buffer.episode_starts = np.zeros((steps, envs), dtype=numpy_dtype)
        for env, end in enumerate(last):
            if 0 <= end < steps - 1:
                buffer.episode_starts[end + 1, env] = 1.0
        bootstrap = np.zeros(envs, dtype=numpy_dtype)
        if last_values is not None:
            bootstrap = last_values.detach().to(dtype).numpy().copy()
            for step in sorted({end for end in last if 0 <= end < steps - 1}):
                truncated = np.array([end == step for end in last])
                self._run(
                    "timeout_bootstrap",
                    dones=truncated,
                    infos=[
                        {"terminal_observation": torch.tensor(bootstrap[env]), "TimeLimit.truncated": True}
                        for env in range(envs)
                    ],
                    self=SimpleNamespace(policy=_ValuePolicy(), gamma=gamma),
                    rewards=buffer.rewards[step],
                )
        fills_last_column = np.array([end == steps - 1 for end in last])
        dones = ~fills_last_column if last_values is not None else np.ones(envs, dtype=bool)
        buffer.compute_returns_and_advantage(last_values=torch.from_numpy(bootstrap), dones=dones)
        zero = torch.zeros((), dtype=dtype)
        advantages = torch.from_numpy(np.ascontiguousarray(buffer.advantages.T))
        returns = torch.from_numpy(np.ascontiguousarray(np.asarray(buffer.returns).T))
        return torch.where(keep, advantages, zero), torch.where(keep, returns, zero)

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
            raise ValueError(f"loss_agg: SB3's policy loss is a mean over transitions, got {loss_agg!r}")
        keep = mask != 0
        rollout_data = SimpleNamespace(old_log_prob=old_logp[keep])
        step = self._run(
            "policy_loss",
            log_prob=logp[keep],
            rollout_data=rollout_data,
            advantages=advantages[keep],
            clip_range=clip_eps,
            pg_losses=[],
            clip_fractions=[],
        )
        with torch.no_grad():
            approx_kl = self._run("approx_kl", log_prob=logp[keep].detach(), rollout_data=rollout_data)
        clip_fraction = torch.tensor(step["clip_fraction"], dtype=logp.dtype)
        return LibraryPolicyLoss(
            step["policy_loss"],
            clip_fraction,
            torch.as_tensor(approx_kl["approx_kl_div"]),
            ratio_outside_frac=clip_fraction,
        )

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
    ) -> Tensor:
        keep = mask != 0
        out = self._run(
            "value_loss",
            self=SimpleNamespace(clip_range_vf=clip_eps),
            clip_range_vf=clip_eps,
            values=values[keep],
            rollout_data=SimpleNamespace(old_values=old_values[keep], returns=returns[keep]),
        )
        loss: Tensor = out["value_loss"]
        return loss


def make_adapter() -> SB3Adapter:
    """The ``sb3`` adapter (imports stable-baselines3; AdapterLoadError naming the env command if missing)."""
    return SB3Adapter()
