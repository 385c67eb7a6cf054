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
- ``rollout_correction`` runs GRPO's ``vllm_importance_sampling_correction`` lines (the ratio lines,
  then the statements of the ``*_truncate`` or of the ``*_mask`` branch, each pinned: the branch's
  ``if``/``elif`` on the mode is the one thing the adapter does itself) with
  ``old_per_token_logps = logp``, ``sampling_per_token_logps = rollout_logp``, ``mask`` the mask,
  ``vllm_importance_sampling_mode`` ``{level}_{mode}`` (``token``/``sequence``, ``truncate``/``mask``)
  and ``vllm_importance_sampling_clip_min``/``_max`` = ``low``/``high``. A sequence-level ratio is
  (B, 1), which TRL broadcasts over the row's tokens when it multiplies the per-token loss; the
  adapter returns that broadcast. TRL leaves ratio 1 (token level) or the row's ratio (sequence
  level) on masked-out tokens, which its masked loss never reads: declared ``off_mask_outputs``.

- ``aggregate_loss`` runs the ``loss_type`` normalisation lines of ``GRPOTrainer._compute_loss`` on
  ``per_token_loss`` and ``mask``: ``token-mean`` is ``dapo`` (the default loss type; its
  ``num_items_in_batch`` is ``token_count``, or this call's action-token count as the trainer counts
  a one-process, one-step batch), ``seq-mean-token-mean`` is ``grpo``, ``seq-mean-token-sum`` is
  ``luspo``, ``seq-mean-token-sum-norm`` is ``dr_grpo`` with ``max_completion_length =
  norm_constant``; one process, ``gradient_accumulation_steps = steps_per_generation = 1``. TRL
  divides the other modes by the local row count, so ``row_count`` is not provided (declared
  ``policy_loss_options`` without ``counts``).

The loss types' per-token terms in ``_compute_loss`` and its KL term are not provided yet
(``NOT_PROVIDED``; the trainer-step tier runs them through ``GRPOTrainer.train``, ``trl_step.py``).
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

__all__ = [
    "BLOCKS",
    "CONVENTIONS",
    "CONVENTION_SOURCES",
    "LOSS_TYPES",
    "NOT_PROVIDED",
    "TrlFamilyAdapter",
    "make_adapter",
]

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
        "is_ratio": InlineBlock(
            "trl.trainer.grpo_trainer",
            GRPO,
            "per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
            "vllm_importance_sampling_ratio = torch.exp(logps_diff)",
            "6fa4bbdbdf4a1a02",
        ),
        "is_truncate": InlineBlock(
            "trl.trainer.grpo_trainer",
            GRPO,
            'if self.vllm_importance_sampling_mode in ["sequence_truncate", "token_truncate"]:',
            ")",
            "d0225fa35fac0371",
        ),
        "is_mask_min": InlineBlock("trl.trainer.grpo_trainer", GRPO, "min_val = (", ")", "b8663d63f8f58f2c"),
        "is_mask_max": InlineBlock("trl.trainer.grpo_trainer", GRPO, "max_val = (", ")", "d26083514204541f"),
        "is_mask_outside": InlineBlock(
            "trl.trainer.grpo_trainer",
            GRPO,
            "invalid_mis_mask = (vllm_importance_sampling_ratio < min_val) | (",
            ")",
            "ac57b53c2a2fcf3f",
        ),
        "is_mask_fill": InlineBlock(
            "trl.trainer.grpo_trainer",
            GRPO,
            "vllm_importance_sampling_ratio = vllm_importance_sampling_ratio.masked_fill(",
            ")",
            "7e8f5b7e8fe550d1",
        ),
        "loss_normalisation": InlineBlock(
            "trl.trainer.grpo_trainer",
            "GRPOTrainer._compute_loss",
            'mode = "train" if self.model.training else "eval"',
            'raise ValueError(f"Unknown loss type: {self.loss_type}")',
            "2c03beb67a8cf236",
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

LOSS_TYPES: Mapping[str, str] = MappingProxyType(
    {
        "token-mean": "dapo",
        "seq-mean-token-mean": "grpo",
        "seq-mean-token-sum": "luspo",
        "seq-mean-token-sum-norm": "dr_grpo",
    }
)
"""ppo-ref's loss_agg -> GRPOConfig.loss_type whose normalisation is that mode."""

CONVENTIONS: Mapping[str, object] = MappingProxyType(
    {
        "group_std_eps": 1e-4,
        "constant_groups": "rounding",
        "correction_levels": ["token", "sequence"],
        "policy_loss_options": [],
        "masked_fill": "finite",
        "off_mask_outputs": ["rollout_correction"],
        "edge_inputs": ["empty_rows", "holes"],
    }
)
"""TRL 1.16's declared conventions (sources in CONVENTION_SOURCES)."""

CONVENTION_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "group_std_eps": "trl/trainer/grpo_trainer.py GRPOTrainer._generate_and_score_completions: "
        "`advantages = advantages / (std_rewards + 1e-4)` (scale_rewards 'group' or 'batch')",
        "constant_groups": "trl/trainer/grpo_trainer.py GRPOTrainer: `advantages = rewards - "
        "mean_grouped_rewards`; trl/trainer/rloo_trainer.py RLOOTrainer: the leave-one-out baseline from "
        "the group's sum; no special case, so a constant group keeps the rounding of the mean or sum",
        "policy_loss_options": "trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss: grpo, luspo and "
        "dr_grpo divide by the micro-batch's own row count (then by the accumulation steps), dapo by "
        "num_items_in_batch: no whole-batch row count, so 'counts' is not provided (no policy_loss op)",
        "masked_fill": "trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss: per_token_loss comes from "
        "the log-probs of a forward pass over the padded completions (finite at pad tokens) before the "
        "mask is applied",
        "correction_levels": "trl/trainer/grpo_trainer.py: vllm_importance_sampling_mode token_* or "
        "sequence_* (the product ratio exp(sum of log-ratios)); no geometric mean",
        "edge_inputs": "trl/trainer/grpo_trainer.py GRPOTrainer._generate_and_score_completions: with "
        "mask_truncated_completions=True a completion without EOS gets completion_mask all zero, a row "
        "without action tokens in the loss (docs/findings-family.md trl116-f1); with tools, "
        "GRPOTrainer._tool_call_loop sets tool_mask to 0 on each tool result and 1 on the tokens after it "
        "(`tool_mask[idx_with_tool] += [0] * tool_length + [1] * post_tool_length`): holes in the loss mask",
        "off_mask_outputs": "trl/trainer/grpo_trainer.py: `per_token_logps_diff = (old_per_token_logps - "
        "sampling_per_token_logps) * mask` gives ratio 1 off the mask (the row's ratio at sequence level); "
        "_compute_loss multiplies the per-token loss by it and then masks the loss",
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
        "gspo_loss": "importance_sampling_level='sequence' of _compute_loss is not wired yet",
        "cispo_loss": "loss_type='cispo' of _compute_loss is not wired yet",
        "kl_loss": "the beta * k3 term of _compute_loss is not wired yet",
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
        self.ops: frozenset[str] = frozenset({"group_advantages", "aggregate_loss", "rollout_correction"})
        self.provenance = "; ".join(
            [
                f"group_advantages: grpo, dr_grpo {where['grpo_advantages']} then "
                f"{where['grpo_unscorable']}; "
                f"rloo {where['rloo_advantages']}; groups laid out as (prompts, num_generations), NaN-filled",
                f"aggregate_loss: {where['loss_normalisation']} with loss_type dapo (token-mean), grpo "
                "(seq-mean-token-mean), luspo (seq-mean-token-sum), dr_grpo (seq-mean-token-sum-norm)",
                f"rollout_correction: {where['is_ratio']}, then {where['is_truncate']} or "
                f"{where['is_mask_min']}, {where['is_mask_max']}, {where['is_mask_outside']}, "
                f"{where['is_mask_fill']}, with vllm_importance_sampling_mode = "
                "'{level}_{mode}', clip_min = low, clip_max = high",
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

    def aggregate_loss(
        self,
        per_token: Tensor,
        mask: Tensor,
        loss_agg: str = "token-mean",
        *,
        norm_constant: float | None = None,
        token_count: int | Tensor | None = None,
        row_count: int | Tensor | None = None,
    ) -> Tensor:
        if loss_agg not in LOSS_TYPES:
            raise ValueError(f"loss_agg: expected one of {list(LOSS_TYPES)}, got {loss_agg!r}")
        if row_count is not None or (token_count is not None and loss_agg != "token-mean"):
            raise ValueError("row_count: TRL divides by the micro-batch's own rows (declared: no counts)")
        if (norm_constant is None) != (loss_agg != "seq-mean-token-sum-norm"):
            raise ValueError(
                f"norm_constant: given exactly for seq-mean-token-sum-norm, got {norm_constant!r}"
            )
        keep = mask.to(per_token.dtype if per_token.is_floating_point() else torch.float32)
        items = keep.sum() if token_count is None else torch.as_tensor(token_count, dtype=keep.dtype)
        trainer = SimpleNamespace(
            model=SimpleNamespace(training=True),
            loss_type=LOSS_TYPES[loss_agg],
            current_gradient_accumulation_steps=1,
            max_completion_length=norm_constant,
            accelerator=SimpleNamespace(num_processes=1),
            args=SimpleNamespace(steps_per_generation=1),
        )
        namespace = self._located["loss_normalisation"].run(
            self=trainer, per_token_loss=per_token, mask=keep, inputs={"num_items_in_batch": items}
        )
        loss: Tensor = namespace["loss"]
        return loss

    def rollout_correction(
        self,
        logp: Tensor,
        rollout_logp: Tensor,
        mask: Tensor,
        *,
        level: str = "token",
        mode: str = "truncate",
        high: float,
        low: float | None = None,
    ) -> Tensor:
        if level not in ("token", "sequence"):
            raise ValueError(
                f"level: TRL's vllm_importance_sampling_mode is token_* or sequence_*, got {level!r}"
            )
        if mode not in ("truncate", "mask"):
            raise ValueError(f"mode: expected 'truncate' or 'mask', got {mode!r}")
        trainer = SimpleNamespace(
            vllm_importance_sampling_mode=f"{level}_{mode}",
            vllm_importance_sampling_clip_min=low,
            vllm_importance_sampling_clip_max=high,
        )
        old = logp.detach()
        namespace = self._located["is_ratio"].run(
            self=trainer,
            old_per_token_logps=old,
            sampling_per_token_logps=rollout_logp.detach(),
            mask=mask.to(old.dtype),
        )
        steps = (
            ("is_truncate",)
            if mode == "truncate"
            else ("is_mask_min", "is_mask_max", "is_mask_outside", "is_mask_fill")
        )
        for step in steps:
            namespace = self._located[step].run(
                **{k: v for k, v in namespace.items() if not k.startswith("__")}
            )
        ratio: Tensor = namespace["vllm_importance_sampling_ratio"]
        return ratio.expand_as(old)


def make_adapter() -> TrlFamilyAdapter:
    """Import TRL (only now) and return the adapter; a clear error if TRL is not installed."""
    import_library(LIBRARY, "TRL 1.16", "trl.trainer.grpo_trainer")
    import_library(LIBRARY, "TRL 1.16", "trl.trainer.rloo_trainer")
    return TrlFamilyAdapter()
