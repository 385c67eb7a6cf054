"""Resolve what a run trains: a built-in task, or local checkpoints and a prompts file.

``--policy PATH`` replaces the task's policy (and tokenizer), ``--reward`` its reward (a local
reward-model checkpoint, or a Python function ``module:function``), and ``--prompts FILE.jsonl``
its prompts; the task is only built when one of the three is missing. The task's
``config_overrides`` apply to the fields the user did not set.

transformers and the trainer are imported only by :func:`build_setup`, so :func:`check_paths` (which
the command line runs before any work) is quick.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppo_ref.trainer.config import TrainerConfig, check_field_values
from ppo_ref.trainer.seeding import Stream, stream_rng

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ppo_ref.tasks.base import Task
    from ppo_ref.trainer.build import TrainingSetup

__all__ = [
    "RewardFunction",
    "available_tasks",
    "build_setup",
    "check_paths",
    "is_reward_function_spec",
    "load_prompts",
    "load_reward_function",
    "probe_reward_function",
    "prompts_file_summary",
]

RewardFunction = Callable[[Sequence[str], Sequence[str]], Sequence[float]]
"""``reward(prompts, responses) -> scores``: one finite float per response."""

_FUNCTION_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_reward_function_spec(value: str) -> bool:
    """True if ``value`` (a ``--reward`` value) names a Python function ``module:function`` rather
    than a reward-model directory (an existing path always counts as a directory)."""
    if not isinstance(value, str):
        raise ValueError(f"value: expected a string, got {type(value).__name__}")
    return bool(_FUNCTION_SPEC.match(value)) and not Path(value).exists()


def load_reward_function(spec: str) -> RewardFunction:
    """The function ``module:function`` (dots allowed on both sides) named by ``spec``.

    The module is imported as ``python -m`` would: the current directory comes first on
    ``sys.path``, then PYTHONPATH. The function must accept ``(prompts, responses)``, two lists of
    strings of equal length, and return one score per response. Raises ``ValueError`` naming the
    config field ``reward`` when it cannot be imported, is missing, or is not such a callable.
    """
    if not isinstance(spec, str) or not _FUNCTION_SPEC.match(spec):
        raise ValueError(f"config field 'reward': expected 'module:function', got {spec!r}")
    module_name, _, attribute = spec.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:
        raise ValueError(
            f"config field 'reward': cannot import module {module_name!r} of {spec!r} "
            f"({type(error).__name__}: {error}); it is looked up in the current directory and PYTHONPATH"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(
                f"config field 'reward': {spec!r}: {target.__name__!r} has no attribute {part!r}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"config field 'reward': {spec!r} is a {type(target).__name__}, not a function")
    try:
        inspect.signature(target).bind(["prompt"], ["response"])
    except TypeError:
        raise ValueError(
            f"config field 'reward': {spec!r} must accept (prompts, responses) and return one score per "
            f"response; its signature is {inspect.signature(target)}"
        ) from None
    except ValueError:
        pass  # no signature to inspect (a builtin): it is called and checked at run time
    function: RewardFunction = target
    return function


_PROBE_PROMPTS = ("a prompt", "another prompt", "a third prompt")
_PROBE_RESPONSES = ("a response", "", "another, longer response.")


def probe_reward_function(function: RewardFunction, spec: str, prompts: Sequence[str] = ()) -> None:
    """Call the reward function ``spec`` once on a probe batch of three samples (the first prompts
    of ``prompts``, else placeholders, with three made-up responses) and fail before any work if
    it does not return one score per response.

    A function that raises on the probe is left to the run, which checks every batch (its
    ``on_bad_score``); only the number of scores is checked here. Raises ``ValueError`` naming the
    config field ``reward``.
    """
    if not callable(function):
        raise ValueError(f"function: expected a callable, got {type(function).__name__}")
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"spec: expected the --reward value, got {spec!r}")
    pool = [p for p in prompts if isinstance(p, str)] or list(_PROBE_PROMPTS)
    probe_prompts = [pool[i % len(pool)] for i in range(len(_PROBE_RESPONSES))]
    try:
        result = function(probe_prompts, list(_PROBE_RESPONSES))
    except Exception:
        return  # made-up inputs may be refused; the run's own batches are checked one by one
    try:
        count = len(list(result))
    except TypeError:
        raise ValueError(
            f"config field 'reward': {spec!r} returned a {type(result).__name__} for a probe batch of "
            f"{len(probe_prompts)} responses (checked before any work); expected a list of one score "
            "per response, in order"
        ) from None
    if count != len(probe_prompts):
        raise ValueError(
            f"config field 'reward': {spec!r} returned {count} score{'s' * (count != 1)} for a probe "
            f"batch of {len(probe_prompts)} responses (checked before any work); expected one score "
            "per response, in order"
        )


def available_tasks() -> list[str]:
    """Names of the built-in tasks (empty if the task registry is not available)."""
    try:
        from ppo_ref.tasks import TASKS  # type: ignore[attr-defined, unused-ignore]
    except ImportError:
        return []
    return sorted(TASKS)


def _build_task(name: str, seed: int) -> Task:
    from ppo_ref.tasks.base import Task

    try:
        from ppo_ref.tasks import get_task  # type: ignore[attr-defined, unused-ignore]
    except ImportError as error:
        raise ValueError(
            f"config field 'task': the task registry ppo_ref.tasks is unavailable ({error})"
        ) from None
    task = get_task(name, seed)
    if not isinstance(task, Task):
        raise ValueError(f"task {name!r}: the registry returned {type(task).__name__}, expected a Task")
    return task


def check_paths(config: TrainerConfig) -> None:
    """Fail before any work if --policy, --reference, --reward or --prompts do not exist or are not
    what they should be (a model directory with config.json, a reward function that imports and
    returns one score per response on a probe batch (:func:`probe_reward_function`), a valid
    prompts file), or the task is unknown."""
    if not isinstance(config, TrainerConfig):
        raise ValueError(f"config: expected a TrainerConfig, got {type(config).__name__}")
    reward_function: RewardFunction | None = None
    for name in ("policy", "reference", "reward", "prompts"):
        value = getattr(config, name)
        if value is None:
            continue
        if name == "reward" and is_reward_function_spec(value):
            reward_function = load_reward_function(value)
            continue
        if not Path(value).exists():
            hint = " (nor is it a Python function 'module:function')" if name == "reward" else ""
            raise ValueError(f"config field {name!r}: {value} does not exist{hint}")
        if name != "prompts" and not (Path(value) / "config.json").is_file():
            raise ValueError(
                f"config field {name!r}: {value} is not a local Hugging Face checkpoint (no config.json)"
            )
    train_prompts: list[str] = []
    if config.prompts is not None:
        train_prompts = load_prompts(config.prompts, config.seed)[0]
    if reward_function is not None and config.reward is not None:
        probe_reward_function(reward_function, config.reward, train_prompts)
    needs_task = config.policy is None or config.reward is None or config.prompts is None
    names = available_tasks()
    if needs_task and names and config.task not in names:
        raise ValueError(f"config field 'task': unknown task {config.task!r}; expected one of {names}")


def load_prompts(path: str | Path, seed: int) -> tuple[list[str], list[str]]:
    """``(train, eval)`` prompts from a JSONL file of ``{"prompt": str, "split": "train"|"eval"}``.

    Without any ``split`` field, a seeded 10% (at least one prompt) is held out for evaluation.
    Blank lines (empty or whitespace only) are skipped; :func:`prompts_file_summary` counts them.
    Errors name the file and the line.
    """
    rows, _ = _read_prompts(path)
    if any(split is not None for _, split in rows):
        train = [p for p, s in rows if s != "eval"]
        held_out = [p for p, s in rows if s == "eval"]
    else:
        if len(rows) < 2:
            raise ValueError(f"{path}: expected at least 2 prompts (one is held out for evaluation)")
        order = stream_rng(seed, Stream.HOLDOUT_SPLIT).permutation(len(rows)).tolist()
        cut = max(1, len(rows) // 10)
        held_out = [rows[i][0] for i in order[:cut]]
        train = [rows[i][0] for i in order[cut:]]
    if not train or not held_out:
        raise ValueError(f"{path}: expected at least one training and one evaluation prompt")
    return train, held_out


def prompts_file_summary(path: str | Path, seed: int) -> str:
    """What :func:`load_prompts` read from ``path``, for the command's status line: e.g.
    ``"20 prompts from p.jsonl (18 for training, 2 held out); 3 blank lines skipped"``."""
    train, held_out = load_prompts(path, seed)
    _, blank = _read_prompts(path)
    skipped = f"; {blank} blank line{'s' * (blank != 1)} skipped" if blank else ""
    return (
        f"{len(train) + len(held_out)} prompts from {path} ({len(train)} for training, "
        f"{len(held_out)} held out){skipped}"
    )


def _read_prompts(path: str | Path) -> tuple[list[tuple[str, str | None]], int]:
    """The ``(prompt, split)`` rows of a prompts file and the number of blank lines skipped (a
    trailing newline ends the last line: it is not a blank line)."""
    rows: list[tuple[str, str | None]] = []
    blank = 0
    try:
        with open(path, "rb") as handle:
            lines = handle.read().split(b"\n")
    except OSError as error:
        raise ValueError(f"{path}: cannot read the prompts file ({error.strerror})") from None
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a leading BOM is fine
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}:{number}: not UTF-8 text (byte {error.start} of the line)") from None
        if not line.strip():
            if number < len(lines) or line:  # the empty string after a final newline is no line
                blank += 1
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"]:
            raise ValueError(f'{path}:{number}: expected an object with a non-empty "prompt" string')
        split = item.get("split")
        if split not in (None, "train", "eval"):
            raise ValueError(f'{path}:{number}: "split" must be "train" or "eval", got {split!r}')
        rows.append((item["prompt"], split))
    if not rows:
        raise ValueError(f"{path}: no prompts (the file is empty or holds only blank lines)")
    return rows, blank


def _same_vocabulary(first: PreTrainedTokenizerBase, second: PreTrainedTokenizerBase) -> bool:
    return bool(first.get_vocab() == second.get_vocab())


def _load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_setup(config: TrainerConfig, user_fields: Collection[str]) -> tuple[TrainingSetup, TrainerConfig]:
    """Build the :class:`TrainingSetup` and the final config (task overrides below the user's values)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from ppo_ref.trainer.build import TrainingSetup

    check_paths(config)
    reward_function_spec = config.reward is not None and is_reward_function_spec(config.reward)
    task = None
    if config.policy is None or config.reward is None or config.prompts is None:
        task = _build_task(config.task, config.seed)
        overrides: dict[str, Any] = {k: v for k, v in task.config_overrides.items() if k not in user_fields}
        check_field_values(overrides, f"task {config.task!r} config_overrides")
        config = replace(config, **overrides)

    policy: PreTrainedModel
    if config.policy is not None:
        tokenizer = _load_tokenizer(config.policy)
        policy = AutoModelForCausalLM.from_pretrained(config.policy, dtype=torch.float32)
    else:
        assert task is not None
        tokenizer, policy = task.tokenizer, task.policy

    if config.prompts is not None:
        train_prompts, eval_prompts = load_prompts(config.prompts, config.seed)
    else:
        assert task is not None
        train_prompts, eval_prompts = list(task.train_prompts), list(task.eval_prompts)

    reward_function = reward_model = reward_tokenizer = None
    eval_reward_function = task.eval_reward_function if task is not None and config.prompts is None else None
    reward_name = None
    if config.reward is not None and reward_function_spec:
        reward_function, eval_reward_function = load_reward_function(config.reward), None
        reward_name = f"function {config.reward} (--reward)"
    elif config.reward is not None:
        reward_name = f"reward model {config.reward} (--reward)"
        reward_model = AutoModelForSequenceClassification.from_pretrained(config.reward, dtype=torch.float32)
        saved = any(
            (Path(config.reward) / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")
        )
        # Without a tokenizer of its own, the reward model is assumed to share the policy's.
        own_tokenizer = _load_tokenizer(config.reward) if saved else tokenizer
        reward_tokenizer = None if _same_vocabulary(own_tokenizer, tokenizer) else own_tokenizer
    else:
        assert task is not None
        reward_function, reward_model = task.reward_function, task.reward_model
        reward_name = (
            f"{'reward model' if reward_model is not None else 'reward rule'} of task {config.task!r}"
        )
        if reward_model is not None and not _same_vocabulary(task.tokenizer, tokenizer):
            reward_tokenizer = task.tokenizer
    reference = None
    if config.reference is not None:
        reference = AutoModelForCausalLM.from_pretrained(config.reference, dtype=torch.float32)
    well_formed = task.well_formed if task is not None and config.prompts is None else None
    from_task = task is not None and config.policy is None
    name = config.task if from_task else str(config.policy)
    setup = TrainingSetup(
        tokenizer=tokenizer,
        policy=policy,
        train_prompts=train_prompts,
        eval_prompts=eval_prompts,
        reward_function=reward_function,
        reward_model=reward_model,
        eval_reward_function=eval_reward_function,
        reward_tokenizer=reward_tokenizer,
        well_formed=well_formed,
        reference=reference,
        name=name,
        task=config.task if task is not None else None,
        reward_name=reward_name,
    )
    return setup, config
