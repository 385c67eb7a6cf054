"""``--impl=trl``: TRL 1.12.0, the last release with PPO (``trl.experimental.ppo``).

Module-level functions are called directly: ``masked_mean``, ``masked_whiten`` (from
``trl/experimental/ppo/ppo_trainer.py``), ``selective_log_softmax`` and ``entropy_from_logits``
(``trl/trainer/utils.py``). Everything else TRL computes inline in ``PPOTrainer.train``; those ops
run the exact lines of the installed ``train`` (pinned by content with :mod:`._inline`, failing loudly
if they changed), bound to the contract's tensors the way ``train`` prepares them:

- a row's TRL ``sequence_lengths`` (index of the last non-pad response token) is the index of its
  last action token; TRL has no notion of holes, so a hole before it is an ordinary response token;
- the lines that build ``padding_mask``/``padding_mask_p1`` and fill log-probs (with
  ``INVALID_LOGPROB``) and values (with 0) run first, as in ``train``;
- micro-batch indexing uses ``torch.arange(B)`` (the whole batch is one micro-batch).

Build the environment with ``python tools/thirdparty_envs.py trl``; run with ``.envs/trl/bin/python``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import MappingProxyType, SimpleNamespace
from typing import Any

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

__all__ = ["BLOCKS", "TrlAdapter", "make_adapter"]

REQUIRES = "TRL 1.12.0"
"""What the adapter needs (named in the error when it cannot be imported)."""
TRAINER_MODULE = "trl.experimental.ppo.ppo_trainer"
UTILS_MODULE = "trl.trainer.utils"
TRAIN = "PPOTrainer.train"


def _block(first: str, last: str, digest: str) -> InlineBlock:
    return InlineBlock(TRAINER_MODULE, TRAIN, first, last, digest)


BLOCKS: Mapping[str, InlineBlock] = MappingProxyType(
    {
        "padding_masks": _block(
            "response_idxs = torch.arange(responses.shape[1], device=responses.device)"
            ".repeat(responses.shape[0], 1)",
            "values = torch.masked_fill(values, padding_mask_p1, 0)",
            "843bfa4436c694c5",
        ),
        "kl": _block(
            "logr = ref_logprobs - logprobs",
            'kl = -logr if args.kl_estimator == "k1" else (logr.exp() - 1) - logr  # Else statement is k3',
            "141ee1142bff92b3",
        ),
        "rewards": _block(
            "logr = ref_logprobs - logprobs",
            "rewards[actual_start, actual_end] += scores",
            "930715040c6f8609",
        ),
        "gae": _block(
            "lastgaelam = 0",
            "advantages = torch.masked_fill(advantages, padding_mask, 0)",
            "41b13677584cb844",
        ),
        "advantages_fill": _block(
            "advantages = torch.masked_fill(advantages, padding_mask, 0)",
            "advantages = torch.masked_fill(advantages, padding_mask, 0)",
            "66be4574702bcd00",
        ),
        "new_logprobs_fill": _block("new_logprobs = torch.masked_fill(", ")", "d0db0dedaa3e15ed"),
        "value_loss": _block(
            "vpred = torch.masked_fill(vpred, padding_mask_p1[micro_batch_inds], 0)",
            "vf_loss = 0.5 * masked_mean(vf_loss_max, ~padding_mask_p1[micro_batch_inds])",
            "9207c0e6da1a2b56",
        ),
        "policy_loss": _block(
            "logprobs_diff = new_logprobs - mb_logprobs",
            "pg_loss = masked_mean(pg_loss_max, ~padding_mask[micro_batch_inds])",
            "a31fc0db7fdba354",
        ),
        "clipfrac": _block("pg_clipfrac = masked_mean(", ")", "449c79d09ade48ec"),
        "approxkl": _block(
            "approxkl = 0.5 * (logprobs_diff**2).mean()",
            "approxkl = 0.5 * (logprobs_diff**2).mean()",
            "bd26edfc7f2e1fb7",
        ),
        "ratio_mean": _block(
            "ratio_stats[ppo_epoch_idx, minibatch_idx, gradient_accumulation_idx] = ratio.mean()",
            "ratio_stats[ppo_epoch_idx, minibatch_idx, gradient_accumulation_idx] = ratio.mean()",
            "3648726afd870903",
        ),
    }
)
"""The lines of ``PPOTrainer.train`` each inline op runs (first line, last line, digest)."""

# The op and the blocks it runs, in order.
OP_BLOCKS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "kl_penalty": ("padding_masks", "kl"),
        "token_rewards": ("padding_masks", "rewards"),
        "gae": ("padding_masks", "gae"),
        "policy_loss": (
            "padding_masks",
            "advantages_fill",
            "new_logprobs_fill",
            "policy_loss",
            "clipfrac",
            "approxkl",
            "ratio_mean",
        ),
        "value_loss": ("padding_masks", "value_loss"),
    }
)

NOT_PROVIDED: Mapping[str, str] = MappingProxyType(
    {"ppo_penalty_loss": "TRL 1.12 has no PPO-Penalty loss (PPOTrainer trains the clipped objective only)"}
)


class TrlAdapter:
    """TRL 1.12's PPO math; see the module docstring for how each op reaches TRL's code."""

    name = "trl"

    def __init__(self) -> None:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        self._trainer = import_library(self.name, REQUIRES, TRAINER_MODULE)
        self._utils = import_library(self.name, REQUIRES, UTILS_MODULE)
        self.version: str = str(importlib.import_module("trl").__version__)
        self._located: dict[str, LocatedBlock] = {}
        self._errors: dict[str, str] = {}
        for key, block in BLOCKS.items():
            try:
                self._located[key] = locate(block)
            except InlineSourceError as error:
                self._errors[key] = str(error)
        self.ops: frozenset[str] = frozenset(
            {"token_logprobs", "entropy", "masked_mean", "masked_whiten", *OP_BLOCKS}
        )
        self.conventions: Mapping[str, object] = MappingProxyType(
            {
                "approx_kl": "k2",
                "gae_whitening": "unbiased",
                "gae_bootstrap": "none",
                "score_placement": "after-last-action-token",
                "reward_kl_estimators": ("k1", "k3"),
                "loss_aggregations": ("token-mean",),
                "value_clip_modes": ("clipped",),
                "policy_loss_options": (),
                "masked_fill": "zero",
                "prefix_masks": "all",
                "value_after_last_action_token": "trained",
                "off_mask_outputs": ("masked_whiten",),
            }
        )
        self.convention_sources: Mapping[str, str] = MappingProxyType(self._convention_sources())
        self.not_provided: Mapping[str, str] = NOT_PROVIDED
        self.provenance: str = self._provenance()

    def __repr__(self) -> str:
        return f"TrlAdapter(version={self.version!r})"

    # --- documentation -------------------------------------------------------------------------

    def _where(self, key: str) -> str:
        located = self._located.get(key)
        return f"NOT FOUND ({self._errors[key]})" if located is None else located.where()

    def _lines(self, key: str) -> str:
        return f"{key} = {self._where(key)}"

    def _convention_sources(self) -> dict[str, str]:
        return {
            "approx_kl": f"approxkl = 0.5 * (logprobs_diff**2).mean() (k2), PPOTrainer.train, "
            f"{self._where('approxkl')}",
            "gae_whitening": "advantages = masked_whiten(advantages, ~padding_mask) (unbiased, always) "
            f"after the recursion: {self._where('gae')}",
            "gae_bootstrap": "nextvalues = 0.0 after the last column, no bootstrap input: "
            f"{self._where('gae')}",
            "score_placement": "rewards[i, sequence_lengths + 1] += score (first pad slot after EOS; "
            f"the last column when the response fills it): {self._where('rewards')}",
            "reward_kl_estimators": "kl = -logr if args.kl_estimator == 'k1' else (logr.exp() - 1) - logr; "
            f"PPOConfig.kl_estimator: Literal['k1', 'k3']: {self._where('kl')}",
            "loss_aggregations": f"pg_loss = masked_mean(pg_loss_max, ~padding_mask) only: "
            f"{self._where('policy_loss')}",
            "value_clip_modes": "vpredclipped = clamp(vpred, values - cliprange_value, "
            f"values + cliprange_value), always applied: {self._where('value_loss')}",
            "policy_loss_options": "PPOTrainer.train has one symmetric cliprange, no dual clip and no "
            f"whole-batch counts (the micro-batch's masked_mean): {self._where('policy_loss')}",
            "masked_fill": "logprobs/ref_logprobs = masked_fill(padding_mask, INVALID_LOGPROB), values = "
            "masked_fill(padding_mask_p1, 0) (this adapter runs those lines itself); rewards are zeros "
            "plus the KL of equal filled log-probs (0) and the score; advantages masked_fill(padding_mask, "
            f"0): {self._where('padding_masks')}, {self._where('advantages_fill')}",
            "prefix_masks": "every mask is `response_idxs > sequence_lengths` (or `+ 1`) from the index of "
            "the last non-pad response token, so a row's action tokens are a prefix (no holes): "
            f"{self._where('padding_masks')}",
            "value_after_last_action_token": "values keep the slot sequence_lengths + 1 (masked_fill with "
            "padding_mask_p1), the score goes there, GAE runs through it and the value loss is "
            f"masked_mean(..., ~padding_mask_p1): {self._where('padding_masks')}, "
            f"{self._where('value_loss')}",
            "off_mask_outputs": "PPOTrainer.train zeroes the padding right after each whitening, so only the "
            "action tokens of masked_whiten's output are read: advantages = masked_whiten(advantages, "
            "~padding_mask) then advantages = torch.masked_fill(advantages, padding_mask, 0) "
            "(trl/experimental/ppo/ppo_trainer.py:797-798 in TRL 1.12.0), and with whiten_rewards "
            "rewards = masked_whiten(rewards, mask=~padding_mask_p1, shift_mean=False) then "
            f"masked_fill(rewards, padding_mask_p1, 0) (:783-784): {self._where('advantages_fill')}",
        }

    def _provenance(self) -> str:
        blocks = "; ".join(self._lines(key) for key in BLOCKS)
        ops = "; ".join(f"{op} runs {' + '.join(keys)}" for op, keys in OP_BLOCKS.items())
        return (
            f"TRL {self.version}. token_logprobs: trl.trainer.utils.selective_log_softmax(logits[:, :-1] / "
            "temperature, input_ids[:, 1:]) (trl/trainer/utils.py; PPOTrainer.train divides by "
            "`args.temperature + 1e-7` before it, a 1e-7 relative shift the adapter leaves out); entropy: "
            "trl.trainer.utils.entropy_from_logits (PPOTrainer.train computes the same formula inline from "
            "the tempered logits); masked_mean, masked_whiten: trl.experimental.ppo.ppo_trainer.masked_mean "
            "/ masked_whiten (trl/experimental/ppo/ppo_trainer.py). Inline in "
            "trl.experimental.ppo.ppo_trainer.PPOTrainer.train, the exact installed lines run by "
            f"ppo_ref.adapters.thirdparty._inline (pinned by content): {blocks}. {ops}. "
            "sequence_lengths = index of each row's last action token (holes are ordinary response tokens "
            "to TRL). Not provided: " + "; ".join(f"{op} ({why})" for op, why in NOT_PROVIDED.items())
        )

    # --- running TRL's lines -------------------------------------------------------------------

    def _run(self, key: str, /, **bindings: Any) -> dict[str, Any]:
        located = self._located.get(key)
        if located is None:
            raise InlineSourceError(self._errors[key])
        return located.run(**bindings)

    def _padding(
        self,
        mask: Tensor | None,
        shape: tuple[int, int],
        logprobs: Tensor | None = None,
        ref_logprobs: Tensor | None = None,
        values: Tensor | None = None,
    ) -> dict[str, Any]:
        """TRL's padding masks from the mask, with the log-probs and values filled as ``train`` does
        (an input not given is a zero placeholder whose filled value the op does not read)."""
        rows, columns = shape
        if mask is None:
            sequence_lengths = torch.full((rows,), columns - 1, dtype=torch.long)
        else:
            sequence_lengths = last_action_index(mask != 0)
        return self._run(
            "padding_masks",
            responses=torch.zeros(shape, dtype=torch.long),
            sequence_lengths=sequence_lengths,
            logprobs=torch.zeros(shape) if logprobs is None else logprobs,
            ref_logprobs=torch.zeros(shape) if ref_logprobs is None else ref_logprobs,
            values=torch.zeros(shape) if values is None else values,
        )

    # --- module-level functions ----------------------------------------------------------------

    def token_logprobs(self, logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
        result: Tensor = self._utils.selective_log_softmax(logits[:, :-1] / temperature, input_ids[:, 1:])
        return result

    def entropy(self, logits: Tensor) -> Tensor:
        result: Tensor = self._utils.entropy_from_logits(logits)
        return result

    def masked_mean(self, x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
        result: Tensor = self._trainer.masked_mean(x, mask, axis=dim)
        return result

    def masked_whiten(self, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
        result: Tensor = self._trainer.masked_whiten(x, mask, shift_mean=shift_mean)
        return result

    # --- inline in PPOTrainer.train ------------------------------------------------------------

    def kl_penalty(
        self, logp: Tensor, ref_logp: Tensor, estimator: str = "k1", mask: Tensor | None = None
    ) -> Tensor:
        if estimator not in ("k1", "k3"):
            raise ValueError(f"estimator: TRL 1.12 has kl_estimator 'k1' or 'k3', got {estimator!r}")
        shape = (logp.shape[0], logp.shape[1])
        padded = self._padding(mask, shape, logprobs=logp, ref_logprobs=ref_logp)
        kl: Tensor = self._run(
            "kl",
            ref_logprobs=padded["ref_logprobs"],
            logprobs=padded["logprobs"],
            args=SimpleNamespace(kl_estimator=estimator),
        )["kl"]
        return kl

    def token_rewards(
        self,
        scores: Tensor,
        logp: Tensor,
        ref_logp: Tensor,
        mask: Tensor,
        kl_coef: float,
        estimator: str = "k1",
    ) -> Tensor:
        if estimator not in ("k1", "k3"):
            raise ValueError(f"estimator: TRL 1.12 has kl_estimator 'k1' or 'k3', got {estimator!r}")
        shape = (mask.shape[0], mask.shape[1])
        padded = self._padding(mask, shape, logprobs=logp, ref_logprobs=ref_logp)
        rewards: Tensor = self._run(
            "rewards",
            ref_logprobs=padded["ref_logprobs"],
            logprobs=padded["logprobs"],
            args=SimpleNamespace(kl_estimator=estimator, kl_coef=kl_coef),
            sequence_lengths=padded["sequence_lengths"],
            sequence_lengths_p1=padded["sequence_lengths_p1"],
            scores=scores,
        )["rewards"]
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
                "last_values: TRL 1.12's GAE has no bootstrap input (nextvalues = 0.0 at the end)"
            )
        shape = (mask.shape[0], mask.shape[1])
        padded = self._padding(mask, shape, values=values)
        out = self._run(
            "gae",
            values=padded["values"],
            rewards=rewards,
            args=SimpleNamespace(gamma=gamma, lam=lam),
            responses=padded["responses"],
            padding_mask=padded["padding_mask"],
        )
        return out["advantages"], out["returns"]

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
            raise ValueError(f"loss_agg: TRL 1.12's policy loss is a token mean, got {loss_agg!r}")
        shape = (mask.shape[0], mask.shape[1])
        padded = self._padding(mask, shape, logprobs=old_logp)
        padding_mask = padded["padding_mask"]
        batch = torch.arange(shape[0])
        filled_advantages = self._run("advantages_fill", advantages=advantages, padding_mask=padding_mask)
        new_logprobs = self._run(
            "new_logprobs_fill", new_logprobs=logp, padding_mask=padding_mask, micro_batch_inds=batch
        )["new_logprobs"]
        step = self._run(
            "policy_loss",
            new_logprobs=new_logprobs,
            mb_logprobs=padded["logprobs"][batch],
            mb_advantage=filled_advantages["advantages"][batch],
            args=SimpleNamespace(cliprange=clip_eps),
            padding_mask=padding_mask,
            micro_batch_inds=batch,
        )
        with torch.no_grad():
            clipfrac = self._run(
                "clipfrac",
                pg_losses=step["pg_losses"],
                pg_losses2=step["pg_losses2"],
                padding_mask=padding_mask,
                micro_batch_inds=batch,
            )["pg_clipfrac"]
            approx_kl = self._run("approxkl", logprobs_diff=step["logprobs_diff"])["approxkl"]
            ratio_stats = torch.zeros((1, 1, 1), dtype=step["ratio"].dtype)
            self._run(
                "ratio_mean",
                ratio_stats=ratio_stats,
                ratio=step["ratio"],
                ppo_epoch_idx=0,
                minibatch_idx=0,
                gradient_accumulation_idx=0,
            )
        return LibraryPolicyLoss(step["pg_loss"], clipfrac, approx_kl, ratio_mean=ratio_stats[0, 0, 0])

    def value_loss(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        clip_eps: float | None = None,
    ) -> Tensor:
        if clip_eps is None:
            raise ValueError("clip_eps: TRL 1.12's value loss is always clipped (PPOConfig.cliprange_value)")
        shape = (mask.shape[0], mask.shape[1])
        padded = self._padding(mask, shape, values=old_values)
        batch = torch.arange(shape[0])
        loss: Tensor = self._run(
            "value_loss",
            vpred=values,
            mb_values=padded["values"][batch],
            mb_return=returns[batch],
            args=SimpleNamespace(cliprange_value=clip_eps),
            padding_mask_p1=padded["padding_mask_p1"],
            micro_batch_inds=batch,
        )["vf_loss"]
        return loss


def make_adapter() -> TrlAdapter:
    """The ``trl`` adapter (imports TRL 1.12; AdapterLoadError naming the env command if it is missing)."""
    return TrlAdapter()
