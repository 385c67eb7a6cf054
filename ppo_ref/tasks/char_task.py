"""The one builder behind the tiny character-level tasks (``positive-review``, ``reverse``, ``length``).

Each of those tasks is the same recipe with its own data and reward: the character tokenizer, a
freshly initialised tiny GPT-2 seeded by the task's seed, a supervised warm-up on the task's
generated texts, and a :class:`~ppo_ref.tasks.base.Task` with the task's scorer, format check and
``max_new_tokens``. Only the data and the reward live in the task's own module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ppo_ref.tasks._checks import check_seed
from ppo_ref.tasks.base import RewardFunction, Task
from ppo_ref.tasks.models import build_policy, sft_warmup, tiny_gpt2_config
from ppo_ref.tasks.tokenizer import build_char_tokenizer

__all__ = ["build_char_task"]


def build_char_task(
    name: str,
    seed: int,
    prompts: tuple[Sequence[str], Sequence[str]],
    sft_texts: Callable[[Sequence[str]], list[str]],
    reward_function: RewardFunction,
    well_formed: Callable[[str, str], bool],
    max_new_tokens: int,
    sft_steps: int,
    sft_batch_size: int,
    sft_lr: float,
) -> Task:
    """A tiny GPT-2 with the character tokenizer, warmed up on ``sft_texts(train_prompts)``.

    Args:
        name: the task's ``--task`` name.
        seed: seeds the policy's initialisation and its warm-up (the caller's data has its own RNGs).
        prompts: ``(train_prompts, eval_prompts)``.
        sft_texts: the warm-up texts (prompt and response) drawn from the train prompts.
        reward_function: the task's score of responses.
        well_formed: the task's format check, for ``well_formed_rate``.
        max_new_tokens: the trainer's response-length limit this task sets by default.
        sft_steps, sft_batch_size, sft_lr: the warm-up's optimizer steps, batch size and learning rate.
    """
    check_seed(seed)
    tokenizer = build_char_tokenizer()
    train_prompts, eval_prompts = prompts
    policy = build_policy(tiny_gpt2_config(tokenizer), seed)
    texts = sft_texts(train_prompts)
    sft_warmup(policy, tokenizer, texts, steps=sft_steps, lr=sft_lr, seed=seed, batch_size=sft_batch_size)
    return Task(
        name=name,
        tokenizer=tokenizer,
        policy=policy,
        train_prompts=train_prompts,
        eval_prompts=eval_prompts,
        reward_function=reward_function,
        well_formed=well_formed,
        config_overrides={"max_new_tokens": max_new_tokens},
    )
