"""``--impl=swift``: ms-swift 4.6.0's GRPO math, called as its ``GRPOTrainer`` calls it.

ms-swift's PPO trainer is TRL's (``swift/rlhf_trainers/ppo_trainer.py``: ``class PPOTrainer(SwiftMixin,
HFPPOTrainer)``); its own RL math is GRPO's, and most of it is inline in
``GRPOTrainer._compute_loss_and_metrics``. Wrapped here, what is callable:

- ``group_advantages``: ``swift.rl_core.advantage.compute_advantages`` (the default path,
  grpo_trainer.py:460, ``num_generations`` completions per prompt) when every group has the same
  size, else ``compute_advantages_dynamic`` (grpo_trainer.py:503, ``dynamic_num_samples``: grouped by
  prompt id). Rows are put in group order first (the pipeline's batch is prompt-major), the scores
  cast to float32 (the pipeline's ``rewards_per_func = torch.zeros(...)``, grpo_algorithm.py:45) and
  passed as one reward function of weight 1. ``method`` maps to ``advantage_estimator`` and
  ``std_scope`` to ``scale_rewards``: grpo/group -> grpo/group (ms-swift's default), grpo/batch ->
  grpo/batch, grpo/none and dr_grpo -> grpo/none, rloo -> rloo/none (ms-swift's default for rloo,
  arguments/rlhf_args.py:388-389).
- ``entropy``: the ``entropy_from_logits`` that ``swift.rlhf_trainers.grpo_trainer`` bound at import:
  TRL's (``trl.trainer.utils``) whenever TRL has it, ms-swift's own (``swift/rlhf_trainers/utils.py``)
  only as the fallback (grpo_trainer.py:64-67). The trainer applies it to the model's logits over the
  temperature in the model's dtype (grpo_trainer.py:1488-1493, 1602-1604); so does this op.
- ``token_logprobs``: TRL's ``selective_log_softmax`` (imported at grpo_trainer.py:38) on
  ``logits[:, :-1] / temperature`` and the next tokens, as grpo_trainer.py:1488-1489.
- ``aggregate_loss``: ``swift.rl_core.advantage._sdar_agg_loss`` (the aggregation of
  ``compute_sdar_loss``, grpo_trainer.py:1142) with a float mask.

Build the environment with ``python tools/thirdparty_envs.py swift``.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import Tensor

from ppo_ref.adapters.thirdparty._common import float_mask, import_library, library_location

__all__ = ["SwiftAdapter", "make_adapter"]

REQUIRES = "ms-swift 4.6.0"
"""What the adapter needs (named in the error when it cannot be imported)."""

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
"""swift/rl_core/advantage.py:346-359 ``_sdar_agg_loss``: the three it knows."""

ESTIMATORS: Mapping[tuple[str, str], tuple[str, str]] = MappingProxyType(
    {
        ("grpo", "group"): ("grpo", "group"),
        ("grpo", "batch"): ("grpo", "batch"),
        ("grpo", "none"): ("grpo", "none"),
        ("dr_grpo", "group"): ("grpo", "none"),
        ("rloo", "group"): ("rloo", "none"),
    }
)
"""(method, std_scope) -> (advantage_estimator, scale_rewards)."""

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {
        "policy_loss": "the clipped GRPO loss is inline in GRPOTrainer._compute_loss_and_metrics "
        "(grpo_trainer.py:1048-1060), which needs a trainer instance; not wired here",
        "kl_penalty": "the k3 KL is inline in _compute_loss_and_metrics (grpo_trainer.py:972-976: "
        "log-ratio clamped to ±20, estimate to ±10)",
        "kl_loss": "inline in _compute_loss_and_metrics (per_token_loss + beta * per_token_kl)",
        "cispo_loss": "inline in _compute_loss_and_metrics (loss_type='cispo')",
        "gspo_loss": "inline in _compute_loss_and_metrics (importance_sampling_level='sequence')",
        "rollout_correction": "GRPOTrainer methods on the trainer's state; not wired here",
        "gae": "no GAE: the PPO trainer is TRL's (swift/rlhf_trainers/ppo_trainer.py)",
        "value_loss": "no value loss of its own: the PPO trainer is TRL's",
        "masked_mean": "no standalone masked mean in the GRPO path",
        "masked_whiten": "no whitening in the GRPO path",
        "token_rewards": "GRPO scores whole sequences: no per-token rewards",
        "ppo_penalty_loss": "no KL-penalty PPO loss",
    }
)

_A = "swift/rl_core/advantage.py"
_T = "swift/rlhf_trainers/grpo_trainer.py"


class SwiftAdapter:
    """ms-swift 4.6.0; see the module docstring for how each op reaches ms-swift's code."""

    name = "swift"
    ops: frozenset[str] = frozenset({"token_logprobs", "entropy", "group_advantages", "aggregate_loss"})
    conventions: Mapping[str, object] = MappingProxyType(
        {
            "group_methods": ("grpo", "dr_grpo", "rloo"),
            "group_std_scopes": ("group", "batch", "none"),
            "group_std_eps": 1e-4,
            "group_singleton": "zero",
            "constant_groups": "rounding",
            "compute_dtype": {"group_advantages": "float32"},
            "loss_aggregations": AGGREGATIONS,
            "policy_loss_options": (),
            "masked_fill": "finite",
        }
    )
    convention_sources: Mapping[str, str] = MappingProxyType(
        {
            "group_methods": f"{_A}:67-70 (fixed K), 163-175 (dynamic): advantage_estimator grpo (r - mean) "
            "and rloo (K/(K-1) (r - mean)); dr_grpo is grpo with scale_rewards='none'",
            "group_std_scopes": f"{_A}:80-84, 188-199: scale_rewards batch (std of all rewards), group "
            "(the group's), none",
            "group_std_eps": f"{_A}:97, 204: advantages / (std + 1e-4), a fixed epsilon",
            "group_singleton": f"{_A}:84, 199: a group of one gets std 0 (not NaN), so A = 0 / 1e-4 = 0",
            "constant_groups": f"{_A}:65-70, 175: rewards - group mean: the float mean's rounding stays",
            "compute_dtype": "swift/rl_core/grpo_algorithm.py:45 rewards_per_func = torch.zeros(...) "
            f"(float32); {_A}:159 allocates prompt_means float32 whatever the rewards are",
            "loss_aggregations": f"{_A}:346-359 _sdar_agg_loss: token-mean, seq-mean-token-sum, "
            "seq-mean-token-mean",
            "policy_loss_options": f"{_A}:346 _sdar_agg_loss(loss_mat, loss_mask, loss_agg_mode): no counts",
            "masked_fill": f"{_T}:1488-1493: per-token values come from the model's forward (finite)",
        }
    )
    not_provided: Mapping[str, str] = NOT_PROVIDED

    def __init__(self) -> None:
        self._adv = import_library("swift", REQUIRES, "swift.rl_core.advantage")
        self._trainer = import_library("swift", REQUIRES, "swift.rlhf_trainers.grpo_trainer")
        self.version: str = importlib.metadata.version("ms-swift")
        where = library_location
        self.provenance: str = (
            f"ms-swift {self.version}. group_advantages: {where(self._adv.compute_advantages)} (equal "
            f"groups) or {where(self._adv.compute_advantages_dynamic)}, float32 scores in group order; "
            f"entropy: {where(self._trainer.entropy_from_logits)}, the function grpo_trainer.py "
            "imported (TRL's when importable, ms-swift's fallback otherwise), in the logits' dtype; "
            f"token_logprobs: {where(self._trainer.selective_log_softmax)} on logits / temperature; "
            f"aggregate_loss: {where(self._adv._sdar_agg_loss)}. Not provided: "
            + "; ".join(f"{op} ({why})" for op, why in NOT_PROVIDED.items())
        )

    def __repr__(self) -> str:
        return f"SwiftAdapter(version={self.version!r})"

    def token_logprobs(self, logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
        if not isinstance(logits, Tensor) or logits.ndim != 3:
            raise ValueError("logits: expected a (B, L, V) torch.Tensor")
        if not isinstance(input_ids, Tensor) or tuple(input_ids.shape) != tuple(logits.shape[:2]):
            raise ValueError("input_ids: expected a (B, L) torch.Tensor matching logits")
        if not isinstance(temperature, int | float) or not temperature > 0:
            raise ValueError(f"temperature: expected a number > 0, got {temperature!r}")
        out: Tensor = self._trainer.selective_log_softmax(logits[:, :-1] / temperature, input_ids[:, 1:])
        return out

    def entropy(self, logits: Tensor) -> Tensor:
        if not isinstance(logits, Tensor) or logits.ndim < 1:
            raise ValueError("logits: expected a torch.Tensor with a vocabulary axis")
        out: Tensor = self._trainer.entropy_from_logits(logits)
        return out

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
        if (method, std_scope) not in ESTIMATORS:
            raise ValueError(
                f"method/std_scope: ms-swift has {sorted(ESTIMATORS)}, got {method!r}, {std_scope!r}"
            )
        if singleton != "zero":
            raise ValueError(f"singleton: ms-swift gives a group of one A = 0, got {singleton!r}")
        if not isinstance(scores, Tensor) or scores.ndim != 1:
            raise ValueError("scores: expected a 1-D torch.Tensor")
        if not isinstance(group_ids, Tensor) or group_ids.shape != scores.shape:
            raise ValueError("group_ids: expected a torch.Tensor of the scores' shape")
        estimator, scale = ESTIMATORS[(method, std_scope)]
        order = torch.argsort(group_ids, stable=True)
        rewards = scores[order].to(torch.float32)[:, None]
        weights = torch.ones(1, dtype=torch.float32)
        ids = group_ids[order]
        _unique, counts = torch.unique_consecutive(ids, return_counts=True)
        if rewards.numel() and bool((counts == counts[0]).all()):
            adv, _ = self._adv.compute_advantages(
                rewards, weights, int(counts[0]), advantage_estimator=estimator, scale_rewards=scale
            )
        else:
            adv, _ = self._adv.compute_advantages_dynamic(
                rewards,
                weights,
                [str(int(g)) for g in ids],
                [str(i) for i in range(len(ids))],
                advantage_estimator=estimator,
                scale_rewards=scale,
            )
        out = torch.empty_like(adv)
        out[order] = adv
        return out

    def aggregate_loss(self, per_token: Tensor, mask: Tensor, loss_agg: str = "token-mean") -> Tensor:
        if loss_agg not in AGGREGATIONS:
            raise ValueError(f"loss_agg: expected one of {AGGREGATIONS}, got {loss_agg!r}")
        out: Tensor = self._adv._sdar_agg_loss(per_token, float_mask(mask, per_token), loss_agg)
        return out


def make_adapter() -> SwiftAdapter:
    """The ``swift`` adapter (imports ms-swift; AdapterLoadError naming the env command if missing)."""
    return SwiftAdapter()
