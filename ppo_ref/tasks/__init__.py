"""Built-in offline tasks: a tiny GPT-2, a character tokenizer and generated data, no downloads.

``TASKS`` maps each task's command-line name to its builder; ``get_task(name, seed)`` builds one.
Every builder is deterministic: the same seed gives the same prompts and the same weights.

* ``positive-review`` (the default): rule score, the mean lexicon value (+1/-1) of the two
  adjectives in ``" {adj} and {adj}."``, -1 if malformed; in [-1, 1].
* ``positive-review-rm``: the same texts scored by a Bradley-Terry reward model trained on generated
  preference pairs (unbounded, about unit spread); the rule score is ``Task.eval_reward_function``.
* ``reverse``: verifier, 1 if the answer is the prompt's four digits reversed, else 0.
* ``length``: ``clip(1 - |words - 5| / 3, -1, 1)``, -1 if malformed; in [-1, 1].
* ``smollm2-sentiment``: the "real model" preset, the pretrained SmolLM2-135M-Instruct rewarded by the
  VADER compound sentiment of its answer, in [-1, 1]; needs optional packages (see its module).
"""

from __future__ import annotations

from ppo_ref.tasks.base import RewardFunction, Task, TaskBuilder
from ppo_ref.tasks.length import build_length
from ppo_ref.tasks.reverse import build_reverse
from ppo_ref.tasks.review import build_positive_review, build_positive_review_rm
from ppo_ref.tasks.smollm2 import build_smollm2_sentiment

__all__ = ["DEFAULT_TASK", "TASKS", "RewardFunction", "Task", "TaskBuilder", "get_task"]

DEFAULT_TASK = "positive-review"

TASKS: dict[str, TaskBuilder] = {
    "positive-review": build_positive_review,
    "positive-review-rm": build_positive_review_rm,
    "reverse": build_reverse,
    "length": build_length,
    "smollm2-sentiment": build_smollm2_sentiment,
}
"""Task name (``--task``) -> ``build(seed) -> Task``."""


def get_task(name: str, seed: int) -> Task:
    """Build the task called ``name`` with ``seed``; a ``ValueError`` lists the names if it is unknown."""
    if not isinstance(name, str) or name not in TASKS:
        raise ValueError(f"name: unknown task {name!r}; expected one of {', '.join(sorted(TASKS))}")
    return TASKS[name](seed)
