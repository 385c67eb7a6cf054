"""The built-in adapter ``trl116``: TRL 1.16's group advantages under the conformance suite (issue 14).

Environment: ``python tools/thirdparty_envs.py trl116`` builds ``.envs/trl116`` (TRL 1.16.0 on CPU
torch), then ``.envs/trl116/bin/python -m pytest conformance/ --impl=trl116``. TRL 1.13 and later have
no PPOTrainer (TRL 1.12 stays the ``trl`` column); their family ops live inline in
``GRPOTrainer._generate_and_score_completions`` and ``RLOOTrainer._generate_and_score_completions``.
This adapter runs those installed lines, pinned by content with :mod:`._inline` (a changed line
fails loudly instead of running), with the variables the trainer binds there:

- ``group_advantages``: ``grpo`` runs GRPO's ``sum_then_normalize`` lines with ``self.scale_rewards``
  = ``std_scope`` (``group``, ``batch``, ``none``; ``dr_grpo`` is ``none``), then the line that zeroes
  NaN advantages; ``rloo`` runs RLOO's leave-one-out lines (``normalize_advantages`` False, its
  default). TRL lays the rewards out as ``(prompts, num_generations)``; groups of other sizes are
  what TRL computes for a prompt with unscorable completions, so the adapter puts each group in a row
  of width ``num_generations`` = the largest group, fills the rest with NaN (the trainer's mark of an
  unscorable completion, excluded from every mean and std by ``nanmean``/``nanstd``), runs the lines
  once on the whole batch and reads each group's rows back. ``eps`` is TRL's fixed 1e-4 (declared).

Only ``group_advantages`` is wired so far; the loss types of ``_compute_loss``, the KL term and the
importance-sampling modes are not provided yet (``NOT_PROVIDED``).
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Mapping
from types import MappingProxyType, SimpleNamespace

import torch
from torch import Tensor

from ppo_ref.adapters.thirdparty._common import import_library
from ppo_ref.adapters.thirdparty._inline import InlineBlock, LocatedBlock, locate

__all__ = ["BLOCKS", "CONVENTIONS", "CONVENTION_SOURCES", "NOT_PROVIDED", "TrlFamilyAdapter", "make_adapter"]

LIBRARY = "trl116"
GRPO = "GRPOTrainer._generate_and_score_completions"
RLOO = "RLOOTrainer._generate_and_score_completions"

BLOCKS: Mapping[str, InlineBlock] = MappingProxyType(
    {
        "grpo_advantages": InlineBlock(
            "trl.trainer.grpo_trainer",
            GRPO,
            "mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)",
            "advantages = advantages / (std_rewards + 1e-4)",
            "03feade5456debd0",
        ),
        "grpo_unscorable": InlineBlock(
            "trl.trainer.grpo_trainer",
            GRPO,
            "advantages = torch.nan_to_num(advantages, nan=0.0)",
            "advantages = torch.nan_to_num(advantages, nan=0.0)",
            "71c02e53e20a42aa",
        ),
        "rloo_advantages": InlineBlock(
            "trl.trainer.rloo_trainer",
            RLOO,
            "grouped_rewards = rewards.view(-1, num_generations)",
            "advantages = torch.nan_to_num(advantages, nan=0.0)",
            "64fe913ac5157997",
        ),
    }
)
"""The installed lines each op runs (first line, last line, digest)."""

CONVENTIONS: Mapping[str, object] = MappingProxyType({"group_std_eps": 1e-4})
"""TRL 1.16's declared conventions (sources in CONVENTION_SOURCES)."""

CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "group_std_eps": "trl/trainer/grpo_trainer.py GRPOTrainer._generate_and_score_completions: "
        "`advantages = advantages / (std_rewards + 1e-4)` (scale_rewards 'group' or 'batch')",
    }
)

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {
        "token_logprobs": "not wired for TRL 1.16 (TRL 1.12's selective_log_softmax is the trl column)",
        "entropy": "not wired for TRL 1.16",
        "masked_mean": "not wired for TRL 1.16",
        "masked_whiten": "TRL 1.16 has no PPO whitening (no PPOTrainer)",
        "kl_penalty": "TRL 1.16 has no KL-in-reward estimator function (RLOO sums k1 inline)",
        "token_rewards": "TRL 1.16 has no PPO token rewards",
        "gae": "TRL 1.16 has no GAE (no PPOTrainer)",
        "policy_loss": "GRPOTrainer._compute_loss is not wired yet (issue 14)",
        "value_loss": "TRL 1.16 has no value loss",
        "ppo_penalty_loss": "TRL 1.16 has no PPO-Penalty loss",
        "aggregate_loss": "the loss_type normalisations of GRPOTrainer._compute_loss are not wired yet",
        "gspo_loss": "importance_sampling_level='sequence' of _compute_loss is not wired yet",
        "cispo_loss": "loss_type='cispo' of _compute_loss is not wired yet",
        "kl_loss": "the beta * k3 term of _compute_loss is not wired yet",
        "rollout_correction": "vllm_importance_sampling_mode needs vLLM's log-probs; not wired yet",
    }
)


class TrlFamilyAdapter:
    """TRL 1.16's inline group advantages; see the module docstring for the layout."""

    name = LIBRARY
    conventions = CONVENTIONS
    convention_sources = CONVENTION_SOURCES
    not_provided = NOT_PROVIDED

    def __init__(self) -> None:
        self.version = importlib.metadata.version("trl")
        self._located: dict[str, LocatedBlock] = {key: locate(block) for key, block in BLOCKS.items()}
        where = {
            key: f"{b.block.owner} lines {b.where()} (digest {b.block.digest})"
            for key, b in self._located.items()
        }
        self.ops: frozenset[str] = frozenset({"group_advantages"})
        self.provenance = "; ".join(
            [
                f"group_advantages: grpo, dr_grpo {where['grpo_advantages']} then "
                f"{where['grpo_unscorable']}; "
                f"rloo {where['rloo_advantages']}; groups laid out as (prompts, num_generations), NaN-filled"
            ]
            + [f"not provided: {op} ({reason})" for op, reason in NOT_PROVIDED.items()]
        )

    def __repr__(self) -> str:
        return f"TrlFamilyAdapter(version={self.version!r})"

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
        del eps  # TRL's 1e-4 is written in the line (declared group_std_eps)
        if singleton != "zero":
            raise ValueError(f"singleton: TRL has no {singleton!r} mode")
        if method not in ("grpo", "dr_grpo", "rloo"):
            raise ValueError(f"method: expected 'grpo', 'dr_grpo' or 'rloo', got {method!r}")
        if std_scope not in ("group", "batch", "none"):
            raise ValueError(f"std_scope: expected 'group', 'batch' or 'none', got {std_scope!r}")
        _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
        width = int(counts.max()) if counts.numel() else 1
        # row of each sample in the (prompts, num_generations) layout: its group, its rank in the group
        rank = torch.zeros_like(inverse)
        for g in range(counts.numel()):
            members = torch.nonzero(inverse == g).squeeze(-1)
            rank[members] = torch.arange(members.numel())
        slots = inverse * width + rank
        rewards = torch.full((counts.numel() * width,), math.nan, dtype=scores.dtype)
        rewards[slots] = scores.detach()
        if method == "rloo":
            trainer = SimpleNamespace(normalize_advantages=False)
            namespace = self._located["rloo_advantages"].run(
                self=trainer, rewards=rewards, num_generations=width
            )
        else:
            scale = "none" if method == "dr_grpo" else std_scope
            trainer = SimpleNamespace(scale_rewards=scale)
            namespace = self._located["grpo_advantages"].run(
                self=trainer, rewards=rewards, num_generations=width
            )
            namespace = self._located["grpo_unscorable"].run(advantages=namespace["advantages"])
        advantages: Tensor = namespace["advantages"]
        return advantages[slots]


def make_adapter() -> TrlFamilyAdapter:
    """Import TRL (only now) and return the adapter; a clear error if TRL is not installed."""
    import_library(LIBRARY, "TRL 1.16", "trl.trainer.grpo_trainer")
    import_library(LIBRARY, "TRL 1.16", "trl.trainer.rloo_trainer")
    return TrlFamilyAdapter()
