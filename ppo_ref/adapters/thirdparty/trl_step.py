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

__all__ = ["TrlGrpoStep", "TrlPpoStep", "TrlStepAdapter", "make_adapter", "make_step"]

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
    gradient after the last micro-batch, before ``optimizer.step``. ``temperature`` 0.7 (TRL's default).
    """

    name = "trl"
    loss_modes: tuple[str, ...] = ("token-mean",)
    micro_batch_local: Mapping[str, str] = MappingProxyType({})
    provenance = (
        "trl.experimental.ppo.PPOTrainer.train (one iteration; batch_generation replaced by the fixed "
        "completions): truncate_response, missing_eos_penalty, get_reward, GAE, masked_whiten, the PPO "
        "micro-batch loop with accelerator.accumulate; gradient and locals read at accelerator.backward"
    )

    def __init__(self, seed: int = 0, sync_with_dataloader: bool = False) -> None:
        self.version = str(importlib.import_module("trl").__version__)
        self.seed = seed
        self.sync_with_dataloader = sync_with_dataloader

    def _train(
        self, batch: StepBatch, micro_batches: int, pad_to: int | None, pad_fill: int | None
    ) -> dict[str, Any]:
        import tempfile as _tempfile

        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        from tokenizers.pre_tokenizers import WhitespaceSplit
        from transformers import (
            GPT2Config,
            GPT2ForSequenceClassification,
            GPT2LMHeadModel,
            PreTrainedTokenizerFast,
        )

        Dataset = importlib.import_module("datasets").Dataset
        ppo = importlib.import_module("trl.experimental.ppo")
        module: Any = importlib.import_module("trl.experimental.ppo.ppo_trainer")
        if not isinstance(micro_batches, int) or micro_batches < 1 or batch.size % micro_batches:
            raise ValueError(f"micro_batches: expected a divisor of {batch.size}, got {micro_batches!r}")
        fill = batch.pad_id if pad_fill is None else pad_fill
        if not 0 <= fill < batch.vocab_size or fill == batch.eos_id:
            raise ValueError(
                f"pad_fill: expected a non-EOS token id in [0, {batch.vocab_size}), got {pad_fill}"
            )
        vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"t{i}": i for i in range(3, batch.vocab_size)}}
        core = Tokenizer(WordLevel(vocab, unk_token="<bos>"))
        core.pre_tokenizer = WhitespaceSplit()
        tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<bos>"
        )

        def config(**extra: Any) -> Any:
            return GPT2Config(
                n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=batch.vocab_size,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
                bos_token_id=2, eos_token_id=1, pad_token_id=0, **extra,
            )  # fmt: skip

        torch.manual_seed(self.seed)
        policy = GPT2LMHeadModel(config())
        reference = GPT2LMHeadModel(config())
        reference.load_state_dict(policy.state_dict())
        torch.manual_seed(self.seed + 1)
        value = GPT2ForSequenceClassification(config(num_labels=1))
        width_p = _rounded(len(batch.prompt_ids[0]), pad_to)
        width_r = _rounded(max(len(c) for c in batch.completions), pad_to)
        queries = [(batch.pad_id,) * (width_p - len(p)) + p for p in batch.prompt_ids]
        rows = [queries[i // batch.group_size] for i in range(batch.size)]
        scores = {
            tuple(t for t in q if t != batch.pad_id) + c: s
            for q, c, s in zip(rows, batch.completions, batch.scores, strict=True)
        }
        reward = _LookupReward(scores, batch.pad_id)
        temperature = 0.7
        record: dict[str, Any] = {"order": [], "calls": 0, "ratio": 0.0, "clip": [], "kl": [], "loss": 0.0}

        def generation(model: Any, queries_in: Tensor, _size: int, pad_id: int, _config: Any) -> Any:
            seen: dict[tuple[int, ...], int] = {}
            responses = torch.full((queries_in.shape[0], width_r), fill, dtype=torch.long)
            for j, query in enumerate(queries_in.tolist()):
                group = queries.index(tuple(query))
                count = seen.get(tuple(query), 0)
                seen[tuple(query)] = count + 1
                row = group * batch.group_size + count % batch.group_size
                record["order"].append(row)
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
                if "truncated" not in record:
                    eos = f["contain_eos_token"].tolist()
                    truncated = [False] * batch.size
                    for j, row in enumerate(record["order"]):
                        truncated[row] = not eos[j]
                    record["truncated"] = tuple(truncated)
                record["ratio"] = max(record["ratio"], float(diff[action].abs().max()))
                clipped = (f["pg_losses2"] > f["pg_losses"]).float()
                record["clip"].append(float(clipped[action].mean()))
                record["kl"].append(float(0.5 * (diff**2).mean()))  # TRL's approxkl
                result = backward(loss, **kwargs)
                record.setdefault("syncs", []).append(bool(trainer.accelerator.sync_gradients))
                record["loss"] += float(loss.detach()) / micro_batches  # accelerate divides by the steps
                record["calls"] += 1
                if record["calls"] == micro_batches:
                    record["gradient"] = {
                        n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().clone()
                        for n, p in trainer.accelerator.unwrap_model(trainer.model).policy.named_parameters()
                    }
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
        if loss_mode not in self.loss_modes:
            raise ValueError(f"loss_mode: expected one of {self.loss_modes}, got {loss_mode!r}")
        record = self._train(batch, micro_batches, pad_to, pad_fill)
        if "gradient" not in record:
            raise RuntimeError("PPOTrainer.train() took no backward step")
        stats: dict[str, float | None] = {
            "optimizer_steps": float(sum(record["syncs"])),
            "max_abs_log_ratio": record["ratio"],
            "clipfrac": sum(record["clip"]) / len(record["clip"]),
            "approx_kl": sum(record["kl"]) / len(record["kl"]),
        }
        return StepResult(gradient=record["gradient"], loss=record["loss"], stats=stats)

    def truncated_rows(self, batch: StepBatch) -> tuple[bool, ...]:
        """Rows ``train()`` penalises for a missing EOS (``contain_eos_token`` False; TRL bootstraps no
        row: its GAE ends every row with next value 0)."""
        truncated: tuple[bool, ...] = self._train(batch, 1, None, None)["truncated"]
        return truncated


def _rounded(width: int, pad_to: int | None) -> int:
    if pad_to is None:
        return width
    if not isinstance(pad_to, int) or pad_to < 1:
        raise ValueError(f"pad_to: expected an int >= 1 or None, got {pad_to!r}")
    return -(-width // pad_to) * pad_to


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
