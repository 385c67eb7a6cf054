"""Trainer-step tier for TRL 1.16's ``GRPOTrainer`` (spec STEP-1..5; contract :mod:`ppo_ref.adapters.step`).

Every run goes through the trainer's own code: ``GRPOTrainer.train()`` for one optimizer step
(``max_steps=1``) whose completions come from the public ``rollout_func`` argument (it returns
the batch's fixed prompt and completion ids); TRL then pads them (``pad_to_multiple_of`` gives the
extra padding columns), masks truncated rows (``mask_truncated_completions``), scores them with a
reward function that returns the batch's scores, computes the group advantages, shuffles and
splits the generation batch into ``gradient_accumulation_steps`` micro-batches
(``_prepare_inputs``), and runs ``training_step`` (``_compute_loss`` + backward) on each. The
gradient is read by a ``TrainerCallback.on_pre_optimizer_step`` (``max_grad_norm=0``: no clipping;
plain SGD). The model is a tiny GPT-2 built from a fixed seed with dropout 0, saved to and loaded
from a temporary directory; the tokenizer a local WordLevel vocabulary. bf16 and gradient
checkpointing are off (TRL's defaults turn them on).

Runs use ``num_iterations=2`` (of which ``max_steps=1`` takes the first): TRL then computes the
old log-probs in its rollout path (grpo_trainer.py, the ``generate_every`` branch) and the loss's
ratio is a real recomputation (with ``num_iterations=1`` it uses the detached current log-probs,
1 by construction). Statistics: ``max_abs_log_ratio`` over the loss's micro-batches,
``clipfrac`` = TRL's logged ``clip_ratio/region_mean`` (``cispo_clip_ratio`` for cispo),
``approx_kl`` None (TRL logs none without ``beta``).
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.step import StepBatch, StepResult

__all__ = ["TrlGrpoStep", "TrlStepAdapter", "make_adapter", "make_step"]

LOSS_MODES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")

MICRO_BATCH_LOCAL: Mapping[str, str] = MappingProxyType(
    {
        "bnpo": "trl/trainer/grpo_config.py loss_type doc: 'normalization is performed over the local "
        "batch only, so results may slightly vary depending on the local batch size'",
    }
)


class TrlGrpoStep:
    """One ``GRPOTrainer`` step on a :class:`StepBatch` (see the module docstring)."""

    name = "trl"
    loss_modes = LOSS_MODES
    micro_batch_local = MICRO_BATCH_LOCAL
    provenance = (
        "trl.GRPOTrainer.train (max_steps=1) with rollout_func: _generate_and_score_completions "
        "(padding, mask_truncated_completions, group advantages), _prepare_inputs (shuffle, split into "
        "gradient_accumulation_steps), training_step/_compute_loss per loss_type; gradient read at "
        "on_pre_optimizer_step"
    )

    def __init__(self, seed: int = 0) -> None:
        self.version = str(importlib.import_module("trl").__version__)
        self.seed = seed
        self._dir = tempfile.mkdtemp(prefix="ppo-ref-trl-step-")
        self._saved: dict[int, tuple[str, str]] = {}

    def _model_and_tokenizer(self, vocab_size: int) -> tuple[str, Any]:
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        from tokenizers.pre_tokenizers import WhitespaceSplit
        from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

        if vocab_size not in self._saved:
            vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
            core = Tokenizer(WordLevel(vocab, unk_token="<bos>"))
            core.pre_tokenizer = WhitespaceSplit()
            tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
                tokenizer_object=core,
                pad_token="<pad>",
                eos_token="<eos>",
                bos_token="<bos>",
                unk_token="<bos>",
            )
            torch.manual_seed(self.seed)
            config = GPT2Config(
                n_layer=2,
                n_head=2,
                n_embd=32,
                n_positions=64,
                vocab_size=vocab_size,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=2,
                eos_token_id=1,
                pad_token_id=0,
            )
            model = GPT2LMHeadModel(config)
            path = os.path.join(self._dir, f"model-{vocab_size}")
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            self._saved[vocab_size] = (path, path)
        path, tok_path = self._saved[vocab_size]
        return path, PreTrainedTokenizerFast.from_pretrained(tok_path)

    def _trainer(
        self,
        batch: StepBatch,
        loss_mode: str,
        micro_batches: int,
        pad_to: int | None,
        *,
        num_iterations: int = 1,
        mask_truncated: bool = False,
    ) -> tuple[Any, dict[str, Any]]:
        from transformers import GPT2LMHeadModel, TrainerCallback

        Dataset = importlib.import_module("datasets").Dataset
        trl = importlib.import_module("trl")
        GRPOConfig, GRPOTrainer = trl.GRPOConfig, trl.GRPOTrainer

        if loss_mode not in LOSS_MODES:
            raise ValueError(f"loss_mode: expected one of {LOSS_MODES}, got {loss_mode!r}")
        if not isinstance(micro_batches, int) or micro_batches < 1 or batch.size % micro_batches:
            raise ValueError(f"micro_batches: expected a divisor of {batch.size}, got {micro_batches!r}")
        longest = max(len(c) for c in batch.completions)
        if pad_to is not None and pad_to < max(longest, len(batch.prompt_ids[0])):
            raise ValueError(f"pad_to: expected >= the longest completion and prompt, got {pad_to}")
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        path, tokenizer = self._model_and_tokenizer(batch.vocab_size)
        model = GPT2LMHeadModel.from_pretrained(path)
        prompts = [f"g{g}" for g in range(len(batch.prompt_ids))]
        seen: dict[str, int] = {}

        def rollout(prompt_texts: list[Any], trainer: Any) -> dict[str, Any]:
            rows = []
            for text in prompt_texts:
                group = int(str(text)[1:])
                count = seen.get(str(text), 0)
                seen[str(text)] = count + 1
                rows.append(group * batch.group_size + count % batch.group_size)
            return {
                "prompt_ids": [list(batch.prompt_ids[r // batch.group_size]) for r in rows],
                "completion_ids": [list(batch.completions[r]) for r in rows],
                "logprobs": None,
                "row": rows,
            }

        def reward(prompts: list[Any], completions: list[Any], row: list[int], **_: Any) -> list[float]:
            return [float(batch.scores[r]) for r in row]

        record: dict[str, Any] = {"losses": [], "gradient": None, "ratio": 0.0}

        class Capture(TrainerCallback):
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                model = kwargs["model"]
                record["gradient"] = {
                    n: (
                        p.grad.detach().double().clone()
                        if p.grad is not None
                        else torch.zeros_like(p, dtype=torch.float64)
                    )
                    for n, p in model.named_parameters()
                }

        extra: dict[str, Any] = {}
        if loss_mode == "luspo":
            extra["importance_sampling_level"] = "sequence"
        config = GRPOConfig(
            output_dir=os.path.join(self._dir, "out"),
            use_cpu=True,
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            report_to="none",
            logging_strategy="no",
            save_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            log_completions=False,
            dataloader_num_workers=0,
            dataloader_pin_memory=False,
            num_generations=batch.group_size,
            max_completion_length=batch.budget,
            use_vllm=False,
            seed=self.seed,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            per_device_train_batch_size=batch.size // micro_batches,
            gradient_accumulation_steps=micro_batches,
            num_iterations=num_iterations,
            max_steps=1,
            learning_rate=1e-3,
            optim="sgd",
            max_grad_norm=0.0,
            loss_type=loss_mode,
            beta=0.0,
            pad_to_multiple_of=pad_to,
            mask_truncated_completions=mask_truncated,
            **extra,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            rollout_func=rollout,
            callbacks=[Capture()],
        )
        original_loss = trainer._compute_loss
        original_logps = trainer._get_per_token_logps_and_entropies
        current: dict[str, Any] = {}

        def logps(*args: Any, **kwargs: Any) -> Any:
            out = original_logps(*args, **kwargs)
            if torch.is_grad_enabled() and "inputs" in current:
                inputs = current["inputs"]
                old = inputs.get("old_per_token_logps")
                if old is not None:
                    mask = inputs["completion_mask"].bool()
                    diff = (out[0].detach() - old).abs()[mask]
                    if diff.numel():
                        record["ratio"] = max(record["ratio"], float(diff.max()))
            return out

        def compute(model: Any, inputs: dict[str, Any]) -> Tensor:
            current["inputs"] = inputs
            record.setdefault("masks", []).append(inputs["completion_mask"].detach().clone())
            loss: Tensor = original_loss(model, inputs)
            record["losses"].append(float(loss.detach()))
            for key in ("clip_ratio/region_mean", "cispo_clip_ratio"):  # cleared by train()'s last log
                values = trainer._metrics["train"].get(key)
                if values:
                    record.setdefault(key, []).append(float(values[-1]))
            return loss

        trainer._compute_loss = compute
        trainer._get_per_token_logps_and_entropies = logps
        record["trainer"] = trainer
        return trainer, record

    def run(
        self,
        batch: StepBatch,
        *,
        loss_mode: str,
        micro_batches: int = 1,
        pad_to: int | None = None,
        pad_fill: int | None = None,
        num_iterations: int = 2,
    ) -> StepResult:
        """One optimizer step of ``GRPOTrainer.train()`` on ``batch`` (module docstring)."""
        trainer, record = self._trainer(
            batch, loss_mode, micro_batches, pad_to, num_iterations=num_iterations
        )
        if pad_fill is not None:
            if not 0 <= pad_fill < batch.vocab_size or pad_fill == batch.eos_id:
                raise ValueError(
                    f"pad_fill: expected a non-EOS token id in [0, {batch.vocab_size}), got {pad_fill}"
                )
            trainer._tokenizer.pad_token = trainer._tokenizer.convert_ids_to_tokens(pad_fill)
        trainer.train()
        if record["gradient"] is None:
            raise RuntimeError("GRPOTrainer took no optimizer step")
        clip_key = "cispo_clip_ratio" if loss_mode == "cispo" else "clip_ratio/region_mean"
        clip = record.get(clip_key) or [float("nan")]
        stats: dict[str, float | None] = {
            "max_abs_log_ratio": record["ratio"] if num_iterations > 1 else None,  # else no old log-probs
            "clipfrac": float(sum(clip) / len(clip)),
            "approx_kl": None,
        }
        return StepResult(gradient=record["gradient"], loss=float(sum(record["losses"])), stats=stats)

    def truncated_rows(self, batch: StepBatch) -> tuple[bool, ...]:
        """Rows ``GRPOTrainer._generate_and_score_completions`` masks as truncated with
        ``mask_truncated_completions=True`` (its only truncation handling: a critic-free trainer
        bootstraps nothing): a row whose completion mask is all zero."""
        trainer, _ = self._trainer(batch, "dapo", 1, None, mask_truncated=True)
        trainer.model.train()
        prompts = [{"prompt": f"g{g}"} for g in range(len(batch.prompt_ids)) for _ in range(batch.group_size)]
        # unshuffled: rows come back in prompt order, occurrence j of prompt g is row g * group_size + j
        masks = trainer._generate_and_score_completions(prompts)["completion_mask"]
        return tuple(bool(m.sum() == 0) for m in masks)


def make_step() -> TrlGrpoStep | None:
    """The TRL step runner of the installed release: ``GRPOTrainer`` for trl >= 1.13 (needs its
    ``rollout_func``); None for older releases (their ``PPOTrainer`` has no step runner yet)."""
    version = str(importlib.import_module("trl").__version__)
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) < (1, 13):
        return None
    return TrlGrpoStep()


class TrlStepAdapter:
    """An adapter with no ops and the step runner only:
    ``--impl=ppo_ref.adapters.thirdparty.trl_step:make_adapter`` runs the trainer-step tier against
    the installed TRL (the op tier of TRL 1.16 is its own adapter's)."""

    name = "trl"
    ops: frozenset[str] = frozenset()
    conventions: Mapping[str, object] = MappingProxyType({})

    def __init__(self) -> None:
        self.version = str(importlib.import_module("trl").__version__)
        self.step = make_step()
        self.provenance = self.step.provenance if self.step is not None else "no step runner for this release"


def make_adapter() -> TrlStepAdapter:
    """The step-only TRL adapter (see :class:`TrlStepAdapter`)."""
    return TrlStepAdapter()
