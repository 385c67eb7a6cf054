"""Trainer-step tier for OpenRLHF 0.11.2 (spec STEP-1..8; contract :mod:`ppo_ref.adapters.step`).

Every run goes through OpenRLHF's own code, in this process, on the CPU (file:line of the installed
release, ``openrlhf/...``):

- rollout: each row is produced by ``utils/agent.py`` ``SingleTurnAgentExecutor.execute``
  (agent.py:207-306: prompt tokenised by the runner's word tokenizer, ``observation_tokens`` =
  prompt + action tokens, ``action_ranges``, ``truncated`` = ``finish_reason == "length"``
  (agent.py:252), the reward from the user's ``reward_func`` file through ``_fetch_rewards_via_func``,
  the ``--reward.remote_url`` extension point), turned into an ``Experience`` by
  ``SamplesGenerator._process_response_into_experience`` (ppo_utils/samples_generator.py:243-310) and
  concatenated by ``RemoteExperienceMaker.split_rollout_samples`` (experience_maker.py:44-77,
  ``rollout.micro_batch_size`` = B: one forward of the whole batch; sequences right-padded with the
  pad id by ``Experience.concat_experiences``);
- old log-probs from ``PolicyModelActor.forward`` (ray/ppo_actor.py:618-644); no reference model and
  no critic, so the KL is zero as in ``make_experience`` without an ``initial_model_group``
  (experience_maker.py:202-227); advantages from ``RemoteExperienceMaker.compute_advantages_and_returns``
  (experience_maker.py:238-340) with ``--algo.advantage.estimator group_norm`` (GRPO: group mean,
  unbiased std + 1e-9, experience_maker.py:273-274), its length penalties
  (``apply_length_penalties``, ppo_utils/length_penalty.py:109) included;
- the update: ``PolicyModelActor.init_model_from_pretrained`` (ppo_actor.py:495-596: ``Actor``,
  ``get_tokenizer``, ``DeepspeedStrategy.prepare`` -> ``deepspeed.initialize``, ``ActorPPOTrainer``),
  ``PolicyModelActor.append`` (the ``NaiveReplayBuffer``: split, ``remove_padding_in_sequences``)
  and ``PolicyModelActor.fit`` -> ``ActorPPOTrainer.ppo_train`` (ppo_actor.py:153-257: the
  DataLoader over the replay buffer, ``iter_grad_accum_global_norm`` (utils/loss_utils.py:80-105:
  every micro-batch of an optimizer step gets the step's global token and sequence counts divided by
  gas) and ``training_step`` (ppo_actor.py:259-407: ``Actor.forward``, ``PolicyLoss``
  (models/loss.py:116-259, ``aggregate_loss`` loss.py:11-39), ``strategy.backward`` ->
  DeepSpeed ``engine.backward`` (which divides every micro-batch's loss by gas,
  deepspeed/runtime/engine.py:3337 in 0.19.6),
  ``strategy.optimizer_step`` -> ``engine.step``). The gradient is read at the accumulation boundary,
  before DeepSpeed's step (clipping and AdamW come after).
- The engine is DeepSpeed 0.19's real ``DeepSpeedEngine`` on its CPU accelerator (DeepSpeed selects
  it without CUDA) over a gloo process group of world size 1, ZeRO stage 0 (``--ds.zero_stage 0``; the
  CLI default 2 keeps its gradients in partitioned flat buffers, the same sums), eager attention
  (``--ds.attn_implementation eager``: flash-attn does not run on a CPU); the model a tiny
  ``Qwen2ForCausalLM`` built from a fixed seed and saved to a temporary directory.

Stand-ins (also listed in ``provenance``; :mod:`ppo_ref.adapters.thirdparty.openrlhf_standins` holds them):

- the import stubs of :mod:`ppo_ref.adapters.thirdparty._openrlhf_stubs` (flash_attn, vllm; never
  called);
- vLLM's engine in ``execute``: an object whose ``generate`` returns the batch's completion with
  vLLM's ``finish_reason`` (``"stop"`` when it ends with EOS, ``"length"`` when it fills
  ``max_tokens`` = the budget), and ``SamplingParams`` (``max_tokens`` = the budget, ``logprobs`` None);
- fp32 parameters: ``convert_to_torch_dtype`` answers float32 for ``"fp32"`` (the release offers
  ``bf16`` / ``fp16`` only, cli/train_ppo_ray.py:330-336, choices at 334; DeepSpeed's bf16 and fp16
  sections stay off);
- ``init_device_mesh`` built on the ``"cpu"`` device type instead of ``"cuda"``
  (utils/deepspeed/deepspeed.py:105); ``torch.cuda.current_device`` answering ``"cpu"`` (0 while the
  replay buffer is built: its ``target_device`` is read by ``sample()`` only, which ``ppo_train`` never
  calls); ``torch.cuda.synchronize`` / ``empty_cache`` / ``set_device`` doing nothing;
- the Ray actor methods called on a plain instance of ``PolicyModelActor``'s class (no Ray); the KL
  set to zero as ``make_experience`` sets it without a reference model;
- the rollout's tokenizer is the runner's word tokenizer (:func:`~ppo_ref.adapters.step_kit.word_tokenizer`,
  whose ids are the batch's): transformers 5's ``AutoTokenizer``, which ``get_tokenizer`` calls, loads
  the saved WordLevel tokenizer of a ``qwen2`` checkpoint as a ``Qwen2Tokenizer`` that encodes its
  words to nothing; the trainer itself never tokenises.

None of them changes a reward, the loss or its normalisation.

STEP-5: :meth:`OpenRLHFStep.truncation_run` switches on OpenRLHF's truncation handling,
``--reward.stop_properly_penalty_coef`` (ProRL; length_penalty.py:61-106: a row whose ``truncated``
flag is set gets the coefficient as its reward when it is negative), at the docstring's -0.5.

Statistics: ``rollout_columns`` (extra) is the width of the rollout batch's ``sequences`` as
``PolicyModelActor.forward`` receives it (the replay buffer then strips the right padding,
``remove_padding_in_sequences``, and re-pads each micro-batch to its longest row with 0,
``make_experience_batch``); ``max_abs_log_ratio`` over the loss's micro-batches (read from the log-probs
``PolicyLoss`` receives), ``clipfrac`` = the logged ``ppo_clip_ratio`` and ``approx_kl`` =
``ppo_kl`` (``ppo_train``'s token-weighted means over the micro-batches).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import os
import tempfile
from collections.abc import Mapping
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch

from ppo_ref.adapters.step import StepBatch, StepResult
from ppo_ref.adapters.step_kit import (
    check_run,
    gradient_of,
    padded_width,
    save_tiny,
    step_result,
    tiny_config,
    word_tokenizer,
)
from ppo_ref.adapters.thirdparty.openrlhf_standins import (
    VllmEngine,
    cpu_calls,
    fp32_parameters,
    setup_process,
)

__all__ = [
    "LOSS_MODES",
    "STOP_PROPERLY_PENALTY",
    "OpenRLHFStep",
    "OpenRLHFStepAdapter",
    "make_adapter",
    "make_step",
]

LOSS_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean")
"""Every ``--actor.loss_agg_mode`` OpenRLHF 0.11.2 accepts (cli/train_ppo_ray.py:440-446, choices)."""

STOP_PROPERLY_PENALTY = -0.5
"""``--reward.stop_properly_penalty_coef`` in :meth:`OpenRLHFStep.truncation_run` (a negative
coefficient replaces a truncated row's reward, the help text's example, cli/train_ppo_ray.py:536-542)."""

REWARD_FILE = """import json, os
SCORES = json.loads(os.environ["PPO_REF_OPENRLHF_SCORES"])
def reward_func(queries, prompts, labels):
    # the step batch's score of this row (the label holds the row's index)
    score = float(SCORES[int(labels[0])])
    return {"rewards": score, "scores": score, "extra_logs": {}}
"""
"""The ``--reward.remote_url`` reward_func file the runner writes (scores passed through the
environment: the file is loaded once per executor)."""


def _namespace(tree: Mapping[str, Any]) -> Any:
    return SimpleNamespace(**{k: _namespace(v) if isinstance(v, dict) else v for k, v in tree.items()})


def _arguments(batch: StepBatch, loss_mode: str, micro: int, seed: int, directory: str) -> Any:
    """OpenRLHF's hierarchical args (``utils/config.py`` ``hierarchize``) with the CLI defaults of
    cli/train_ppo_ray.py for every field the code below reads, and the runner's choices: GRPO
    (``group_norm``, no KL), ZeRO-0, eager attention, fp32, one optimizer step over the batch."""
    size = batch.size // micro
    return _namespace(
        {
            "local_rank": -1,
            "ds": {
                "zero_stage": 0,
                "param_dtype": "fp32",
                "attn_implementation": "eager",
                "experts_implementation": None,
                "load_in_4bit": False,
                "lora": {"rank": 0, "alpha": 16, "target_modules": "all-linear", "dropout": 0},
                "packing_samples": False,
                "use_liger_kernel": False,
                "adam_offload": False,
                "zpg": 1,
                "use_universal_ckpt": False,
                "grad_accum_dtype": None,
                "overlap_comm": False,
                "deepcompile": False,
                "tensor_parallel_size": 1,
                "ring_attn_size": 1,
                "enable_sleep": False,
            },
            "train": {
                "seed": seed,
                "full_determinism_enable": False,
                "max_epochs": 1,
                "micro_batch_size": size,
                "batch_size": batch.size,
                "dynamic_batch_enable": False,
                "colocate_all": False,
                "async_enable": False,
                "enable_ema": False,
                "ema_beta": 0.992,
            },
            "actor": {
                "eps_clip": 0.2,
                "eps_clip_low_high": (0.2, 0.2),
                "dual_clip": None,
                "loss_agg_mode": loss_mode,
                "policy_loss_type": "ppo",
                "aux_loss_coef": 0.0,
                "entropy_coef": None,
                "gradient_checkpointing_enable": False,
                "gradient_checkpointing_reentrant": False,
                "freeze_visual_encoder": False,
                "optim": "adam",
                "muon": {"lr": 0.02, "momentum": 0.95, "ns_steps": 5, "nesterov": True},
                "adam": {"lr": 1e-6, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0},
                "lr_scheduler": "cosine_with_min_lr",
                "lr_warmup_ratio": 0.03,
                "min_lr_ratio": 0.1,
                "max_norm": 1.0,
            },
            "algo": {
                "advantage": {
                    "estimator": "group_norm",
                    "gamma": 1.0,
                    "lambd": 1.0,
                    "no_std_norm": False,
                    "is_correction_level": "off",
                    "is_correction_mode": "mask",
                    "is_correction_gating": "ratio",
                    "is_correction_threshold": [0.5, 5.0],
                },
                "kl": {"use_loss": False, "init_coef": 0.0, "estimator": "k1", "unbiased_gradient": False},
            },
            "rollout": {
                "n_samples_per_prompt": batch.group_size,
                "micro_batch_size": batch.size,
                "temperature": 1.0,
                "max_new_tokens": batch.budget,
                "batch_size": len(batch.prompt_ids),
            },
            "reward": {
                "overlong_buffer_len": None,
                "overlong_penalty_factor": 1.0,
                "stop_properly_penalty_coef": None,
                "clip_range": (-10.0, 10.0),
            },
            "data": {"max_len": len(batch.prompt_ids[0]) + batch.budget, "disable_fast_tokenizer": False},
            "vllm": {"sync_backend": "gloo", "num_engines": 0, "tensor_parallel_size": 1},
            "ckpt": {
                "save_hf": False,
                "disable_ds": True,
                "path": os.path.join(directory, "ckpt"),
                "load_enable": False,
            },
        }
    )


def _advantages(strategy: Any, args: Any, experiences: list[Any]) -> list[Any]:
    """``RemoteExperienceMaker.compute_advantages_and_returns`` on an experience maker holding only
    what the method reads (the strategy, its args, the estimator, a KL controller at 0) and its own
    ``get_cumulative_returns`` / ``get_advantages_and_returns``."""
    from types import MethodType

    Maker = importlib.import_module("openrlhf.trainer.ppo_utils.experience_maker").RemoteExperienceMaker
    holder = SimpleNamespace(
        strategy=strategy,
        args=args,
        advantage_estimator=args.algo.advantage.estimator,
        kl_ctl=SimpleNamespace(value=0.0),
    )
    holder.get_cumulative_returns = MethodType(Maker.get_cumulative_returns, holder)
    holder.get_advantages_and_returns = MethodType(Maker.get_advantages_and_returns, holder)
    return list(Maker.compute_advantages_and_returns(holder, experiences))


class OpenRLHFStep:
    """One actor update of OpenRLHF's PPO actor on a :class:`StepBatch` (see the module docstring).

    ``pad_to`` pads the concatenated rollout batch further: the prompt columns (left, attention 0)
    and the completion columns (right) to multiples of it, the library's own layout being
    unpadded prompts and completions right-padded to the longest (``concat_experiences``);
    ``pad_fill`` is the token id written in every padding slot of ``sequences`` (None: the pad id)."""

    name = "openrlhf"
    loss_modes = LOSS_MODES
    micro_batch_local: Mapping[str, str] = MappingProxyType({})
    accumulation_setting = (
        "--train.micro_batch_size within --train.batch_size (the runner's micro-batches: DeepSpeed's "
        "gradient_accumulation_steps = batch_size / (micro_batch_size * world size), checked against the "
        "engine's; engine.backward divides each micro-batch's loss by it, iter_grad_accum_global_norm "
        "gives each the step's global counts, utils/loss_utils.py:80-105; one engine.step, counted)"
    )
    provenance = (
        "OpenRLHF rollout rows by utils/agent.py SingleTurnAgentExecutor.execute (reward_func file via "
        "--reward.remote_url), SamplesGenerator._process_response_into_experience, "
        "RemoteExperienceMaker.split_rollout_samples; old log-probs by PolicyModelActor.forward; "
        "advantages by RemoteExperienceMaker.compute_advantages_and_returns (group_norm, "
        "apply_length_penalties); update by PolicyModelActor.init_model_from_pretrained / append / fit "
        "-> ActorPPOTrainer.ppo_train (iter_grad_accum_global_norm, training_step: Actor.forward, "
        "PolicyLoss/aggregate_loss, DeepspeedStrategy.backward/optimizer_step -> the real DeepSpeed "
        "engine, CPU accelerator, gloo group of 1, ZeRO-0); gradient read at the accumulation boundary "
        "before engine.step. Outputs: loss_mask = the experiences' action_mask, rewards = "
        "experience.rewards after compute_advantages_and_returns, advantages = experience.advantages. "
        "Stand-ins: flash_attn/vllm import stubs; vLLM's engine in execute (the batch's completion, "
        "finish_reason 'stop' on EOS, 'length' at max_tokens = budget) and SamplingParams; fp32 "
        "parameters (convert_to_torch_dtype answers 'fp32'); init_device_mesh on 'cpu'; "
        "torch.cuda.current_device -> 'cpu' (0 while the replay buffer is built); cuda synchronize / "
        "empty_cache / set_device no-ops; Ray actor methods called in process; KL zero (no reference "
        "model) as make_experience sets it without an initial_model_group; the rollout's tokenizer the "
        "runner's word tokenizer (AutoTokenizer reads the qwen2 checkpoint's WordLevel tokenizer as a "
        "Qwen2Tokenizer)"
    )

    def __init__(self, seed: int = 0, family: str | Mapping[str, Any] = "qwen2") -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: expected an int, got {seed!r}")
        self.version = importlib.metadata.version("openrlhf")
        if not isinstance(family, (str, Mapping)):
            raise ValueError(f"family: expected a family name or a config.json mapping, got {family!r}")
        self.seed = seed
        self.family = family
        self._dir = tempfile.mkdtemp(prefix="ppo-ref-openrlhf-step-")
        self._saved: dict[int, str] = {}

    def with_family(self, family: str) -> OpenRLHFStep:
        """The same runner on a tiny ``family`` model (STEP-7)."""
        return OpenRLHFStep(self.seed, family)

    def _model_path(self, vocab_size: int) -> str:
        if vocab_size not in self._saved:
            path = os.path.join(self._dir, f"model-{vocab_size}")
            self._saved[vocab_size] = save_tiny(path, tiny_config(self.family, vocab_size), self.seed)
        return self._saved[vocab_size]

    def _reward_file(self) -> str:
        path = os.path.join(self._dir, "reward_func.py")
        if not os.path.exists(path):
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(REWARD_FILE)
        return path

    # --- rollout: OpenRLHF's agent executor and samples generator ---

    def _rollout(self, batch: StepBatch, args: Any, tokenizer: Any) -> list[Any]:
        """One ``Experience`` per row (``_process_response_into_experience`` of ``execute``'s
        response), then ``split_rollout_samples`` (rows in batch order, ``index`` set)."""
        import json

        agent = importlib.import_module("openrlhf.utils.agent")
        generator = importlib.import_module("openrlhf.trainer.ppo_utils.samples_generator")
        maker = importlib.import_module("openrlhf.trainer.ppo_utils.experience_maker")

        os.environ["PPO_REF_OPENRLHF_SCORES"] = json.dumps([float(s) for s in batch.scores])
        executor = agent.SingleTurnAgentExecutor(remote_rm_url=self._reward_file())
        params = SimpleNamespace(max_tokens=batch.budget, logprobs=None)
        samples = []
        for row, completion in enumerate(batch.completions):
            prompt = " ".join(
                tokenizer.convert_ids_to_tokens(list(batch.prompt_ids[row // batch.group_size]))
            )
            engine = VllmEngine(completion, batch.eos_id, batch.budget)
            response = asyncio.run(
                executor.execute(prompt, str(row), params, args.data.max_len, tokenizer, engine)
            )
            if response["reward"] is None:
                raise RuntimeError(f"OpenRLHF's reward_func gave row {row} no reward")
            if response["observation_tokens"][: len(batch.prompt_ids[0])] != list(
                batch.prompt_ids[row // batch.group_size]
            ):
                raise RuntimeError(f"row {row}: the prompt did not tokenise to the batch's ids")
            samples.append(
                generator.SamplesGenerator._process_response_into_experience(
                    None, response, max_len=args.data.max_len
                )
            )
        holder = SimpleNamespace(args=args, tokenizer=tokenizer)
        return list(maker.RemoteExperienceMaker.split_rollout_samples(holder, samples))

    @staticmethod
    def _pad(experience: Any, batch: StepBatch, pad_to: int | None, fill: int) -> None:
        """Extra padding of a concatenated experience (prompts left, completions right), ``fill`` in
        every padding slot of ``sequences``."""
        prompt = len(batch.prompt_ids[0])
        width = experience.sequences.shape[1]
        left = padded_width(prompt, pad_to) - prompt
        right = padded_width(width - prompt, pad_to) - (width - prompt)

        def grow(tensor: torch.Tensor, value: int | float | bool) -> torch.Tensor:
            return torch.nn.functional.pad(tensor, (left, right), value=value)

        attention = grow(experience.attention_mask, 0)
        sequences = grow(experience.sequences, fill)
        sequences[attention == 0] = fill
        experience.sequences, experience.attention_mask = sequences, attention
        experience.action_mask = grow(experience.action_mask, 0)
        if experience.rollout_log_probs is not None:
            experience.rollout_log_probs = grow(experience.rollout_log_probs, 0.0)

    # --- the step ---

    def _actor(self, batch: StepBatch, args: Any) -> Any:
        """A plain instance of ``PolicyModelActor``'s class after ``init_model_from_pretrained``."""
        ppo_actor = importlib.import_module("openrlhf.trainer.ray.ppo_actor")
        get_strategy = importlib.import_module("openrlhf.utils.utils").get_strategy
        cls = ppo_actor.PolicyModelActor.__ray_metadata__.modified_class
        worker = object.__new__(cls)
        strategy = get_strategy(args)
        with fp32_parameters(), cpu_calls(0):
            cls.init_model_from_pretrained(worker, strategy, self._model_path(batch.vocab_size), max_steps=1)
        return worker

    def _experiences(
        self, batch: StepBatch, args: Any, worker: Any, pad_to: int | None, fill: int
    ) -> list[Any]:
        experiences = self._rollout(batch, args, word_tokenizer(batch.vocab_size, padding_side="left"))
        with cpu_calls():
            for experience in experiences:
                if pad_to is not None or fill != batch.pad_id:
                    self._pad(experience, batch, pad_to, fill)
                logp = worker.forward(experience.sequences, experience.action_mask, experience.attention_mask)
                experience.action_log_probs = logp  # make_experience, experience_maker.py:213-227
                experience.base_action_log_probs = None
                experience.values = None
                experience.kl = torch.zeros_like(logp)
                experience.info["kl"] = torch.zeros(logp.shape[0])
                experience.info["logprobs_diff"] = torch.zeros(logp.shape[0])
        return _advantages(worker.strategy, args, experiences)

    @staticmethod
    def _outputs(batch: StepBatch, experiences: list[Any]) -> dict[str, torch.Tensor]:
        """The library's per-row outputs in batch order (its ``index``), completion columns only."""
        start = len(batch.prompt_ids[0]) - 1
        order = [i for e in experiences for i in e.index]
        rows: dict[str, list[torch.Tensor]] = {"loss_mask": [], "advantages": [], "rewards": []}
        width = max(e.action_mask.shape[1] for e in experiences)
        for e in experiences:
            pad = (0, width - e.action_mask.shape[1])
            rows["loss_mask"].append(torch.nn.functional.pad(e.action_mask.float(), pad))
            rows["advantages"].append(torch.nn.functional.pad(e.advantages.float(), pad))
            rows["rewards"].append(e.rewards.float())
        out = {}
        for name, parts in rows.items():
            value = torch.cat(parts)
            placed = torch.empty_like(value)
            placed[torch.tensor(order)] = value
            out[name] = placed if name == "rewards" else placed[:, start:]
        return out

    def run(
        self,
        batch: StepBatch,
        *,
        loss_mode: str,
        micro_batches: int = 1,
        pad_to: int | None = None,
        pad_fill: int | None = None,
    ) -> StepResult:
        """One actor update of OpenRLHF's PPO actor on ``batch`` (module docstring)."""
        fill = check_run(batch, loss_mode, LOSS_MODES, micro_batches, pad_to, pad_fill)
        setup_process()
        args = _arguments(batch, loss_mode, micro_batches, self.seed, self._dir)
        worker = self._actor(batch, args)
        try:
            return self._update(batch, args, worker, micro_batches, pad_to, fill)
        finally:
            engine = worker.actor.model
            engine.destroy() if hasattr(engine, "destroy") else None

    def _update(
        self, batch: StepBatch, args: Any, worker: Any, micro: int, pad_to: int | None, fill: int
    ) -> StepResult:
        ppo_actor = importlib.import_module("openrlhf.trainer.ray.ppo_actor")
        cls = ppo_actor.PolicyModelActor.__ray_metadata__.modified_class
        experiences = self._experiences(batch, args, worker, pad_to, fill)
        columns = float(max(e.sequences.shape[1] for e in experiences))
        outputs = self._outputs(batch, experiences)
        for experience in experiences:
            cls.append(worker, experience)
        trainer = worker.trainer
        engine = worker.actor.model
        record: dict[str, Any] = {"ratio": 0.0, "losses": [], "gradients": []}
        gas = int(engine.gradient_accumulation_steps())
        if gas != micro:
            raise RuntimeError(f"DeepSpeed accumulates {gas} micro-batches, the run asked for {micro}")
        loss_fn = trainer.actor_loss_fn
        step = engine.step

        def loss(log_probs: Any, old_log_probs: Any, advantages: Any, action_mask: Any, **kwargs: Any) -> Any:
            diff = (log_probs.detach() - old_log_probs).abs()[action_mask.bool()]
            record["ratio"] = max(record["ratio"], float(diff.max()))
            result = loss_fn(log_probs, old_log_probs, advantages, action_mask=action_mask, **kwargs)
            record["losses"].append(float(result[0].detach()) / gas)  # DeepSpeed's backward scales by 1/gas
            return result

        def recording_step(*args: Any, **kwargs: Any) -> Any:
            if engine.is_gradient_accumulation_boundary():
                record["gradients"].append(gradient_of(engine.module.named_parameters()))
            return step(*args, **kwargs)

        trainer.actor_loss_fn = loss
        engine.step = recording_step
        torch.manual_seed(self.seed)  # the DataLoader's shuffle
        with cpu_calls():
            status = cls.fit(worker, kl_ctl=0.0)
        if len(record["gradients"]) != 1:
            raise RuntimeError(
                f"OpenRLHF's update took {len(record['gradients'])} optimizer steps, expected 1"
            )
        stats: dict[str, float | None] = {
            "max_abs_log_ratio": record["ratio"],
            "clipfrac": float(status["ppo_clip_ratio"]),
            "approx_kl": float(status["ppo_kl"]),
            "micro_batches_run": float(len(record["losses"])),
            "logged_loss": float(status["policy_loss"]),
            "rollout_columns": columns,
        }
        return step_result(record["gradients"][0], record["losses"], stats, outputs)

    def truncation_run(self, batch: StepBatch) -> StepResult:
        """The rewards of OpenRLHF's experience maker with ``--reward.stop_properly_penalty_coef``
        :data:`STOP_PROPERLY_PENALTY` (ProRL: the rows vLLM reports as ``finish_reason == "length"``
        get the coefficient as their reward). No gradient."""
        if not isinstance(batch, StepBatch):
            raise ValueError(f"batch: expected a StepBatch, got {type(batch).__name__}")
        setup_process()
        args = _arguments(batch, LOSS_MODES[0], 1, self.seed, self._dir)
        args.reward.stop_properly_penalty_coef = STOP_PROPERLY_PENALTY
        experiences = self._rollout(batch, args, word_tokenizer(batch.vocab_size, padding_side="left"))
        for experience in experiences:
            experience.kl = torch.zeros(experience.action_mask.shape, dtype=torch.float32)
        experiences = _advantages(SimpleNamespace(args=args), args, experiences)
        outputs = self._outputs(batch, experiences)
        return StepResult(gradient={}, loss=0.0, stats={}, outputs={"rewards": outputs["rewards"].double()})


def make_step() -> OpenRLHFStep:
    """The OpenRLHF step runner (OpenRLHF's own actor update, see :class:`OpenRLHFStep`)."""
    return OpenRLHFStep()


class OpenRLHFStepAdapter:
    """An adapter with no ops and the step runner only:
    ``--impl=ppo_ref.adapters.thirdparty.openrlhf_step:make_adapter`` runs the trainer-step tier alone
    (``--impl=openrlhf`` runs it after the op tier, through ``BUILTIN_STEP_RUNNERS``)."""

    name = "openrlhf"
    ops: frozenset[str] = frozenset()
    conventions: Mapping[str, object] = MappingProxyType({})

    def __init__(self) -> None:
        self.step = make_step()
        self.version = self.step.version
        self.provenance = self.step.provenance


def make_adapter() -> OpenRLHFStepAdapter:
    """The step-only OpenRLHF adapter (see :class:`OpenRLHFStepAdapter`)."""
    return OpenRLHFStepAdapter()
