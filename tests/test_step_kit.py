"""The step-runner kit (ppo_ref.adapters.step_kit): tiny models, tokenizer, batch layout, results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ppo_ref.adapters.step import example_batch
from ppo_ref.adapters.step_kit import (
    RowOrder,
    check_run,
    family_of,
    gradient_of,
    padded,
    save_tiny,
    step_result,
    tiny_config,
    tiny_model,
    word_tokenizer,
)

BATCH = example_batch()


def test_padded_layout_left_pads_prompts_and_right_pads_completions() -> None:
    layout = padded(BATCH)
    assert tuple(layout.prompt_ids.shape) == (8, 9) and tuple(layout.response_ids.shape) == (8, 6)
    assert layout.prompt_mask.all()  # the prompts need no padding at their own width
    assert layout.response_mask.sum(dim=1).tolist() == [len(c) for c in BATCH.completions]
    wide = padded(BATCH, pad_to=10, pad_fill=15)
    assert tuple(wide.prompt_ids.shape) == (8, 10) and tuple(wide.response_ids.shape) == (8, 10)
    assert wide.prompt_ids[:, 0].tolist() == [15] * 8 and wide.prompt_mask[:, 0].tolist() == [0] * 8
    assert wide.response_ids[1].tolist() == [*BATCH.completions[1], *[15] * 8]
    assert tuple(wide.input_ids.shape) == (8, 20) and int(wide.attention_mask.sum()) == int(
        layout.attention_mask.sum()
    )
    assert padded(BATCH, response_width=8).response_ids.shape[1] == 8
    with pytest.raises(ValueError, match="response_width"):
        padded(BATCH, response_width=3)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"loss_mode": "nope"}, "loss_mode"),
        ({"micro_batches": 3}, "micro_batches"),
        ({"micro_batches": 0}, "micro_batches"),
        ({"pad_to": 5}, "pad_to"),
        ({"pad_fill": 1}, "pad_fill"),
        ({"pad_fill": 99}, "pad_fill"),
    ],
)
def test_check_run_names_the_bad_argument(kwargs: dict[str, Any], argument: str) -> None:
    values: dict[str, Any] = {"loss_mode": "a", "micro_batches": 1, "pad_to": None, "pad_fill": None}
    values.update(kwargs)
    with pytest.raises(ValueError, match=f"^{argument}:"):
        check_run(
            BATCH, values["loss_mode"], ("a",), values["micro_batches"], values["pad_to"], values["pad_fill"]
        )
    assert check_run(BATCH, "a", ("a",), 4, 9, 15) == 15 and check_run(BATCH, "a", ("a",)) == BATCH.pad_id


def test_row_order_maps_requests_to_rows_and_back() -> None:
    order = RowOrder(BATCH)
    requests = [1, 0, 1, 0, 0, 1, 1, 0]
    rows = [order.next(g) for g in requests]
    assert rows == [4, 0, 5, 1, 2, 6, 7, 3]
    values = torch.tensor(rows, dtype=torch.float64)
    assert order.in_batch_order(values).tolist() == list(range(8))
    with pytest.raises(ValueError, match="group"):
        order.next(2)
    with pytest.raises(ValueError, match="values"):
        RowOrder(BATCH).in_batch_order(values)


def test_tokenizer_maps_words_to_the_batch_ids() -> None:
    tokenizer = word_tokenizer(16)
    assert tokenizer("t3 t15 <eos>")["input_ids"] == [3, 15, 1]
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    with pytest.raises(ValueError, match="eos"):
        word_tokenizer({"a": 0, "b": 1}, pad="a", eos="c", bos=None, unk="a")
    with pytest.raises(ValueError, match="padding_side"):
        word_tokenizer(16, padding_side="middle")


def test_tiny_models_of_both_families_are_seeded_and_small() -> None:
    gpt2, llama, qwen2 = (tiny_model(tiny_config(f), 0) for f in ("gpt2", "llama", "qwen2"))
    assert type(gpt2).__name__ == "GPT2LMHeadModel" and gpt2.config.n_embd == 32
    assert type(llama).__name__ == "LlamaForCausalLM" and type(qwen2).__name__ == "Qwen2ForCausalLM"
    again = tiny_model(tiny_config("gpt2"), 0, dtype=torch.float64)
    assert all(
        torch.equal(a.double(), b)
        for a, b in zip(gpt2.state_dict().values(), again.state_dict().values(), strict=True)
    )
    score = tiny_model(tiny_config("gpt2"), 1, head="score")
    assert type(score).__name__ == "GPT2ForSequenceClassification" and score.config.num_labels == 1
    with pytest.raises(ValueError, match="family"):
        tiny_config("bert-ish")
    with pytest.raises(ValueError, match="head"):
        tiny_model(tiny_config(), head="value")


def test_a_checkpoints_config_json_is_built_tiny(tmp_path: Path) -> None:
    checkpoint = {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "rope_theta": 1e6,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(checkpoint))
    assert family_of(str(tmp_path)) == "mistral"
    config = tiny_config(checkpoint)
    assert type(config).__name__ == "MistralConfig" and config.hidden_size == 32 and config.vocab_size == 16
    assert config.num_key_value_heads == 2 and config.num_hidden_layers == 2
    path = save_tiny(str(tmp_path / "tiny"), config)
    assert (Path(path) / "tokenizer.json").exists() and (Path(path) / "config.json").exists()
    with pytest.raises(ValueError, match="config"):
        family_of(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="family"):
        tiny_config({"model_type": "no-such-model"})


def test_step_result_from_a_models_gradient() -> None:
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    frozen = torch.nn.Linear(1, 1)
    gradient = gradient_of(
        [*model.named_parameters(), *(("f." + n, p) for n, p in frozen.named_parameters())]
    )
    assert gradient["weight"].dtype == torch.float64 and gradient["weight"].tolist() == [[1.0, 1.0]]
    assert gradient["f.weight"].tolist() == [[0.0]]
    result = step_result(gradient, [torch.tensor(0.5), 0.25], {"clipfrac": 0.0}, {"rewards": torch.zeros(8)})
    assert result.loss == 0.75 and result.stats == {
        "max_abs_log_ratio": None,
        "clipfrac": 0.0,
        "approx_kl": None,
    }
    assert result.outputs["rewards"].dtype == torch.float64
    with pytest.raises(ValueError, match="outputs"):
        step_result(gradient, [0.0], outputs={"returns": torch.zeros(8)})
    with pytest.raises(ValueError, match="losses"):
        step_result(gradient, [])
