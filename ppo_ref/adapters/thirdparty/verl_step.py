"""Trainer-step tier for verl 0.9.1 (spec STEP-1..8; contract :mod:`ppo_ref.adapters.step`).

Every run goes through verl's own trainer code, in this process, on the CPU:

- the rollout batch is laid out as verl's agent loop hands it to the trainer (``DataProto`` with
  left-padded ``prompts``, right-padded ``responses``, ``attention_mask``, ``position_ids`` from
  ``verl.utils.model.compute_position_id_with_mask``, ``uid``); the scores go through the reward path
  verl 0.9.1's trainer uses (``RayPPOTrainer`` builds a ``RewardLoopManager``, whose
  ``RewardLoopWorker`` runs ``load_reward_manager`` and the registered
  ``verl.experimental.reward_loop`` manager's ``run_single`` per row, then ``assemble_rm_scores``
  places each score on the row's last response token and ``extract_reward`` reads ``rm_scores``):
  the ``dapo`` manager, its overlong buffer off in :meth:`VerlStep.run` and on in
  :meth:`VerlStep.truncation_run`, with the batch's scores supplied through verl's
  ``reward.custom_reward_function`` (a file in the runner's temporary directory, the user's
  extension point), on verl's own trainer config (``trainer/config/_generated_ppo_trainer.yaml``);
  then turned into group advantages by ``ray_trainer.compute_advantage`` (GRPO);
- the old log-probs come from ``RayPPOTrainer._compute_old_log_prob`` (one forward of the whole
  batch: ``infer_micro_batch_size_per_gpu`` = B, whatever the update's split) and the update from
  ``RayPPOTrainer._update_actor`` (both called with this runner as their worker group), which run
  ``TrainingWorker.infer_batch`` / ``TrainingWorker.train_mini_batch`` -> ``train_batch`` ->
  ``FSDPEngine.train_batch``: ``left_right_2_no_padding``, the global token count and ``dp_size``
  (``forward_backward_batch``), the split into micro-batches (``prepare_micro_batches``,
  ``micro_batch_size_per_gpu``), ``forward_step`` and ``verl.workers.utils.losses.ppo_loss`` (the
  registered ``vanilla`` policy loss and ``agg_loss`` with the global batch info) and the backward
  of every micro-batch; the gradient is read at ``optimizer_step`` (before clipping, SGD).
- The engine is verl's ``FSDPEngineWithLMHead`` with FSDP2 (``fully_shard``) over a gloo process
  group of world size 1, fp32 parameters and compute (``mixed_precision`` fp32), no padding removal
  (the path verl takes without flash-attn), eager attention, no torch.compile; the model a tiny
  ``Qwen2ForCausalLM`` built from a fixed seed and saved to a temporary directory (GPT-2 does not
  load: verl's ``apply_monkey_patch`` reads ``num_key_value_heads``). A rotary model does not see a
  uniform shift of positions, but verl passes position ids (``cumsum(mask) - 1``) in any case.

Stand-ins (also listed in ``provenance``): a CPU platform registered with
``verl.plugin.platform.platform_manager.set_platform`` (verl ships CUDA, NPU and ROCm platforms only)
and ``VERL_ENGINE_DEVICE=cuda`` (read by ``EngineRegistry.get_engine_cls``) so the FSDP engine
registered for CUDA is chosen, both verl's own extension points; this runner as the actor worker
group (its ``compute_log_prob`` / ``update_actor`` call ``TrainingWorker`` in this process, not through
Ray); the ``RewardLoopWorker``'s ``compute_score_batch`` awaited in this process instead of as a Ray
actor (``RewardLoopManager.compute_rm_score`` does the same per chunk, through ``ray.get``). None of
them changes a reward, the loss or its normalisation.

STEP-5 convention (:data:`TRUNCATION_CONVENTION`): verl's only truncation-dependent handling is the
``dapo`` manager's soft overlong penalty, which reads the response length alone, exactly as DAPO's
equation is written (Yu et al. 2025, Sec. 3.4, R_length(y): ``|y| = L_max`` gives -1 whether the
response ended with EOS there or was cut); the runner declares it, and STEP-5 expects every row's
reward to be its score plus that penalty.

STEP-8 (:meth:`VerlStep.sampling_run`): the suite's top-k / top-p rollout log-probs go in as the
batch's ``rollout_log_probs`` (what verl's agent loop stores when ``rollout.calculate_log_probs`` is
on, vLLM's ``processed_logprobs``), and the trainer's own correction call runs after the old
log-probs, as ``RayPPOTrainer.fit`` makes it in its default decoupled mode:
``rollout_corr_helper.compute_rollout_correction_and_add_to_batch`` with the trainer config's
``algorithm.rollout_correction`` (``_generated_ppo_trainer.yaml``) and ``rollout_is: token``; its
``rollout_is_weights`` reach ``ppo_loss`` and are the output ``correction_weights``. Convention
``"full"``: the old log-probs are the FSDP engine's full-vocabulary ``logprobs_from_logits``
(workers/engine/fsdp/transformer_impl.py:1428) and the weight is ``exp(old_log_prob -
rollout_log_prob)`` (trainer/ppo/rollout_corr_helper.py:849).

Statistics: ``max_abs_log_ratio`` over the loss's micro-batches (read from the ``model_output``
and ``old_log_probs`` that ``ppo_loss`` receives), ``clipfrac`` = verl's logged
``actor/pg_clipfrac``, ``approx_kl`` = ``actor/ppo_kl`` (means over the micro-batches).
"""

from __future__ import annotations

import importlib
import os
import socket
import tempfile
from collections.abc import Mapping
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.step import LengthPenalty, SampledRollout, StepBatch, StepResult
from ppo_ref.adapters.step_kit import (
    check_run,
    completion_logits,
    gradient_of,
    padded,
    save_tiny,
    step_result,
    tiny_config,
)

__all__ = ["LOSS_MODES", "TRUNCATION_CONVENTION", "VerlStep", "VerlStepAdapter", "make_adapter", "make_step"]

LOSS_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
"""Every ``actor.loss_agg_mode`` verl 0.9.1 accepts (``verl/workers/config/actor.py``,
valid_loss_agg_modes)."""

OVERLONG_BUFFER = 1
"""``overlong_buffer_cfg.len`` (DAPO's ``L_cache``) in :meth:`VerlStep.truncation_run`, with
``max_resp_len`` the budget and ``penalty_factor`` 1: the soft overlong penalty then reaches exactly
the rows of ``budget`` tokens, with -1."""

TRUNCATION_CONVENTION = LengthPenalty(
    buffer=OVERLONG_BUFFER,
    factor=1.0,
    source="DAPO's soft overlong punishment (Yu et al. 2025, Sec. 3.4, R_length(y)), length only, as "
    "verl 0.9.1's experimental/reward_loop/reward_manager/dapo.py DAPORewardManager.run_single computes it",
)
"""The STEP-5 convention this runner declares: the overlong penalty of :meth:`VerlStep.truncation_run`
(``L_cache`` = :data:`OVERLONG_BUFFER`, ``L_max`` = the budget, factor 1)."""

SCORE_FILE = """def compute_score(data_source, solution_str, ground_truth, extra_info=None, scores=()):
    # the step batch's score of this row (ground_truth holds the row's index)
    return float(scores[int(ground_truth)])
"""
"""The ``reward.custom_reward_function`` file the runner writes: verl calls it with the
``custom_reward_function.reward_kwargs`` (the batch's scores) merged in."""


def _cpu_platform() -> Any:
    """verl's CUDA platform with the CPU's device name, module and ids (a ``PlatformBase``)."""
    PlatformCUDA: Any = importlib.import_module("verl.plugin.platform.platform_cuda").PlatformCUDA

    class _Device:
        """``torch.cpu`` plus the memory queries verl logs (0 on the CPU)."""

        def __getattr__(self, name: str) -> Any:
            if hasattr(torch.cpu, name):
                return getattr(torch.cpu, name)
            if name == "get_device_name":
                return lambda *args, **kwargs: "CPU"
            if name == "mem_get_info":
                return lambda *args, **kwargs: (0, 0)
            if "memory" in name:
                return lambda *args, **kwargs: 0
            raise AttributeError(name)

    class PlatformCPU(PlatformCUDA):  # type: ignore[misc]
        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> Any:
            return _Device()

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def empty_cache(self) -> None:
            return None

        def communication_backend_name(self) -> str:
            return "gloo"

    return PlatformCPU()


def _setup_process() -> None:
    """A gloo process group of world size 1 and verl's CPU platform (once per process)."""
    import torch.distributed as dist

    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    platform_manager = importlib.import_module("verl.plugin.platform.platform_manager")

    if platform_manager.get_platform().device_name != "cpu":
        platform_manager.set_platform(_cpu_platform())
    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        for key, value in (
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", str(port)),
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "1"),
        ):
            os.environ.setdefault(key, value)
        dist.init_process_group("gloo", rank=0, world_size=1)


class _Profiler:
    """What ``DistProfiler.annotate`` and ``train_mini_batch`` read of a worker's profiler (disabled)."""

    rank = 0

    def check_enable(self) -> bool:
        return False

    def step(self) -> None:
        return None


def _trainer_config() -> Any:
    """verl's own trainer config, ``trainer/config/_generated_ppo_trainer.yaml`` (an OmegaConf)."""
    OmegaConf = importlib.import_module("omegaconf").OmegaConf
    verl_dir = os.path.dirname(str(importlib.import_module("verl").__file__))
    return OmegaConf.load(os.path.join(verl_dir, "trainer", "config", "_generated_ppo_trainer.yaml"))


class VerlStep:
    """One actor update of verl's trainer on a :class:`StepBatch` (see the module docstring).

    ``pad_to`` rounds the prompt width and the response width up to a multiple of it (the
    library's own width, None, is the prompt length and the token budget: verl's rollout pads every
    response to ``rollout.response_length``); ``pad_fill`` is the token id written in every padding
    slot of ``input_ids`` (None: the pad id)."""

    name = "verl"
    loss_modes = LOSS_MODES
    micro_batch_local: Mapping[str, str] = MappingProxyType({})
    accumulation_setting = (
        "actor.ppo_micro_batch_size_per_gpu within actor.ppo_mini_batch_size (the runner's micro-batches: "
        "verl has no other accumulation setting; FSDPEngine.forward_backward_batch runs a backward per "
        "micro-batch with the mini-batch's global token count, one optimizer_step per mini-batch)"
    )
    truncation_convention = TRUNCATION_CONVENTION
    sampling_convention = "full"
    provenance = (
        "verl RayPPOTrainer._compute_old_log_prob and _update_actor (left_right_2_no_padding, "
        "TrainingWorker.infer_batch/train_mini_batch/train_batch, FSDPEngine.forward_backward_batch with "
        "prepare_micro_batches, forward_step, workers/utils/losses.ppo_loss -> vanilla policy loss + "
        "agg_loss(global batch info)); rewards by the trainer's reward path: "
        "experimental.reward_loop.RewardLoopWorker (load_reward_manager -> the registered 'dapo' "
        "reward_loop DAPORewardManager.run_single, scores from reward.custom_reward_function) and "
        "assemble_rm_scores -> rm_scores -> extract_reward (outputs 'rewards': rm_scores summed per row), "
        "advantages by ray_trainer.compute_advantage (GRPO); FSDP2 engine on a gloo group of 1; gradient "
        "read at optimizer_step. Stand-ins: a CPU platform (platform_manager.set_platform) and "
        "VERL_ENGINE_DEVICE=cuda; the runner as the actor worker group (TrainingWorker in process, no Ray); "
        "RewardLoopWorker.compute_score_batch awaited in process (not a Ray actor). STEP-8: "
        "rollout_log_probs in the batch, rollout_corr_helper.compute_rollout_correction_and_add_to_batch "
        "(algorithm.rollout_correction, rollout_is token) between _compute_old_log_prob and the advantages; "
        "policy_logits from the saved tiny model loaded again by transformers (float32, eager)"
    )

    family_not_provided: Mapping[str, str] = MappingProxyType(
        {
            "gpt2": (
                "verl's FSDP engine cannot load a GPT-2 model: it calls apply_monkey_patch on every model "
                "(verl/workers/engine/fsdp/transformer_impl.py:324), which reads "
                "model.config.num_key_value_heads (verl/models/transformers/monkey_patch.py:334, again "
                "in its fallback at :340): GPT2Config has no such attribute, an AttributeError (measured)"
            )
        }
    )
    """STEP-7: the absolute-position family verl cannot run."""

    def __init__(
        self,
        seed: int = 0,
        loss_scale_factor: int | None = None,
        family: str | Mapping[str, Any] = "qwen2",
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(seed, int):
            raise ValueError(f"seed: expected an int, got {seed!r}")
        if loss_scale_factor is not None and (
            not isinstance(loss_scale_factor, int) or loss_scale_factor < 1
        ):
            raise ValueError(f"loss_scale_factor: expected None or an int >= 1, got {loss_scale_factor!r}")
        self.version = str(importlib.import_module("verl").__version__)
        self.seed = seed
        self.loss_scale_factor = loss_scale_factor
        self.family, self.settings = family, dict(settings or {})
        self._dir = tempfile.mkdtemp(prefix="ppo-ref-verl-step-")
        self._saved: dict[int, str] = {}

    # --- model, tokenizer, engine ---

    def _model_path(self, vocab_size: int) -> str:
        if vocab_size not in self._saved:
            path = os.path.join(self._dir, f"model-{vocab_size}")
            self._saved[vocab_size] = save_tiny(path, tiny_config(self.family, vocab_size), self.seed)
        return self._saved[vocab_size]

    def _worker(self, batch: StepBatch, loss_mode: str, micro: int) -> Any:
        """verl's ``TrainingWorker`` (its methods, on an instance built without Ray) around an
        initialised ``FSDPEngineWithLMHead`` and ``ppo_loss`` for ``loss_mode``."""
        from functools import partial

        CheckpointConfig = importlib.import_module("verl.trainer.config").CheckpointConfig
        FlopsCounter = importlib.import_module("verl.utils.flops_counter").FlopsCounter
        ActorConfig = importlib.import_module("verl.workers.config").ActorConfig
        FSDPEngineConfig = importlib.import_module("verl.workers.config").FSDPEngineConfig
        FSDPOptimizerConfig = importlib.import_module("verl.workers.config").FSDPOptimizerConfig
        HFModelConfig = importlib.import_module("verl.workers.config").HFModelConfig
        EngineRegistry = importlib.import_module("verl.workers.engine").EngineRegistry
        TrainingWorker = importlib.import_module("verl.workers.engine_workers").TrainingWorker
        ppo_loss = importlib.import_module("verl.workers.utils.losses").ppo_loss

        _setup_process()
        path = self._model_path(batch.vocab_size)
        model_config = HFModelConfig(
            path=path,
            use_remove_padding=False,
            enable_gradient_checkpointing=False,
            override_config={"attn_implementation": "eager"},
        )
        size = batch.size // micro
        engine_config = FSDPEngineConfig(
            strategy="fsdp2",
            use_dynamic_bsz=False,
            micro_batch_size_per_gpu=size,
            infer_micro_batch_size_per_gpu=batch.size,  # old log-probs in one forward of the whole batch
            mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
            use_torch_compile=False,
            use_remove_padding=False,
            seed=self.seed,
        )
        optimizer_config = FSDPOptimizerConfig(
            lr=1.0, optimizer="SGD", weight_decay=0.0, clip_grad=1e30, total_training_steps=1
        )
        model_config.model_type = "language_model"
        engine = EngineRegistry.new(
            model_type="language_model",
            backend="fsdp2",
            model_config=model_config,
            engine_config=engine_config,
            optimizer_config=optimizer_config,
            checkpoint_config=CheckpointConfig(),
        )
        engine.initialize()
        actor_config = ActorConfig(
            **{"loss_scale_factor": self.loss_scale_factor, **self.settings},
            strategy="fsdp",
            rollout_n=batch.group_size,
            ppo_mini_batch_size=len(batch.prompt_ids),
            ppo_micro_batch_size_per_gpu=size,
            loss_agg_mode=loss_mode,
            use_torch_compile=False,
        )
        worker = object.__new__(TrainingWorker)
        worker.__dict__.update(
            config=SimpleNamespace(model_type="language_model"),
            model_config=model_config,
            engine_config=engine_config,
            optimizer_config=optimizer_config,
            engine=engine,
            device_name="cpu",
            flops_counter=FlopsCounter(model_config.hf_config),
            profiler=_Profiler(),
            loss_fn=partial(ppo_loss, config=actor_config),
        )
        return worker

    # --- the rollout batch as verl's trainer receives it ---

    def _rollout(self, batch: StepBatch, pad_to: int | None, pad_fill: int | None) -> Any:
        import numpy as np

        DataProto = importlib.import_module("verl").DataProto
        compute_position_id_with_mask = importlib.import_module(
            "verl.utils.model"
        ).compute_position_id_with_mask

        layout = padded(batch, pad_to, pad_fill, response_width=batch.budget)
        attention_mask = layout.attention_mask
        data = DataProto.from_dict(
            tensors={
                "prompts": layout.prompt_ids,
                "responses": layout.response_ids,
                "input_ids": layout.input_ids,
                "attention_mask": attention_mask,
                "position_ids": compute_position_id_with_mask(attention_mask),
            },
            non_tensors={
                "uid": np.array([f"g{i // batch.group_size}" for i in range(batch.size)], dtype=object),
                "data_source": np.array(["ppo-ref"] * batch.size, dtype=object),
                "reward_model": np.array([{"ground_truth": str(i)} for i in range(batch.size)], dtype=object),
            },
        )
        return data

    def _reward_config(self, batch: StepBatch, overlong: bool) -> Any:
        """verl's trainer config (``_generated_ppo_trainer.yaml``) with the ``dapo`` reward manager,
        the runner's model as the tokenizer, the scores' ``custom_reward_function`` and DAPO's
        ``reward_kwargs`` (``overlong_buffer_cfg`` on when ``overlong``, ``max_resp_len`` the budget),
        set as a DAPO recipe sets them (``+reward.reward_kwargs...``)."""
        open_dict = importlib.import_module("omegaconf").open_dict
        config = _trainer_config()
        score_file = os.path.join(self._dir, "step_scores.py")
        if not os.path.exists(score_file):
            with open(score_file, "w", encoding="utf-8") as handle:
                handle.write(SCORE_FILE)
        with open_dict(config):
            config.actor_rollout_ref.model.path = self._model_path(batch.vocab_size)
            config.reward.num_workers = 1
            config.reward.reward_manager.name = "dapo"
            config.reward.custom_reward_function.path = score_file
            config.reward.custom_reward_function.name = "compute_score"
            config.reward.custom_reward_function.reward_kwargs = {"scores": [float(s) for s in batch.scores]}
            config.reward.reward_kwargs = {
                "max_resp_len": batch.budget,
                "overlong_buffer_cfg": {
                    "enable": overlong,
                    "len": TRUNCATION_CONVENTION.buffer,
                    "penalty_factor": TRUNCATION_CONVENTION.factor,
                    "log": False,
                },
            }
        return config

    def _rewards(self, batch: StepBatch, data: Any, overlong: bool) -> Any:
        """``rm_scores`` as verl's trainer reads them (``extract_reward``): every row through the
        ``RewardLoopWorker`` of ``RewardLoopManager`` (``compute_score_batch`` -> ``compute_score`` ->
        the reward_loop ``DAPORewardManager.run_single``) and ``assemble_rm_scores``."""
        reward_loop = importlib.import_module("verl.experimental.reward_loop.reward_loop")
        reward = importlib.import_module("verl.trainer.ppo.reward")

        config = self._reward_config(batch, overlong)
        worker = reward_loop.RewardLoopWorker(config)  # RewardLoopManager: ray.remote(RewardLoopWorker)
        outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
        scores = [item["reward_score"] for item in outputs]
        rm_scores = reward.resolve_reward_manager_cls(config).assemble_rm_scores(data, scores)
        scored = data.select(batch_keys=["responses"])
        scored.batch["rm_scores"] = rm_scores
        reward_tensor, _ = reward.extract_reward(scored)
        return reward_tensor

    # --- the step ---

    def policy_logits(self, batch: StepBatch) -> Tensor:
        """(B, L, V) the tiny model's logits at each completion position (temperature 1, the
        runner's), from the saved model loaded again by transformers (float32, eager attention)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            self._model_path(batch.vocab_size), attn_implementation="eager", dtype=torch.float32
        )
        model.eval()  # type: ignore[no-untyped-call]
        return completion_logits(model, batch, 1.0)

    def sampling_run(self, sampled: SampledRollout) -> StepResult:
        """One actor update (``token-mean``) on the suite's top-k / top-p rollout with verl's rollout
        correction at the token level (module docstring, STEP-8)."""
        if not isinstance(sampled, SampledRollout):
            raise ValueError(f"sampled: expected a SampledRollout, got {type(sampled).__name__}")
        return self._run(sampled.batch, "token-mean", 1, None, None, sampled)

    def run(
        self,
        batch: StepBatch,
        *,
        loss_mode: str,
        micro_batches: int = 1,
        pad_to: int | None = None,
        pad_fill: int | None = None,
    ) -> StepResult:
        """One actor update of verl's trainer on ``batch`` (module docstring)."""
        check_run(batch, loss_mode, LOSS_MODES, micro_batches, pad_to, pad_fill)
        return self._run(batch, loss_mode, micro_batches, pad_to, pad_fill)

    def _run(
        self,
        batch: StepBatch,
        loss_mode: str,
        micro_batches: int,
        pad_to: int | None,
        pad_fill: int | None,
        sampled: SampledRollout | None = None,
    ) -> StepResult:
        OmegaConf = importlib.import_module("omegaconf").OmegaConf
        AdvantageEstimator = importlib.import_module("verl.trainer.ppo.core_algos").AdvantageEstimator
        RayPPOTrainer = importlib.import_module("verl.trainer.ppo.ray_trainer").RayPPOTrainer
        compute_advantage = importlib.import_module("verl.trainer.ppo.ray_trainer").compute_advantage
        compute_response_mask = importlib.import_module("verl.trainer.ppo.ray_trainer").compute_response_mask
        no_padding_2_padding = importlib.import_module("verl.workers.utils.padding").no_padding_2_padding

        data = self._rollout(batch, pad_to, pad_fill)
        worker = self._worker(batch, loss_mode, micro_batches)
        record: dict[str, Any] = {"ratio": 0.0, "clip": [], "kl": [], "losses": []}
        loss_fn = worker.loss_fn

        def loss(model_output: Any, data: Any, dp_group: Any = None) -> Any:
            if torch.is_grad_enabled():
                logp = no_padding_2_padding(model_output["log_probs"], data).detach()
                fields = data.select("response_mask", "old_log_probs").to_padded_tensor()
                mask = fields["response_mask"].bool()
                diff = (logp - fields["old_log_probs"]).abs()[mask]
                record["ratio"] = max(record["ratio"], float(diff.max()))
            value, metrics = loss_fn(model_output=model_output, data=data, dp_group=dp_group)
            if torch.is_grad_enabled():
                record["clip"].append(float(metrics["actor/pg_clipfrac"].aggregate()))
                record["kl"].append(float(metrics["actor/ppo_kl"].aggregate()))
                record["losses"].append(float(value.detach()))
            return value, metrics

        worker.loss_fn = loss
        engine = worker.engine
        step = engine.optimizer_step

        def optimizer_step() -> float:
            record["gradient"] = gradient_of(engine.module.named_parameters())
            result: float = step()
            return result

        engine.optimizer_step = optimizer_step

        class Group:  # the actor worker group, in this process
            def compute_log_prob(self, td: Any) -> Any:
                return worker.infer_batch(td)

            def update_actor(self, td: Any) -> Any:
                return worker.train_mini_batch(td)

        config = OmegaConf.create(
            {
                "actor_rollout_ref": {
                    "rollout": {"n": batch.group_size, "temperature": 1.0, "multi_turn": {"enable": False}},
                    "actor": {
                        "calculate_entropy": False,
                        "entropy_coeff": 0.0,
                        "calculate_sum_pi_squared": False,
                        "ppo_mini_batch_size": len(batch.prompt_ids),
                        "ppo_epochs": 1,
                        "data_loader_seed": self.seed,
                        "shuffle": False,
                    },
                }
            }
        )
        trainer = SimpleNamespace(config=config, actor_rollout_wg=Group(), distillation_config=None)
        rewards = self._rewards(batch, data, overlong=False)
        data.batch["token_level_scores"] = rewards
        data.batch["token_level_rewards"] = rewards
        data.batch["response_mask"] = compute_response_mask(data)
        data.meta_info["temperature"] = 1.0
        data.meta_info["global_token_num"] = torch.sum(data.batch["attention_mask"], dim=-1).tolist()
        old, _ = RayPPOTrainer._compute_old_log_prob(trainer, data)
        data = data.union(old)
        if sampled is not None:  # RayPPOTrainer.fit's decoupled-mode correction, before the advantages
            helper = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
            width = data.batch["responses"].shape[1]
            data.batch["rollout_log_probs"] = sampled.padded("logprobs", width).float()
            corr = _trainer_config().algorithm.rollout_correction  # what fit() reads, rollout_is set
            corr.rollout_is = "token"
            data, _ = helper.compute_rollout_correction_and_add_to_batch(data, corr)
        data = compute_advantage(data, adv_estimator=AdvantageEstimator.GRPO, num_repeat=batch.group_size)
        output = RayPPOTrainer._update_actor(trainer, data)
        if "gradient" not in record:
            raise RuntimeError("verl's actor update took no optimizer step")
        metrics = output.meta_info["metrics"]
        stats: dict[str, float | None] = {
            "max_abs_log_ratio": record["ratio"],
            "clipfrac": sum(record["clip"]) / len(record["clip"]),
            "approx_kl": sum(record["kl"]) / len(record["kl"]),
            "micro_batches_run": float(len(record["losses"])),
        }
        logged = metrics.get("actor/loss")
        if isinstance(logged, (int, float)):
            stats["logged_loss"] = float(logged)
        outputs = {
            "loss_mask": data.batch["response_mask"],
            "rewards": data.batch["token_level_rewards"].sum(dim=1),
            "advantages": data.batch["advantages"],
        }
        if sampled is not None:
            outputs["correction_weights"] = data.batch["rollout_is_weights"]
        return step_result(record["gradient"], record["losses"], stats, outputs)

    def truncation_run(self, batch: StepBatch) -> StepResult:
        """The rewards of verl's trainer reward path (the reward_loop ``dapo`` manager) with
        ``overlong_buffer_cfg`` on (``len`` = :data:`OVERLONG_BUFFER`, ``max_resp_len`` = the
        budget, ``penalty_factor`` 1), which STEP-5 measures against score + the declared
        :data:`TRUNCATION_CONVENTION`. verl's only truncation-dependent handling: its GAE never
        bootstraps (``compute_gae_advantage_return`` ends every row with next value 0) and the
        default reward managers add no missing-EOS penalty. No gradient."""
        if not isinstance(batch, StepBatch):
            raise ValueError(f"batch: expected a StepBatch, got {type(batch).__name__}")
        data = self._rollout(batch, None, None)
        shaped = self._rewards(batch, data, overlong=True).sum(dim=1)
        return StepResult(gradient={}, loss=0.0, stats={}, outputs={"rewards": shaped})


def make_step() -> VerlStep:
    """The verl step runner (verl's own actor update, see :class:`VerlStep`)."""
    return VerlStep()


class VerlStepAdapter:
    """An adapter with no ops and the step runner only:
    ``--impl=ppo_ref.adapters.thirdparty.verl_step:make_adapter`` runs the trainer-step tier alone
    (``--impl=verl`` runs it after the op tier, through ``BUILTIN_STEP_RUNNERS``)."""

    name = "verl"
    ops: frozenset[str] = frozenset()
    conventions: Mapping[str, object] = MappingProxyType({})

    def __init__(self) -> None:
        self.version = str(importlib.import_module("verl").__version__)
        self.step = make_step()
        self.provenance = self.step.provenance


def make_adapter() -> VerlStepAdapter:
    """The step-only verl adapter (see :class:`VerlStepAdapter`)."""
    return VerlStepAdapter()
