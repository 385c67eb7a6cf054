"""What a built-in task gives the trainer: models, prompts, a scorer and a format check.

The trainer knows tasks only through :class:`Task`; a task knows nothing about PPO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

RewardFunction = Callable[[Sequence[str], Sequence[str]], Sequence[float]]
"""``(prompts, responses) -> scores``: one float per response, the response text without EOS."""


@dataclass(frozen=True)
class Task:
    """A ready-to-train task.

    Attributes:
        name: the task's name on the command line (``--task``).
        tokenizer: left-padding tokenizer with ``pad_token_id`` and ``eos_token_id`` set (they may
            be equal).
        policy: the warmed-up (supervised) causal LM that PPO starts from; the trainer copies it
            for the frozen reference and, if asked, for the critic's backbone.
        train_prompts: prompts sampled for rollouts.
        eval_prompts: held-out prompts for ``eval_score_initial``/``eval_score_final``.
        reward_function: a rule or verifier scoring responses, or None when ``reward_model`` is set.
        reward_model: an ``AutoModelForSequenceClassification`` with one label, read at the last
            real token of prompt + response, or None.
        well_formed: True when a response follows the task's format (for ``well_formed_rate``);
            None for tasks without a format.
        config_overrides: trainer config fields this task sets by default (e.g. ``max_new_tokens``);
            the user's values still win.
        eval_reward_function: the task's true score for evaluation, when training optimises a
            proxy (``positive-review-rm``: the rule score behind its learned reward model). None
            means evaluation scores with the training reward. Optional; added after the first
            version of this interface.
    """

    name: str
    tokenizer: PreTrainedTokenizerBase
    policy: PreTrainedModel
    train_prompts: Sequence[str]
    eval_prompts: Sequence[str]
    reward_function: RewardFunction | None = None
    reward_model: PreTrainedModel | None = None
    well_formed: Callable[[str, str], bool] | None = None
    config_overrides: dict[str, Any] = field(default_factory=dict)
    eval_reward_function: RewardFunction | None = None


TaskBuilder = Callable[[int], Task]
"""``build(seed) -> Task``: builds (and warms up) a task deterministically from a seed."""
