"""The step-runner kit: what every trainer-step runner (spec STEP-1..8) needs besides the library call.

A runner (:class:`ppo_ref.adapters.step.StepRunner`) feeds the suite's fixed batch to a library's
own training step. This module holds the parts that do not depend on the library, so that a runner
is the library call and little else:

- :func:`tiny_config` / :func:`tiny_model` / :func:`save_tiny`: the tiny models of two families
  built from configs, never downloaded: an absolute-position GPT-2 (``"gpt2"``) and rotary
  Llama / Qwen2 models (``"llama"``, ``"qwen2"``), or any causal-LM family transformers knows,
  shrunk from a checkpoint's ``config.json`` (:func:`tiny_config` with a mapping);
- :func:`word_tokenizer` / :func:`step_vocabulary`: the in-repo word-level tokenizer (``<pad>`` 0,
  ``<eos>`` 1, ``<bos>`` 2, then ``t3`` ..), so token ids and texts map one to one;
- :func:`check_run` and :func:`padded`: a run's arguments validated once, and the batch laid out
  as a trainer receives it (prompts left-padded, completions right-padded, to the library's own
  width or to ``pad_to``, with ``pad_fill`` in every padding slot);
- :class:`RowOrder`: which batch row a library's request for "the next completion of prompt g" is;
- :func:`gradient_of` and :func:`step_result`: the accumulated ``.grad`` of a model and the
  library's per-token outputs turned into a :class:`~ppo_ref.adapters.step.StepResult`.

transformers and tokenizers are imported when a function needs them (the contract module
:mod:`ppo_ref.adapters.step` imports only torch).

Example::

    >>> from ppo_ref.adapters.step import example_batch
    >>> from ppo_ref.adapters.step_kit import padded
    >>> layout = padded(example_batch(), pad_to=9)
    >>> tuple(layout.prompt_ids.shape), tuple(layout.response_ids.shape)
    ((8, 9), (8, 9))
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.step import OUTPUTS, STEP_STATISTICS, StepBatch, StepResult

__all__ = [
    "FAMILIES",
    "Padded",
    "RowOrder",
    "check_run",
    "completion_logits",
    "family_of",
    "gradient_of",
    "padded",
    "padded_width",
    "save_tiny",
    "step_result",
    "step_vocabulary",
    "tiny_config",
    "tiny_model",
    "word_tokenizer",
]

FAMILIES: tuple[str, ...] = ("gpt2", "llama", "qwen2")
"""The named tiny families: GPT-2 (learned absolute positions: left padding without position ids
moves them) and Llama / Qwen2 (rotary: a uniform shift of positions changes nothing)."""

_SIZES: dict[str, int] = {
    # GPT-2 names, then the Llama-style names (a key present in a checkpoint's config is shrunk)
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 2,
    "n_inner": 64,
    "n_positions": 64,
    "n_ctx": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
}
_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "attention_dropout")
_DROPPED = ("layer_types", "sliding_window", "max_window_layers", "use_sliding_window", "rope_scaling")


def step_vocabulary(vocab_size: int = 16) -> dict[str, int]:
    """The runners' vocabulary: ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, then ``t3`` .. ``t{V-1}``."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 4:
        raise ValueError(f"vocab_size: expected an int >= 4, got {vocab_size!r}")
    return {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}


def word_tokenizer(
    vocab: Mapping[str, int] | int = 16,
    *,
    pad: str = "<pad>",
    eos: str = "<eos>",
    bos: str | None = "<bos>",
    unk: str = "<bos>",
    padding_side: str = "right",
) -> Any:
    """A whitespace-split word-level ``PreTrainedTokenizerFast`` over ``vocab`` (token -> id; an int:
    :func:`step_vocabulary` of that size). No special token is added on encode: ``"t3 t4"`` is 2 ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = step_vocabulary(vocab) if isinstance(vocab, int) else dict(vocab)
    for name, token in (("pad", pad), ("eos", eos), ("bos", bos), ("unk", unk)):
        if token is not None and token not in words:
            raise ValueError(f"{name}: {token!r} is not in the vocabulary")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side: expected 'left' or 'right', got {padding_side!r}")
    core = Tokenizer(WordLevel(words, unk_token=unk))
    core.pre_tokenizer = WhitespaceSplit()
    special = {"pad_token": pad, "eos_token": eos, "unk_token": unk}
    if bos is not None:
        special["bos_token"] = bos
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, padding_side=padding_side, **special
    )


def family_of(config: Mapping[str, Any] | str) -> str:
    """The ``model_type`` of a checkpoint's ``config.json`` (a path to it, to its folder, or its
    parsed contents), e.g. ``"qwen2"``."""
    import json

    if isinstance(config, str):
        path = os.path.join(config, "config.json") if os.path.isdir(config) else config
        try:
            with open(path, encoding="utf-8") as handle:
                config = json.load(handle)
        except (OSError, ValueError) as error:
            raise ValueError(f"config: cannot read a config.json from {path!r} ({error})") from None
    if not isinstance(config, Mapping) or not isinstance(config.get("model_type"), str):
        raise ValueError("config: a checkpoint's config.json must name its model_type")
    return str(config["model_type"])


def tiny_config(
    family: str | Mapping[str, Any] = "gpt2",
    vocab_size: int = 16,
    *,
    pad_id: int | None = 0,
    eos_id: int | None = 1,
    bos_id: int | None = 2,
    **extra: Any,
) -> Any:
    """A tiny transformers config: 2 layers, width 32, 2 heads, 64 positions, dropout 0.

    ``family`` is one of :data:`FAMILIES`, or a checkpoint's ``config.json`` contents (a mapping
    with its ``model_type``): that config with every size shrunk (the keys of ``_SIZES``), dropout
    0, the vocabulary and special ids replaced, so the family's code (positions, norms, attention)
    is the checkpoint's and no weight is read; sliding windows, per-layer types and rope scaling,
    which assume the full-size context, are dropped. ``extra`` overrides any field (e.g. ``n_embd=64``).
    """
    from transformers import AutoConfig, GPT2Config, LlamaConfig, Qwen2Config

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 4:
        raise ValueError(f"vocab_size: expected an int >= 4, got {vocab_size!r}")
    ids = {"pad_token_id": pad_id, "eos_token_id": eos_id, "bos_token_id": bos_id}
    if family == "gpt2":
        sizes = {k: _SIZES[k] for k in ("n_embd", "n_layer", "n_head", "n_positions")}
        drop = dict.fromkeys(_DROPOUTS[:4], 0.0)
        return GPT2Config(vocab_size=vocab_size, **{**sizes, **drop, **ids, **extra})
    if family in ("llama", "qwen2"):
        keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        sizes = {k: _SIZES[k] for k in (*keys, "num_key_value_heads", "max_position_embeddings")}
        kind = LlamaConfig if family == "llama" else Qwen2Config
        fields = {**sizes, "attention_dropout": 0.0, "tie_word_embeddings": False, **ids, **extra}
        return kind(vocab_size=vocab_size, **fields)
    if isinstance(family, str):
        raise ValueError(f"family: expected one of {FAMILIES} or a config.json mapping, got {family!r}")
    model_type = family_of(family)
    values = {k: v for k, v in family.items() if k not in ("model_type", "architectures", *_DROPPED)}
    values.update({k: v for k, v in _SIZES.items() if k in family})
    values.update({k: 0.0 for k in _DROPOUTS if k in family})
    values.update(vocab_size=vocab_size, tie_word_embeddings=False, **ids, **extra)
    values.pop("torch_dtype", None)
    values.pop("dtype", None)
    try:
        return AutoConfig.for_model(model_type, **values)
    except (ValueError, KeyError) as error:
        raise ValueError(f"family: transformers has no model_type {model_type!r} ({error})") from None


def tiny_model(config: Any, seed: int = 0, *, head: str = "lm", dtype: torch.dtype | None = None) -> Any:
    """The model of ``config`` with random weights from ``torch.manual_seed(seed)`` (the global
    generator, as the libraries' own examples seed it): ``head`` ``"lm"`` a causal LM, ``"score"``
    a one-label sequence classifier (a value or reward model); built in float32, then cast to
    ``dtype`` (so a float64 model holds the float32 model's weights exactly). Eval mode is left to
    the library."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    if head not in ("lm", "score"):
        raise ValueError(f"head: expected 'lm' or 'score', got {head!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an int, got {seed!r}")
    torch.manual_seed(seed)
    if head == "lm":
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    else:
        config.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.float32
        )
    return model if dtype is None else model.to(dtype)


def completion_logits(model: Any, batch: StepBatch, temperature: float = 1.0) -> Tensor:
    """(B, L, V) float64: ``model``'s logits divided by ``temperature`` at each completion position
    of ``batch`` (position t predicts completion token t; L the longest completion), with the
    prompts left-padded and ``position_ids = cumsum(mask) - 1``, without gradient: a runner's
    ``policy_logits`` (STEP-8) for a library whose model loads in transformers."""
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
        raise ValueError(f"temperature: expected a number > 0, got {temperature!r}")
    layout = padded(batch)
    mask = layout.attention_mask
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=layout.input_ids, attention_mask=mask, position_ids=positions).logits
    start = layout.prompt_ids.shape[1] - 1
    width = layout.response_ids.shape[1]
    scaled: Tensor = logits[:, start : start + width].double() / temperature
    return scaled


def save_tiny(directory: str, config: Any, seed: int = 0, tokenizer: Any = None) -> str:
    """:func:`tiny_model` of ``config`` saved with ``tokenizer`` (default :func:`word_tokenizer`
    of the config's vocabulary) in ``directory``, for a library that loads a model path."""
    model = tiny_model(config, seed)
    model.save_pretrained(directory)
    (tokenizer or word_tokenizer(int(config.vocab_size))).save_pretrained(directory)
    return directory


def padded_width(width: int, pad_to: int | None) -> int:
    """``width`` rounded up to a multiple of ``pad_to`` (None: ``width``)."""
    if pad_to is None:
        return width
    if isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < 1:
        raise ValueError(f"pad_to: expected an int >= 1 or None, got {pad_to!r}")
    return math.ceil(width / pad_to) * pad_to


def check_run(
    batch: StepBatch,
    loss_mode: str,
    loss_modes: Iterable[str],
    micro_batches: int = 1,
    pad_to: int | None = None,
    pad_fill: int | None = None,
) -> int:
    """Validate one :meth:`StepRunner.run` call; return the token id for the padding slots."""
    modes = tuple(loss_modes)
    if not isinstance(batch, StepBatch):
        raise ValueError(f"batch: expected a StepBatch, got {type(batch).__name__}")
    if loss_mode not in modes:
        raise ValueError(f"loss_mode: expected one of {modes}, got {loss_mode!r}")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches: expected a divisor of {batch.size}, got {micro_batches!r}")
    if batch.size % micro_batches:
        raise ValueError(f"micro_batches: expected a divisor of {batch.size}, got {micro_batches!r}")
    longest = max(len(batch.prompt_ids[0]), *(len(c) for c in batch.completions))
    if pad_to is not None and (isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < longest):
        raise ValueError(
            f"pad_to: expected None or an int >= the longest completion and prompt, got {pad_to!r}"
        )
    fill = batch.pad_id if pad_fill is None else pad_fill
    if isinstance(fill, bool) or not isinstance(fill, int) or not 0 <= fill < batch.vocab_size:
        raise ValueError(
            f"pad_fill: expected a non-EOS token id in [0, {batch.vocab_size}), got {pad_fill!r}"
        )
    if fill == batch.eos_id:
        raise ValueError(
            f"pad_fill: expected a non-EOS token id in [0, {batch.vocab_size}), got {pad_fill!r}"
        )
    return fill


@dataclass(frozen=True)
class Padded:
    """The batch as a trainer receives it: one row per completion (prompt ``i // group_size``).

    ``prompt_ids`` / ``prompt_mask`` (B, Wp) left-padded; ``response_ids`` / ``response_mask``
    (B, Wr) right-padded (the mask covers each completion's tokens, EOS included); ``lengths`` (B,)."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    lengths: Tensor

    @property
    def input_ids(self) -> Tensor:
        """(B, Wp + Wr) prompts and completions side by side."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        """(B, Wp + Wr) 1 on every real token."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)


def padded(
    batch: StepBatch,
    pad_to: int | None = None,
    pad_fill: int | None = None,
    response_width: int | None = None,
) -> Padded:
    """``batch`` laid out for a trainer: prompts left-padded to a multiple of ``pad_to`` (None: their
    length), completions right-padded to a multiple of ``pad_to`` of the longest (None:
    ``response_width``, default the longest), every padding slot holding ``pad_fill`` (None: the pad id)."""
    if not isinstance(batch, StepBatch):
        raise ValueError(f"batch: expected a StepBatch, got {type(batch).__name__}")
    fill = batch.pad_id if pad_fill is None else pad_fill
    if not isinstance(fill, int) or not 0 <= fill < batch.vocab_size:
        raise ValueError(f"pad_fill: expected a token id in [0, {batch.vocab_size}), got {pad_fill!r}")
    longest = max(len(c) for c in batch.completions)
    if response_width is not None and (not isinstance(response_width, int) or response_width < longest):
        raise ValueError(f"response_width: expected an int >= {longest}, got {response_width!r}")
    width_p = padded_width(len(batch.prompt_ids[0]), pad_to)
    width_r = padded_width(longest, pad_to) if pad_to is not None else (response_width or longest)
    rows = batch.size
    prompt_ids = torch.full((rows, width_p), fill, dtype=torch.long)
    prompt_mask = torch.zeros((rows, width_p), dtype=torch.long)
    response_ids = torch.full((rows, width_r), fill, dtype=torch.long)
    response_mask = torch.zeros((rows, width_r), dtype=torch.long)
    for i, completion in enumerate(batch.completions):
        prompt = batch.prompt_ids[i // batch.group_size]
        prompt_ids[i, width_p - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[i, width_p - len(prompt) :] = 1
        response_ids[i, : len(completion)] = torch.tensor(completion)
        response_mask[i, : len(completion)] = 1
    lengths = torch.tensor([len(c) for c in batch.completions])
    return Padded(prompt_ids, prompt_mask, response_ids, response_mask, lengths)


class RowOrder:
    """Maps a library's requests to batch rows: the k-th request for a completion of prompt ``g``
    is row ``g * group_size + k % group_size`` (a library that repeats each prompt ``group_size``
    times, in any order, gets each completion once per pass); :attr:`rows` records the order."""

    def __init__(self, batch: StepBatch) -> None:
        self.batch = batch
        self.rows: list[int] = []
        self._seen: dict[int, int] = {}

    def next(self, group: int) -> int:
        """The row answering the next request for prompt ``group``."""
        if not isinstance(group, int) or not 0 <= group < len(self.batch.prompt_ids):
            raise ValueError(
                f"group: expected a prompt index in [0, {len(self.batch.prompt_ids)}), got {group!r}"
            )
        count = self._seen.get(group, 0)
        self._seen[group] = count + 1
        row = group * self.batch.group_size + count % self.batch.group_size
        self.rows.append(row)
        return row

    def in_batch_order(self, values: Tensor) -> Tensor:
        """``values`` (one row per recorded request, in request order; the first B requests) put
        back in batch row order."""
        size = self.batch.size
        if len(self.rows) < size or values.shape[0] < size or sorted(self.rows[:size]) != list(range(size)):
            raise ValueError("values: the recorded requests do not cover every batch row once")
        out = torch.empty_like(values[:size])
        out[torch.tensor(self.rows[:size])] = values[:size]
        return out


def gradient_of(parameters: Iterable[tuple[str, torch.nn.Parameter]]) -> dict[str, Tensor]:
    """Parameter name -> float64 copy of its accumulated ``.grad`` (zeros where it has none; a
    sharded ``DTensor`` gradient gathered with ``full_tensor``)."""
    gradient: dict[str, Tensor] = {}
    for name, parameter in parameters:
        grad = parameter.grad
        if grad is None:
            gradient[name] = torch.zeros(parameter.shape, dtype=torch.float64)
            continue
        if hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()
        gradient[name] = grad.detach().double().clone()
    if not gradient:
        raise ValueError("parameters: no parameter to read a gradient from")
    return gradient


def step_result(
    gradient: Mapping[str, Tensor],
    losses: Iterable[float | Tensor],
    stats: Mapping[str, float | None] | None = None,
    outputs: Mapping[str, Tensor] | None = None,
) -> StepResult:
    """A :class:`StepResult`: the gradient, the sum of the micro-batches' backward ``losses``, the
    statistics (every name of :data:`STEP_STATISTICS` present, None where the library has none)
    and the library's per-row ``outputs`` (names of :data:`~ppo_ref.adapters.step.OUTPUTS`, row
    order of the batch), detached to float64."""
    values = [float(x) for x in losses]
    if not values:
        raise ValueError("losses: expected the loss of at least one micro-batch")
    given = dict(stats or {})
    full: dict[str, float | None] = {name: given.pop(name, None) for name in STEP_STATISTICS}
    full.update(given)
    out: dict[str, Tensor] = {}
    for name, value in (outputs or {}).items():
        if name not in OUTPUTS:
            raise ValueError(f"outputs: unknown name {name!r}, expected some of {tuple(OUTPUTS)}")
        out[name] = torch.as_tensor(value).detach().double().clone()
    return StepResult(gradient=dict(gradient), loss=sum(values), stats=full, outputs=out)
