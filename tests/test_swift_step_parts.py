"""The pure parts of the ms-swift step runner (``ppo_ref.adapters.thirdparty.swift_step``), which
import neither ms-swift nor transformers: the prompt text the runner's dataset and generation stand-in
share, the right padding of a collated tensor, and the runner's contract attributes."""

from __future__ import annotations

import pytest
import torch

from ppo_ref.adapters.step import BUILTIN_STEP_RUNNERS, example_batch
from ppo_ref.adapters.step_kit import word_tokenizer
from ppo_ref.adapters.thirdparty import swift_step


def test_prompt_text_is_what_the_word_tokenizer_encodes_back() -> None:
    batch = example_batch(budget=6, prompt_length=9)
    tokenizer = word_tokenizer(batch.vocab_size, bos=None)
    for prompt in batch.prompt_ids:
        text = swift_step.prompt_text(prompt)
        assert tokenizer.encode(text, add_special_tokens=False) == list(prompt)
    assert swift_step.prompt_text((3, 4)) == "t3 t4"


@pytest.mark.parametrize("prompt", [(), (3, 1), (0, 4), [3, 4], (3, "4")])
def test_prompt_text_rejects_special_or_malformed_ids(prompt: object) -> None:
    with pytest.raises(ValueError, match="prompt"):
        swift_step.prompt_text(prompt)  # type: ignore[arg-type]


def test_right_pad_adds_columns_with_the_value_and_keeps_wider_tensors() -> None:
    ids = torch.tensor([[5, 6], [7, 0]])
    padded = swift_step._right_pad(ids, 4, 9)
    assert padded.tolist() == [[5, 6, 9, 9], [7, 0, 9, 9]]
    assert padded.dtype == ids.dtype
    assert swift_step._right_pad(ids, 2, 9) is ids
    assert swift_step._right_pad(ids, 1, 9) is ids


def test_the_runner_is_registered_and_lists_its_loss_types() -> None:
    assert BUILTIN_STEP_RUNNERS["swift"] == "ppo_ref.adapters.thirdparty.swift_step:make_step"
    assert swift_step.LOSS_MODES == ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo")
    assert dict(swift_step.MICRO_BATCH_LOCAL) == {}
    assert "engine.infer" in swift_step.SwiftGrpoStep.provenance
    assert "check_model=False" in swift_step.SwiftGrpoStep.provenance
