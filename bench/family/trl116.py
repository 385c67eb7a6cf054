"""The PPO-family benchmark's TRL 1.16 side: ``GRPOTrainer``'s pinned inline group block."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from bench.family.cases import Case, ref_group

TRL_ADVANTAGE_BLOCK = dict(
    module="trl.trainer.grpo_trainer",
    qualname="GRPOTrainer._generate_and_score_completions",
    first="mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)",
    last="is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))  # for logging",
    digest="e4b94e8e0e40da30",
)


def trl116_cases(data: dict[str, Tensor]) -> list[Case]:
    """TRL 1.16 ``GRPOTrainer``'s inline advantage block (``scale_rewards`` "group" for grpo, "none"
    for dr_grpo; TRL's epsilon 1e-4), run from the installed source. Its losses are inline in
    ``_compute_loss`` and read a dozen trainer attributes: not benchmarked here."""
    from ppo_ref.adapters.thirdparty import _inline

    block = _inline.locate(_inline.InlineBlock(**TRL_ADVANTAGE_BLOCK))
    size = int(torch.bincount(data["group_ids"]).max())
    scores = data["scores"]
    cases = []
    for method, scale in (("grpo", "group"), ("dr_grpo", "none")):
        trainer = SimpleNamespace(scale_rewards=scale)

        def run(trainer: Any = trainer) -> Tensor:
            result: Tensor = block.run(self=trainer, rewards=scores, num_generations=size)["advantages"]
            return result

        note = f"scale_rewards={scale!r}, contiguous groups of equal size"
        cases.append(
            Case(f"group_advantages/{method}", "trl116", run, ref_group(data, method, 1e-4), note=note)
        )
    return cases
