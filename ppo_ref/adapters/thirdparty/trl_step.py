"""Trainer-step tier for TRL 1.16's ``GRPOTrainer`` (spec STEP-1..8; contract :mod:`ppo_ref.adapters.step`).

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

STEP-6: both runners' micro-batches are TRL's ``gradient_accumulation_steps`` (GRPO: one generation
batch of ``per_device_train_batch_size * steps_per_generation`` rows, ``steps_per_generation``
defaulting to the accumulation steps, split by ``_prepare_inputs``; PPO: the mini-batch's
micro-batches under ``accelerator.accumulate``). :meth:`TrlPpoStep.accumulation_run` runs PPO's
accumulation as a user's run has it, with accelerate's ``sync_with_dataloader`` left on (its
``run`` switches it off to measure the normalisation alone), and counts the optimizer steps.
"""

from __future__ import annotations

import importlib
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
    padded,
    save_tiny,
    step_result,
    tiny_config,
    tiny_model,
    word_tokenizer,
)

__all__ = ["OWNED", "TrlGrpoStep", "TrlPpoStep", "TrlStepAdapter", "make_adapter", "make_step"]

LOSS_MODES: tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")

OWNED: frozenset[str] = frozenset(
    {
        *("output_dir", "use_cpu", "report_to", "logging_strategy", "save_strategy", "eval_strategy"),
        *("disable_tqdm", "log_completions", "dataloader_num_workers", "dataloader_pin_memory", "seed"),
        *("num_generations", "max_completion_length", "max_steps", "per_device_train_batch_size"),
        *("gradient_accumulation_steps", "num_iterations", "learning_rate", "optim", "max_grad_norm"),
        *("lr_scheduler_type", "warmup_steps", "weight_decay", "use_vllm", "loss_type", "pad_to_multiple_of"),
        *("mask_truncated_completions", "bf16", "fp16", "steps_per_generation", "generation_batch_size"),
    }
)
"""``GRPOConfig`` fields :class:`TrlGrpoStep` sets itself: the fixed batch and its split, one plain-SGD
step read before it is taken, float32 on the CPU, the loss mode and padding of each run."""

MICRO_BATCH_LOCAL: Mapping[str, str] = MappingProxyType(
    {
        "bnpo": "trl/trainer/grpo_config.py loss_type doc: 'normalization is performed over the local "
        "batch only, so results may slightly vary depending on the local batch size'",
    }
)


class TrlGrpoStep:
    """One ``GRPOTrainer`` step on a :class:`StepBatch` (see the module docstring).

    ``family`` is the tiny model's family (:func:`ppo_ref.adapters.step_kit.tiny_config`: a name or a
    checkpoint's ``config.json`` contents); ``settings`` are ``GRPOConfig`` fields applied to every
    run (a user's own configuration, ``ppo-ref step-check``), under those the step sets itself
    (:data:`OWNED`); ``padding_side`` the tokenizer's."""

    name = "trl"
    loss_modes = LOSS_MODES
    micro_batch_local = MICRO_BATCH_LOCAL
    accumulation_setting = (
        "GRPOConfig.gradient_accumulation_steps (the runner's micro-batches: per_device_train_batch_size "
        "B/k, steps_per_generation k, one generation batch split by GRPOTrainer._prepare_inputs, one "
        "transformers Trainer.training_step each, the optimizer stepping once)"
    )
    provenance = (
        "trl.GRPOTrainer.train (max_steps=1) with rollout_func: _generate_and_score_completions "
        "(padding, mask_truncated_completions, group advantages), _prepare_inputs (shuffle, split into "
        "gradient_accumulation_steps), training_step/_compute_loss per loss_type; gradient read at "
        "on_pre_optimizer_step; outputs: completion_mask and advantages of _generate_and_score_completions"
    )

    def __init__(
        self,
        seed: int = 0,
        family: str | Mapping[str, Any] = "gpt2",
        settings: Mapping[str, Any] | None = None,
        padding_side: str = "right",
    ) -> None:
        self.version = str(importlib.import_module("trl").__version__)
        self.seed, self.family, self.settings = seed, family, dict(settings or {})
        self.padding_side = padding_side
        self._dir = tempfile.mkdtemp(prefix="ppo-ref-trl-step-")

    def with_family(self, family: str) -> TrlGrpoStep:
        """The same runner (settings, padding side) on a tiny ``family`` model (STEP-7)."""
        return TrlGrpoStep(self.seed, family, self.settings, self.padding_side)

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
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback

        Dataset = importlib.import_module("datasets").Dataset
        trl = importlib.import_module("trl")
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        path = os.path.join(self._dir, f"model-{batch.vocab_size}")
        if not os.path.isdir(path):
            tokenizer = word_tokenizer(batch.vocab_size, padding_side=self.padding_side)
            save_tiny(path, tiny_config(self.family, batch.vocab_size), self.seed, tokenizer)
        order = RowOrder(batch)

        def rollout(prompt_texts: list[Any], trainer: Any) -> dict[str, Any]:
            rows = [order.next(int(str(text)[1:])) for text in prompt_texts]  # prompt "g{group}"
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
                record["gradient"] = gradient_of(kwargs["model"].named_parameters())

        harness = {"output_dir": os.path.join(self._dir, "out"), "use_cpu": True, "report_to": "none"}
        harness.update(logging_strategy="no", save_strategy="no", eval_strategy="no", disable_tqdm=True)
        harness.update(log_completions=False, dataloader_num_workers=0, dataloader_pin_memory=False)
        harness.update(num_generations=batch.group_size, max_completion_length=batch.budget, max_steps=1)
        harness.update(per_device_train_batch_size=batch.size // micro_batches, seed=self.seed)
        harness.update(gradient_accumulation_steps=micro_batches, num_iterations=num_iterations)
        harness.update(learning_rate=1e-3, optim="sgd", max_grad_norm=0.0, lr_scheduler_type="constant")
        harness.update(warmup_steps=0, weight_decay=0.0, use_vllm=False, loss_type=loss_mode)
        harness.update(
            pad_to_multiple_of=pad_to, mask_truncated_completions=mask_truncated, bf16=False, fp16=False
        )
        defaults: dict[str, Any] = {"gradient_checkpointing": False, "beta": 0.0}
        if loss_mode == "luspo":
            defaults["importance_sampling_level"] = "sequence"
        config = trl.GRPOConfig(**{**defaults, **self.settings, **harness})
        trainer = trl.GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(path),
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": [f"g{g}" for g in range(len(batch.prompt_ids))]}),
            processing_class=PreTrainedTokenizerFast.from_pretrained(path),
            rollout_func=rollout,
            callbacks=[Capture()],
        )
        original_loss = trainer._compute_loss
        original_logps = trainer._get_per_token_logps_and_entropies
        current: dict[str, Any] = {}

        def logps(*args: Any, **kwargs: Any) -> Any:
            out = original_logps(*args, **kwargs)
            old = current.get("inputs", {}).get("old_per_token_logps")
            if torch.is_grad_enabled() and old is not None:
                diff = (out[0].detach() - old).abs()[current["inputs"]["completion_mask"].bool()]
                if diff.numel():
                    record["ratio"] = max(record["ratio"], float(diff.max()))
            return out

        def compute(model: Any, inputs: dict[str, Any]) -> Tensor:
            current["inputs"] = inputs
            loss: Tensor = original_loss(model, inputs)
            record["losses"].append(float(loss.detach()))
            for key in ("clip_ratio/region_mean", "cispo_clip_ratio"):  # cleared by train()'s last log
                values = trainer._metrics["train"].get(key)
                if values:
                    record.setdefault(key, []).append(float(values[-1]))
            return loss

        trainer._compute_loss = compute
        trainer._get_per_token_logps_and_entropies = logps
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
        fill = check_run(batch, loss_mode, LOSS_MODES, micro_batches, pad_to, pad_fill)
        trainer, record = self._trainer(
            batch, loss_mode, micro_batches, pad_to, num_iterations=num_iterations
        )
        trainer._tokenizer.pad_token = trainer._tokenizer.convert_ids_to_tokens(fill)
        trainer.train()
        if record["gradient"] is None:
            raise RuntimeError("GRPOTrainer took no optimizer step")
        clip = record.get("cispo_clip_ratio" if loss_mode == "cispo" else "clip_ratio/region_mean") or [
            math.nan
        ]
        stats: dict[str, float | None] = {
            "max_abs_log_ratio": record["ratio"] if num_iterations > 1 else None,  # else no old log-probs
            "clipfrac": float(sum(clip) / len(clip)),
        }
        return step_result(record["gradient"], record["losses"], stats)

    def truncation_run(self, batch: StepBatch) -> StepResult:
        """``GRPOTrainer._generate_and_score_completions`` with ``mask_truncated_completions=True``
        (TRL's only truncation handling: a critic-free trainer bootstraps nothing): its
        ``completion_mask`` (a row masked entirely is treated as truncated) and advantages."""
        trainer, _ = self._trainer(batch, "dapo", 1, None, mask_truncated=True)
        trainer.model.train()
        prompts = [{"prompt": f"g{g}"} for g in range(len(batch.prompt_ids)) for _ in range(batch.group_size)]
        # unshuffled: rows come back in prompt order, occurrence j of prompt g is row g * group_size + j
        out = trainer._generate_and_score_completions(prompts)
        outputs = {
            "loss_mask": out["completion_mask"],
            "advantages": out["advantages"].reshape(batch.size, -1),
        }
        return StepResult(gradient={}, loss=0.0, stats={}, outputs=outputs)


class _LookupBackbone(torch.nn.Module):
    """A stand-in reward backbone: every position's hidden state is the fixed score of its row
    (looked up by the row's tokens, padding stripped), so ``get_reward`` returns the batch's scores."""

    def __init__(self, scores: Mapping[tuple[int, ...], float], pad_id: int) -> None:
        super().__init__()
        self.scores = dict(scores)
        self.pad_id = pad_id
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a parameter, so accelerate can place it

    def forward(self, input_ids: Tensor, attention_mask: Tensor, **_: Any) -> Any:
        from types import SimpleNamespace

        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            key = tuple(t for t, m in zip(ids, mask, strict=True) if m)
            rows.append(self.scores[key])
        hidden = torch.tensor(rows, dtype=torch.float32).view(-1, 1, 1).expand(-1, input_ids.shape[1], 1)
        return SimpleNamespace(hidden_states=[hidden + 0 * self.anchor])


class _LookupReward(torch.nn.Module):
    base_model_prefix = "backbone"

    def __init__(self, scores: Mapping[tuple[int, ...], float], pad_id: int) -> None:
        super().__init__()
        self.backbone = _LookupBackbone(scores, pad_id)
        self.score = torch.nn.Identity()


class TrlPpoStep:
    """One optimizer step of TRL 1.12's ``PPOTrainer.train()`` on a :class:`StepBatch`.

    ``trl.experimental.ppo.ppo_trainer.batch_generation`` is replaced by a function returning the
    batch's completions (right-padded with the pad id, or ``pad_fill`` after the EOS) and, as
    ``generate``'s scores, the policy's logits on them divided by the temperature (TRL's own
    ``forward``); everything else is ``train()``: ``truncate_response`` at EOS (``stop_token="eos"``),
    ``missing_eos_penalty=1``, the reward (a lookup model returning the batch's scores), the value
    model's values, GAE, advantage whitening, one PPO epoch of one mini-batch in ``micro_batches``
    micro-batches (``accelerator.accumulate``). A spy on ``accelerator.backward`` reads ``train()``'s
    locals (as findings/repro/trl-approxkl-unmasked.py does) and copies the policy's accumulated
    gradient after the last micro-batch, before ``optimizer.step``, and the row scores after
    ``missing_eos_penalty`` (the ``rewards`` output). ``temperature`` 0.7 (TRL's default).
    """

    name = "trl"
    loss_modes: tuple[str, ...] = ("token-mean",)
    micro_batch_local: Mapping[str, str] = MappingProxyType({})
    accumulation_setting = (
        "PPOConfig.gradient_accumulation_steps (trl/experimental/ppo/ppo_trainer.py:460 "
        "Accelerator(gradient_accumulation_steps=...); train() wraps each micro-batch in "
        "accelerator.accumulate and calls optimizer.step, :810, :849), run with accelerate's defaults"
    )
    sampling_not_provided = (
        "PPOConfig has no top_k or top_p, and train() samples with generation_kwargs that set top_k 0.0 "
        "and top_p 1.0 (trl/experimental/ppo/ppo_trainer.py:620-627), which override the model's "
        "generation_config (:687)"
    )
    provenance = (
        "trl.experimental.ppo.PPOTrainer.train (one iteration; batch_generation replaced by the fixed "
        "completions): truncate_response, missing_eos_penalty, get_reward, GAE, masked_whiten, the PPO "
        "micro-batch loop with accelerator.accumulate; gradient and locals read at accelerator.backward; "
        "outputs: train()'s scores after missing_eos_penalty"
    )

    def __init__(self, seed: int = 0, sync_with_dataloader: bool = False, family: str = "gpt2") -> None:
        self.version = str(importlib.import_module("trl").__version__)
        self.seed = seed
        self.sync_with_dataloader = sync_with_dataloader
        self.family = family

    def with_family(self, family: str) -> TrlPpoStep:
        """The same runner on tiny ``family`` models (policy, reference, value; STEP-7)."""
        return TrlPpoStep(self.seed, self.sync_with_dataloader, family)

    def _train(
        self, batch: StepBatch, micro_batches: int, pad_to: int | None, pad_fill: int | None
    ) -> dict[str, Any]:
        import tempfile as _tempfile

        Dataset = importlib.import_module("datasets").Dataset
        ppo = importlib.import_module("trl.experimental.ppo")
        module: Any = importlib.import_module("trl.experimental.ppo.ppo_trainer")
        fill = check_run(batch, "token-mean", self.loss_modes, micro_batches, pad_to, pad_fill)
        tokenizer = word_tokenizer(batch.vocab_size)
        policy = tiny_model(tiny_config(self.family, batch.vocab_size), self.seed)
        reference = tiny_model(tiny_config(self.family, batch.vocab_size), self.seed)
        value = tiny_model(tiny_config(self.family, batch.vocab_size), self.seed + 1, head="score")
        layout = padded(batch, pad_to)  # the prompts left-padded with the pad id
        width_r = layout.response_ids.shape[1]
        queries = [
            tuple(layout.prompt_ids[g * batch.group_size].tolist()) for g in range(len(batch.prompt_ids))
        ]
        rows = [queries[i // batch.group_size] for i in range(batch.size)]
        scores = {
            tuple(t for t in q if t != batch.pad_id) + c: s
            for q, c, s in zip(rows, batch.completions, batch.scores, strict=True)
        }
        reward = _LookupReward(scores, batch.pad_id)
        order = RowOrder(batch)
        temperature = 0.7
        record: dict[str, Any] = {"calls": 0, "ratio": 0.0, "clip": [], "kl": [], "loss": 0.0}

        def generation(model: Any, queries_in: Tensor, _size: int, pad_id: int, _config: Any) -> Any:
            responses = torch.full((queries_in.shape[0], width_r), fill, dtype=torch.long)
            for j, query in enumerate(queries_in.tolist()):
                row = order.next(queries.index(tuple(query)))
                completion = batch.completions[row]
                responses[j, : len(completion)] = torch.tensor(completion)
                if completion[-1] != batch.eos_id:  # cut at the budget: nothing after it is a response
                    responses[j, len(completion) :] = pad_id
            query_responses = torch.cat([queries_in, responses], dim=1)
            output = module.forward(model, query_responses, pad_id)
            logits = output.logits[:, queries_in.shape[1] - 1 : -1] / temperature
            return query_responses, logits

        with _tempfile.TemporaryDirectory() as out:
            args = ppo.PPOConfig(
                output_dir=out, per_device_train_batch_size=batch.size // micro_batches,
                per_device_eval_batch_size=batch.size, gradient_accumulation_steps=micro_batches,
                num_mini_batches=1, local_rollout_forward_batch_size=batch.size, total_episodes=batch.size,
                num_ppo_epochs=1, response_length=width_r, stop_token="eos", missing_eos_penalty=1.0,
                learning_rate=1e-3, num_sample_generations=0, bf16=False, gradient_checkpointing=False,
                report_to="none", save_strategy="no", use_cpu=True, seed=self.seed, max_grad_norm=None,
            )  # fmt: skip
            trainer = ppo.PPOTrainer(
                args=args, processing_class=tokenizer, model=policy, ref_model=reference, reward_model=reward,
                value_model=value, train_dataset=Dataset.from_dict({"input_ids": [list(r) for r in rows]}),
                eval_dataset=Dataset.from_dict({"input_ids": [list(r) for r in rows]}),
            )  # fmt: skip
            backward = trainer.accelerator.backward

            def spy(loss: Tensor, **kwargs: Any) -> Any:
                import sys

                f = sys._getframe(1).f_locals  # PPOTrainer.train's frame
                action = ~f["padding_mask"][f["micro_batch_inds"]]
                diff = f["logprobs_diff"].detach()
                if "rewards" not in record:  # the scores after missing_eos_penalty, in batch order
                    record["rewards"] = order.in_batch_order(f["scores"].detach())
                record["ratio"] = max(record["ratio"], float(diff[action].abs().max()))
                clipped = (f["pg_losses2"] > f["pg_losses"]).float()
                record["clip"].append(float(clipped[action].mean()))
                record["kl"].append(float(0.5 * (diff**2).mean()))  # TRL's approxkl
                result = backward(loss, **kwargs)
                record.setdefault("syncs", []).append(bool(trainer.accelerator.sync_gradients))
                record["loss"] += float(loss.detach()) / micro_batches  # accelerate divides by the steps
                record["calls"] += 1
                if record["calls"] == micro_batches:
                    model = trainer.accelerator.unwrap_model(trainer.model).policy
                    record["gradient"] = gradient_of(model.named_parameters())
                return result

            trainer.accelerator.backward = spy
            if not self.sync_with_dataloader:
                # A one-batch dataloader is at its end in every iteration: accelerate then syncs and
                # steps at every micro-batch (finding trl-ppo-accumulation-end-of-dataloader); measure the
                # normalisation of a mid-epoch iteration, where accumulation works.
                trainer.accelerator.gradient_state.plugin_kwargs["sync_with_dataloader"] = False
            original = module.batch_generation
            module.batch_generation = generation
            try:
                importlib.import_module("numpy").random.seed(self.seed)  # train()'s np.random.permutation
                trainer.train()
            finally:
                module.batch_generation = original
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
        """One optimizer step of ``PPOTrainer.train()`` on ``batch`` (class docstring)."""
        check_run(batch, loss_mode, self.loss_modes, micro_batches, pad_to, pad_fill)
        record = self._train(batch, micro_batches, pad_to, pad_fill)
        if "gradient" not in record:
            raise RuntimeError("PPOTrainer.train() took no backward step")
        stats: dict[str, float | None] = {
            "optimizer_steps": float(sum(record["syncs"])),
            "max_abs_log_ratio": record["ratio"],
            "clipfrac": sum(record["clip"]) / len(record["clip"]),
            "approx_kl": sum(record["kl"]) / len(record["kl"]),
        }
        outputs = {"rewards": record["rewards"]}  # train()'s scores after missing_eos_penalty
        return StepResult(gradient=record["gradient"], loss=record["loss"], stats=stats, outputs=outputs)

    def accumulation_run(self, batch: StepBatch, *, loss_mode: str, accumulation_steps: int) -> StepResult:
        """STEP-6: :meth:`run` with ``micro_batches = accumulation_steps`` as a user's ``train()`` runs it,
        accelerate's ``sync_with_dataloader`` on (``PPOTrainer``'s own ``Accelerator``); its
        ``optimizer_steps`` counts the steps accelerate let the optimizer take in the mini-batch."""
        if not isinstance(batch, StepBatch):
            raise ValueError(f"batch: expected a StepBatch, got {type(batch).__name__}")
        if (
            isinstance(accumulation_steps, bool)
            or not isinstance(accumulation_steps, int)
            or accumulation_steps < 1
            or batch.size % accumulation_steps
        ):
            raise ValueError(
                f"accumulation_steps: expected a divisor of {batch.size}, got {accumulation_steps!r}"
            )
        as_users_run_it = TrlPpoStep(self.seed, sync_with_dataloader=True)
        return as_users_run_it.run(batch, loss_mode=loss_mode, micro_batches=accumulation_steps)


def make_step() -> TrlGrpoStep | TrlPpoStep:
    """The TRL step runner of the installed release: ``GRPOTrainer`` for trl >= 1.13 (needs its
    ``rollout_func``), the experimental ``PPOTrainer`` for older ones (1.12)."""
    version = str(importlib.import_module("trl").__version__)
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) < (1, 13):
        return TrlPpoStep()
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
        self.provenance = self.step.provenance


def make_adapter() -> TrlStepAdapter:
    """The step-only TRL adapter (see :class:`TrlStepAdapter`)."""
    return TrlStepAdapter()
