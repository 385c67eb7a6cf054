"""The character tokenizer: one token per character, exact round trips, left padding, pad == eos."""

from __future__ import annotations

import pytest

from ppo_ref.tasks.tokenizer import CHARACTERS, SPECIAL_TOKENS, build_char_tokenizer, char_vocabulary


def test_vocabulary_is_specials_then_characters() -> None:
    vocab = char_vocabulary()
    assert [vocab[token] for token in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert len(vocab) == len(SPECIAL_TOKENS) + len(CHARACTERS) == len(set(CHARACTERS)) + 4
    assert len(build_char_tokenizer()) == len(vocab)


def test_round_trip_one_token_per_character() -> None:
    tok = build_char_tokenizer()
    texts = [CHARACTERS, "the movie was great and fun.", "1234=4321", "  two  spaces ", "a"]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert len(ids) == len(text)  # no special token added, no merge
        assert tok.decode(ids) == text


def test_unknown_character_becomes_unk() -> None:
    tok = build_char_tokenizer()
    ids = tok("aZb")["input_ids"]
    assert ids[1] == tok.unk_token_id and len(ids) == 3


def test_left_padding_and_batch_decode() -> None:
    tok = build_char_tokenizer()
    batch = tok(["ab", "abcd"], padding=True)
    assert tok.padding_side == "left"
    assert batch["input_ids"][0][:2] == [tok.pad_token_id, tok.pad_token_id]
    assert batch["attention_mask"] == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert batch["input_ids"][0][2:] == batch["input_ids"][1][:2]
    assert tok.batch_decode(batch["input_ids"], skip_special_tokens=True) == ["ab", "abcd"]


def test_special_token_ids() -> None:
    tok = build_char_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.decode([4, 5, tok.eos_token_id], skip_special_tokens=True) == "ab"


def test_pad_equals_eos_option() -> None:
    default, shared = build_char_tokenizer(), build_char_tokenizer(pad_equals_eos=True)
    assert default.pad_token_id != default.eos_token_id
    assert shared.pad_token_id == shared.eos_token_id == default.eos_token_id
    # Same vocabulary: the same text gives the same ids, padding aside.
    assert shared("good.")["input_ids"] == default("good.")["input_ids"]
    batch = shared(["a", "abc"], padding=True)
    assert batch["input_ids"][0] == [shared.eos_token_id, shared.eos_token_id, 4]
    assert batch["attention_mask"][0] == [0, 0, 1]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="pad_equals_eos"):
        build_char_tokenizer(pad_equals_eos=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model_max_length"):
        build_char_tokenizer(model_max_length=1)
