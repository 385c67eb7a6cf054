"""Trainer-step tier for ms-swift 4.6.0's ``GRPOTrainer`` (spec STEP-1..8; contract
:mod:`ppo_ref.adapters.step`).

Every run goes through ms-swift's own pipeline and trainer, in this process, on the CPU (file:line of
the installed release, ``swift/...``):

- ``swift.pipelines.train.rlhf.SwiftRLHF`` with ``RLHFArguments(rlhf_type="grpo", tuner_type="full")``:
  the model and tokenizer loaded by ms-swift's ``get_model_processor`` from a temporary directory
  (``model_type="llama"``), the ``dummy`` template (``template/templates/utils.py:23-31``: the prompt is
  the query, no chat markup), the dataset (one row per prompt, a local JSONL) encoded by the
  pipeline, ``SwiftSft.run`` (pipelines/train/sft.py:164-189) building the ``GRPOTrainer`` and
  ``SwiftSft.train`` calling ``trainer.train()`` for one optimizer step (``max_steps=1``);
- the rollout: ``RolloutTrainerMixin._generate_completions`` -> ``_colocate_rollout`` -> ``_engine_infer``
  (rollout_mixin.py:1163-1380) -> ``GRPOSample.apply_rollout_output`` (rl_core/data.py:202-236: the
  response token ids, ``finish_reason``; ``is_truncated`` = ``finish_reason == "length"``, data.py:73);
- the reward: a reward function registered in ``swift.rewards.orms`` (ms-swift's plugin point) named
  in ``reward_funcs``, returning the batch's scores, called by ``score_completions``
  (rl_core/grpo_algorithm.py); advantages by ``GRPOTrainer._compute_advantages``
  (grpo_trainer.py:387-460 -> ``swift.rl_core.advantage.compute_advantages``, ms-swift's default
  ``advantage_estimator="grpo"``, ``scale_rewards="group"``) written per token by ``_postprocess_batch``;
- ``_prepare_batch_inputs`` (grpo_trainer.py:720-833): ``encode_sample`` (the template), the split into
  ``steps_per_generation`` = ``gradient_accumulation_steps`` micro-batches (``split_by_mini_batches``),
  ``collate_to_grpo_micro_batch`` (rlhf_trainers/utils.py:2200-2270: ms-swift's right-padded layout,
  completion mask from the labels), the old log-probs (always computed there), ``num_items_in_batch``;
- the loss: ``GRPOTrainer.compute_loss`` -> ``_compute_loss_and_metrics`` (grpo_trainer.py:934-1226,
  every ``loss_type`` listed in :data:`LOSS_MODES`), backward by transformers' ``Trainer.training_step``
  (dividing by the accumulation steps; ms-swift undoes it for its window-normalised types,
  ``_undo_gradient_accumulation_scaling``, grpo_trainer.py:1228-1241). The gradient is read by a
  ``TrainerCallback.on_pre_optimizer_step`` (``max_grad_norm=0``: no clipping; plain SGD).

Stand-ins (also listed in ``provenance``):

- the generation engine: ``trainer.engine.infer`` (ms-swift's ``TransformersEngine``, which samples)
  answers each request with the batch's completion for its prompt as a ``ChatCompletionResponse``
  with ms-swift's ``finish_reason`` (``"stop"`` when it ends with EOS, ``"length"`` when it fills
  ``max_completion_length`` = the budget), as vLLM or the engine would report it;
- ``check_model=False``: ms-swift's trainer otherwise asks the ModelScope hub whether the local model
  is the latest (trainers/mixin.py:91-99; no network here);
- extra padding columns (``pad_to``): ms-swift pads a batch to its longest sequence and honours
  ``padding_to`` only under Megatron (template/base.py:2137-2139), so the collated ``input_ids`` /
  ``attention_mask`` / ``labels`` of each micro-batch get extra right-padding columns (the pad token,
  0, -100) up to a multiple of ``pad_to`` after ``template.data_collator``; ms-swift's layout has no
  separate prompt padding (the sequence, prompt and completion together, is right-padded,
  template/base.py:2070, 2363-2366), so both STEP-3 variants add columns on the right;
- the tiny model is a Llama (:func:`ppo_ref.adapters.step_kit.tiny_config`): ms-swift has no GPT-2
  model type, and transformers 5's ``AutoTokenizer`` loads the word tokenizer saved with a Qwen2
  checkpoint as a ``Qwen2Tokenizer`` that encodes its words to nothing; no BOS token (the template's
  ``auto_add_bos`` then adds none, so the prompt is exactly the batch's).

None of them changes a reward, the loss or its normalisation.

STEP-5: :meth:`SwiftGrpoStep.truncation_run` switches on ms-swift's truncation handling,
``overlong_filter=True`` (grpo_trainer.py:968-973: rows whose ``truncated_mask`` is set are removed
from the completion mask); its outputs are the completion mask the loss used
(``_compute_loss_and_metrics``' ``metrics_data["completion_mask"]``), the advantages and the rewards.

Statistics: ``max_abs_log_ratio`` over the loss's micro-batches (the log-probs of the loss's forward
against ``grpo_batch.old_per_token_logps``), ``clipfrac`` = ``region_clip_mean`` of
``metrics_data["clipping"]`` (``cispo_clip_ratio`` for cispo; NaN for sapo, which logs none),
``approx_kl`` None (``beta=0``: ms-swift computes no KL).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.step import StepBatch, StepResult
from ppo_ref.adapters.step_kit import (
    RowOrder,
    check_run,
    gradient_of,
    padded_width,
    save_tiny,
    step_result,
    tiny_config,
    word_tokenizer,
)

__all__ = ["LOSS_MODES", "SwiftGrpoStep", "SwiftStepAdapter", "make_adapter", "make_step", "prompt_text"]

LOSS_MODES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo")
"""ms-swift's ``loss_type`` values with a policy-gradient loss (grpo_trainer.py:1021-1108); ``real``
and ``fipo`` are left out (a listwise loss and a Future-KL reweighting of dapo's)."""

MICRO_BATCH_LOCAL: Mapping[str, str] = MappingProxyType({})
"""ms-swift documents no loss type as normalised within a micro-batch."""

REWARD_NAME = "ppo_ref_step_scores"
"""The name the runner's reward function is registered under in ``swift.rewards.orms``."""


def prompt_text(prompt: tuple[int, ...]) -> str:
    """The query text of a prompt for the word tokenizer (``t{id}`` words; ids >= 3 only).

    Example: ``prompt_text((3, 4)) == "t3 t4"``."""
    if not isinstance(prompt, tuple) or not prompt or not all(isinstance(t, int) and t >= 3 for t in prompt):
        raise ValueError(f"prompt: expected a non-empty tuple of ordinary token ids (>= 3), got {prompt!r}")
    return " ".join(f"t{t}" for t in prompt)


def _right_pad(tensor: Tensor, width: int, value: int) -> Tensor:
    extra = width - tensor.shape[-1]
    if extra <= 0:
        return tensor
    filler = torch.full((*tensor.shape[:-1], extra), value, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, filler], dim=-1)


class SwiftGrpoStep:
    """One optimizer step of ms-swift's ``GRPOTrainer`` on a :class:`StepBatch` (module docstring)."""

    name = "swift"
    loss_modes = LOSS_MODES
    micro_batch_local = MICRO_BATCH_LOCAL
    accumulation_setting = (
        "RLHFArguments.gradient_accumulation_steps (the runner's micro-batches, steps_per_generation "
        "the same: transformers Trainer.training_step divides each accumulation step's loss by it, and "
        "ms-swift undoes that for its window-normalised loss types, _undo_gradient_accumulation_scaling, "
        "swift/rlhf_trainers/grpo_trainer.py:1228-1241; ms-swift #10116/#10117)"
    )
    provenance = (
        "swift.pipelines.train.rlhf.SwiftRLHF (rlhf_type=grpo, tuner_type=full, template dummy, "
        "max_steps=1): "
        "GRPOTrainer.train -> _prepare_inputs/_generate_and_score_completions (apply_rollout_output, "
        "score_completions, _compute_advantages -> swift.rl_core.advantage.compute_advantages, "
        "_prepare_batch_inputs: encode_sample, split_by_mini_batches, collate_to_grpo_micro_batch, old "
        "log-probs) and compute_loss -> _compute_loss_and_metrics per loss_type; gradient read at "
        "on_pre_optimizer_step; outputs: the loss's completion_mask (metrics_data), grpo_batch.advantages, "
        "the reward function's values. Stand-ins: trainer.engine.infer returns the batch's completions "
        "with finish_reason stop/length; check_model=False (no hub); pad_to adds right-padding columns "
        "after template.data_collator (ms-swift honours padding_to under Megatron only); a tiny Llama "
        "(no GPT-2 model type in ms-swift)"
    )
    truncation_convention = None

    family = "llama"
    """The model the runner builds: a tiny Llama (rotary positions), and no other
    family: STEP-7 (left padding on GPT-2) is not run."""

    def __init__(self, seed: int = 0) -> None:
        self.version = str(importlib.import_module("swift").__version__)
        self.seed = seed
        self._dir = tempfile.mkdtemp(prefix="ppo-ref-swift-step-")

    def _model_path(self, vocab_size: int) -> str:
        path = os.path.join(self._dir, f"model-{vocab_size}")
        if not os.path.isdir(path):
            tokenizer = word_tokenizer(vocab_size, bos=None)
            save_tiny(path, tiny_config(self.family, vocab_size, bos_id=None), self.seed, tokenizer)
        return path

    def _dataset(self, batch: StepBatch) -> str:
        path = os.path.join(self._dir, f"prompts-{abs(hash(batch.prompt_ids))}.jsonl")
        with open(path, "w", encoding="utf-8") as handle:
            for prompt in batch.prompt_ids:
                handle.write(
                    json.dumps({"messages": [{"role": "user", "content": prompt_text(prompt)}]}) + "\n"
                )
        return path

    def _train(
        self,
        batch: StepBatch,
        loss_mode: str,
        micro_batches: int,
        pad_to: int | None,
        fill: int,
        *,
        overlong_filter: bool = False,
    ) -> dict[str, Any]:
        from transformers import TrainerCallback

        protocol = importlib.import_module("swift.infer_engine.protocol")
        orms = importlib.import_module("swift.rewards").orms
        rlhf = importlib.import_module("swift.pipelines.train.rlhf")
        arguments = importlib.import_module("swift.arguments")
        texts = [prompt_text(p) for p in batch.prompt_ids]
        order = RowOrder(batch)
        words = word_tokenizer(batch.vocab_size, bos=None)
        record: dict[str, Any] = {"losses": [], "ratio": 0.0, "clip": [], "masks": [], "advantages": []}
        record["order"] = order

        class Scores:  # an ms-swift ORM: called with the completions in request order
            def __init__(self, *_: Any, **__: Any) -> None:
                self.calls = 0

            def __call__(self, completions: list[Any], **_: Any) -> list[float]:
                rows = order.rows[self.calls : self.calls + len(completions)]
                self.calls += len(completions)
                values = [float(batch.scores[r]) for r in rows]
                record["rewards"] = values
                return values

        orms[REWARD_NAME] = Scores

        def infer(requests: list[Any], request_config: Any = None, **_: Any) -> list[Any]:
            out = []
            for request in requests:
                row = order.next(texts.index(str(request.messages[0]["content"])))
                tokens = list(batch.completions[row])
                reason = "stop" if tokens[-1] == batch.eos_id else "length"
                choice = protocol.ChatCompletionResponseChoice(
                    index=0,
                    message=protocol.ChatMessage(role="assistant", content=words.decode(tokens)),
                    finish_reason=reason,
                    token_ids=tokens,
                )
                prompt = len(batch.prompt_ids[0])
                usage = protocol.UsageInfo(prompt, len(tokens), prompt + len(tokens))
                out.append(protocol.ChatCompletionResponse(model="tiny", choices=[choice], usage=usage))
            return out

        class Capture(TrainerCallback):
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                record["gradient"] = gradient_of(kwargs["model"].named_parameters())

        def instrument(trainer: Any) -> None:
            trainer.engine.infer = infer
            trainer.add_callback(Capture())
            tokenizer = trainer.template.tokenizer
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(fill)
            collate = trainer.template.data_collator
            if pad_to is not None:

                def widened(encoded: list[Any], *args: Any, **kwargs: Any) -> Any:
                    res = collate(encoded, *args, **kwargs)
                    width = padded_width(int(res["input_ids"].shape[-1]), pad_to)
                    for key, value in (("input_ids", fill), ("attention_mask", 0), ("labels", -100)):
                        if key in res:
                            res[key] = _right_pad(res[key], width, value)
                    return res

                trainer.template.data_collator = widened
            logps = trainer._get_per_token_logps_and_entropies
            core = trainer._compute_loss_and_metrics
            step = trainer.training_step
            current: dict[str, Any] = {}

            def spy_logps(model: Any, model_inputs: Any, grpo_batch: Any, *args: Any, **kwargs: Any) -> Any:
                out = logps(model, model_inputs, grpo_batch, *args, **kwargs)
                old = grpo_batch.old_per_token_logps
                if torch.is_grad_enabled() and old is not None:
                    diff = (out[0].detach() - old).abs()[grpo_batch.completion_mask.bool()]
                    if diff.numel():
                        record["ratio"] = max(record["ratio"], float(diff.max()))
                return out

            def spy_core(model: Any, model_inputs: Any, grpo_batch: Any) -> Any:
                loss, metrics = core(model, model_inputs, grpo_batch)
                clipping = metrics.get("clipping") or {}
                clip = clipping.get("cispo_clip_ratio", clipping.get("region_clip_mean", math.nan))
                record["clip"].append(float(clip))
                record["masks"].append(metrics["completion_mask"].detach().double())
                record["advantages"].append(grpo_batch.advantages.detach().double())
                current["loss"] = loss
                return loss, metrics

            def spy_step(model: Any, inputs: Any, num_items_in_batch: Any = None) -> Tensor:
                out: Tensor = step(model, inputs, num_items_in_batch)
                record["losses"].append(float(out))  # the backward loss (after the accumulation division)
                return out

            trainer._get_per_token_logps_and_entropies = spy_logps
            trainer._compute_loss_and_metrics = spy_core
            trainer.training_step = spy_step

        pipeline: Any = rlhf.SwiftRLHF

        class Pipeline(pipeline):  # type: ignore[misc]
            def train(self, trainer: Any) -> Any:
                instrument(trainer)
                record["trainer"] = trainer
                return super().train(trainer)

        size = batch.size // micro_batches
        args = arguments.RLHFArguments(
            model=self._model_path(batch.vocab_size), model_type="llama", template="dummy", rlhf_type="grpo",
            tuner_type="full", torch_dtype="float32", dataset=[self._dataset(batch)], split_dataset_ratio=0,
            dataset_shuffle=False, reward_funcs=[REWARD_NAME], loss_type=loss_mode, beta=0.0,
            num_generations=batch.group_size, max_completion_length=batch.budget, max_steps=1,
            per_device_train_batch_size=size, gradient_accumulation_steps=micro_batches,
            steps_per_generation=micro_batches, num_iterations=1, learning_rate=1e-3, optim="sgd",
            max_grad_norm=0.0, lr_scheduler_type="constant", warmup_ratio=0.0, weight_decay=0.0,
            use_vllm=False, gradient_checkpointing=False, overlong_filter=overlong_filter, report_to=["none"],
            output_dir=os.path.join(self._dir, "out"), save_strategy="no", logging_steps=1,
            dataloader_num_workers=0, seed=self.seed, data_seed=self.seed, check_model=False,
            log_completions=False,
        )  # fmt: skip
        Pipeline(args).main()
        return record

    def run(
        self,
        batch: StepBatch,
        *,
        loss_mode: str,
        micro_batches: int = 1,
        pad_to: int | None = None,
        pad_fill: int | None = None,
    ) -> StepResult:
        """One optimizer step of ms-swift's ``GRPOTrainer.train()`` on ``batch`` (module docstring)."""
        fill = check_run(batch, loss_mode, LOSS_MODES, micro_batches, pad_to, pad_fill)
        record = self._train(batch, loss_mode, micro_batches, pad_to, fill)
        if "gradient" not in record:
            raise RuntimeError("ms-swift's GRPOTrainer took no optimizer step")
        clip = [c for c in record["clip"] if c == c]
        stats: dict[str, float | None] = {
            "max_abs_log_ratio": record["ratio"],
            "clipfrac": sum(clip) / len(clip) if clip else math.nan,
            "micro_batches_run": float(len(record["losses"])),
            "columns": float(record["masks"][0].shape[-1]) if record["masks"] else math.nan,
        }
        return step_result(record["gradient"], record["losses"], stats, self._outputs(batch, record))

    def _outputs(self, batch: StepBatch, record: dict[str, Any]) -> dict[str, Tensor]:
        """The loss's completion masks and the advantages of every micro-batch (request order), and
        the rewards, put back in batch order; each row's completion columns only."""
        width = max(len(c) for c in batch.completions)
        masks = torch.cat([_right_pad(m, width, 0)[:, :width] for m in record["masks"]])
        advantages = torch.cat([_right_pad(a, width, 0)[:, :width] for a in record["advantages"]])
        order: RowOrder = record["order"]
        return {
            "loss_mask": order.in_batch_order(masks),
            "advantages": order.in_batch_order(advantages),
            "rewards": order.in_batch_order(torch.tensor(record["rewards"], dtype=torch.float64)),
        }

    def truncation_run(self, batch: StepBatch) -> StepResult:
        """A step with ``overlong_filter=True`` (ms-swift's truncation handling; module docstring)."""
        fill = check_run(batch, "grpo", LOSS_MODES)
        record = self._train(batch, "grpo", 1, None, fill, overlong_filter=True)
        return StepResult(gradient={}, loss=0.0, stats={}, outputs=self._outputs(batch, record))


def make_step() -> SwiftGrpoStep:
    """The ms-swift step runner (``GRPOTrainer`` of ms-swift 4.6)."""
    return SwiftGrpoStep()


class SwiftStepAdapter:
    """An adapter with no ops and the step runner only (the op tier is
    :mod:`ppo_ref.adapters.thirdparty.swift`'s)."""

    name = "swift"
    ops: frozenset[str] = frozenset()
    conventions: Mapping[str, object] = MappingProxyType({})

    def __init__(self) -> None:
        self.step = make_step()
        self.version = self.step.version
        self.provenance = self.step.provenance


def make_adapter() -> SwiftStepAdapter:
    """The step-only ms-swift adapter (see :class:`SwiftStepAdapter`)."""
    return SwiftStepAdapter()
