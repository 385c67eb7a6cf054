"""The built-in tasks' character-level tokenizer, defined entirely in the repository (no download).

One token per character: lowercase letters, digits, the space and a few punctuation marks, plus the
special tokens ``<pad>``, ``<bos>``, ``<eos>`` and ``<unk>`` (any other character, e.g. an uppercase
letter, becomes ``<unk>``). It is a ``tokenizers`` WordLevel model behind a pre-tokenizer that splits
the text into single characters, with a decoder that glues them back together, wrapped in a
``PreTrainedTokenizerFast`` that pads on the left. No special token is added when encoding: a text
``"ab"`` encodes to exactly two ids.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = [
    "BOS_TOKEN",
    "CHARACTERS",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "UNK_TOKEN",
    "build_char_tokenizer",
    "char_vocabulary",
]

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
"""Special tokens, with ids 0, 1, 2 and 3 in this order."""

CHARACTERS: str = string.ascii_lowercase + string.digits + " .,=!?:;'-"
"""Every character the tokenizer knows, one token each, with ids following the special tokens."""


def char_vocabulary() -> dict[str, int]:
    """Return the token -> id map: the special tokens first, then :data:`CHARACTERS` in order."""
    tokens = [*SPECIAL_TOKENS, *CHARACTERS]
    return {token: index for index, token in enumerate(tokens)}


def build_char_tokenizer(
    pad_equals_eos: bool = False, model_max_length: int = 128
) -> PreTrainedTokenizerFast:
    """Build the character tokenizer (left padding, no special tokens added on encode).

    Args:
        pad_equals_eos: if True, the padding token is ``<eos>`` (``pad_token_id == eos_token_id``),
            as in many chat models; the vocabulary is the same either way, so a model trained with
            one variant reads text encoded by the other.
        model_max_length: the longest sequence (in characters, i.e. tokens) the models accept.

    Example:
        >>> tok = build_char_tokenizer()
        >>> tok(["ab", "abc"], padding=True)["input_ids"]
        [[0, 4, 5], [4, 5, 6]]
        >>> tok.decode([4, 5, 2], skip_special_tokens=True)
        'ab'
    """
    if not isinstance(pad_equals_eos, bool):
        raise ValueError(f"pad_equals_eos: expected a bool, got {type(pad_equals_eos).__name__}")
    if isinstance(model_max_length, bool) or not isinstance(model_max_length, int) or model_max_length < 2:
        raise ValueError(f"model_max_length: expected an int >= 2, got {model_max_length!r}")
    backend = Tokenizer(models.WordLevel(char_vocabulary(), unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        pad_token=EOS_TOKEN if pad_equals_eos else PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        model_max_length=model_max_length,
    )
