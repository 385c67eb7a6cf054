"""Trainer-step tier for skyrl 0.4.0 (spec STEP-1..8; contract :mod:`ppo_ref.adapters.step`).

Every run goes through skyrl's own trainer and worker code, in this process, on the CPU (file:line of
the installed release, ``skyrl/...``), in the order of ``RayPPOTrainer.train``'s step
(``train/trainer.py:381-442``):

- the rollout is the ``GeneratorOutput`` that ``SkyRLGymGenerator.generate_batched`` returns
  (``train/generators/skyrl_gym_generator.py:953-963``: ``prompt_token_ids``, ``response_ids``, one reward
  per row, ``loss_masks`` of ones, ``stop_reasons``) with the batch's scores as the rewards and vLLM's
  stop reasons (``"stop"`` for a row ending with EOS, ``"length"`` for a row cut at the budget), and one
  uid per prompt;
- ``RayPPOTrainer.__init__`` (no dataset, generator or inference client: none is on this path), then
  ``postprocess_generator_output`` (:1040, the reward on each row's last token),
  ``convert_to_training_input`` (:865 -> ``train/dataset/preprocess.py:246``
  ``convert_prompts_responses_to_batch_tensors``: every row left-padded as one block, the response
  tensors right-aligned, the padding slots holding the tokenizer's pad id; mini-batch and prompt
  boundaries), ``fwd_logprobs_values_reward`` (:1334, the old log-probs, per mini-batch as
  ``recompute_old_logprobs_per_minibatch`` asks), ``compute_advantages_and_returns`` (:1151, GRPO:
  group mean, unbiased std + 1e-6) and ``train_critic_and_policy`` (:1586) -> ``_execute_training_step``
  (:1539: ``_normalize_advantages`` :1497 folds ``loss_reduction`` into the advantages per mini-batch
  with ``apply_loss_reduction_to_advantages_minibatch``, ``backends/skyrl_train/utils/ppo_utils.py:1152``;
  then ``forward_backward`` and ``optim_step`` per mini-batch);
- the worker: skyrl's ``FSDPPolicyWorkerBase`` (``backends/skyrl_train/workers/fsdp/fsdp_worker.py:38``),
  built by its own ``__init__`` chain, ``init_worker_process_group`` and ``init_model`` (``FSDPStrategy``,
  ``HFModelWrapper``, FSDP2 ``fully_shard``, AdamW) over a gloo group of one, fp32 parameters
  (``mixed_precision.param_dtype: fp32``), eager attention (``flash_attn: false``) and
  ``remove_microbatch_padding: false`` (packing needs flash-attn); ``PolicyWorkerBase.forward``
  (``workers/worker.py:1300``) for the old log-probs and ``forward_backward`` (:984: the split into
  micro-batches of ``micro_train_batch_size_per_gpu``, ``_forward_backward_micro`` :1064 with the
  ``regular`` policy loss ``ppo_policy_loss`` and ``strategy.backward`` per micro-batch); the gradient is
  read when ``optim_step`` (:1286) calls ``FSDPStrategy.optimizer_step`` (before its clipping);
- the model a tiny ``Qwen2ForCausalLM`` built from a fixed seed and saved to a temporary directory.

Settings besides the batch sizes (``train_batch_size`` and ``policy_mini_batch_size`` = the prompts,
one optimizer step; ``n_samples_per_prompt`` = the group size; ``micro_train_batch_size_per_gpu`` and
``micro_forward_batch_size_per_gpu`` = B / micro_batches): ``use_kl_loss: false`` (its default true
needs a reference model; the KL term is zero with zero gradient at step 0 anyway), ``max_seq_len`` = the
prompt length + the budget (``seq_mean_token_sum_norm``'s constant, which skyrl requires to be set: "often
matches ... ``max_model_len``", the longest sequence), ``logger: console`` and no Ray metrics or GPU
monitor (``enable_ray_prometheus_stats`` and ``enable_ray_gpu_monitor`` false: they need a Ray cluster).
Every other setting is ``SkyRLTrainConfig()``'s default, and the config passes skyrl's own ``validate_cfg``.

``pad_to``: the tensors are as wide as ``convert_prompts_responses_to_batch_tensors`` makes them for a
batch whose longest row has a prompt and a response of the padded widths (one such row is converted
with the batch and removed from every tensor it returns), so extra columns come as skyrl's own layout
puts them: on the left of every row, and on the left of the right-aligned response tensors.
``pad_fill``: the tokenizer's pad token is that id (``convert_to_training_input`` fills with
``tokenizer.pad_token_id``).

Stand-ins (also in ``provenance``), each for what a CPU process without Ray or CUDA lacks; none changes a
reward, the loss or its normalisation:

- ``flash_attn`` / ``flash_attn.bert_padding`` as import stubs (``workers/model_wrapper.py:13`` imports
  ``pad_input`` / ``unpad_input`` at top level; called only with ``remove_microbatch_padding``, off; the
  stubs raise if called);
- ``skyrl.tinker.types`` imported with ``typing.TypedDict`` bound to ``typing_extensions.TypedDict``
  (Python 3.11; :func:`ppo_ref.adapters.thirdparty.skyrl._import_tinker_types`);
- ``init_device_mesh`` on ``"cpu"`` where skyrl asks for ``"cuda"`` (``workers/worker.py:134``,
  ``distributed/fsdp_utils.py:256``), over a gloo process group of world size 1;
- ``Tensor.cuda`` returning the tensor (``fsdp_utils.py:125``), ``torch.cuda.current_device`` answering
  ``"cpu"``, ``synchronize`` / ``empty_cache`` / ``set_device`` / ``manual_seed_all`` doing nothing;
- ``DistributedTorchRayActor.__init__`` (``workers/worker.py:85``) setting rank 0 of a world of one
  without Ray (its log redirection and ``ray.get_gpu_ids`` left out); ``Worker.__init__`` and
  ``PolicyWorkerBase.__init__`` run as they are;
- the trainer's ``WorkerDispatch`` (``workers/worker_dispatch.py``) replaced by one in this process: the
  same calls on the one worker, the mini-batch slices ``MeshDispatch.stage_chunks`` makes at DP size 1
  (``distributed/dispatch.py:148-163``) without Ray's object store;
- the stop reasons and the rewards as the inference engine and the environment would give them (no vLLM,
  no skyrl-gym environment).

STEP-5 (:meth:`SkyrlStep.truncation_run`): skyrl's truncation handling is the generator's: with
``generator.apply_overlong_filtering`` (``skyrl_gym_generator.py:949-951`` and :1145-1147 ->
``train/generators/utils.py:393`` ``apply_overlong_filtering``) every row whose stop reason is not
``"stop"`` gets a loss mask of zeros, and with ``generator.zero_reward_on_non_stop``
(``skyrl_gym_generator.py:1141-1143`` -> :1172 ``_zero_reward_if_not_stop``) its reward is 0. The
truncation run switches both on and reads the loss mask and the rewards the trainer then holds.

Statistics: ``max_abs_log_ratio`` from the log-probs the policy loss receives in ``forward_backward``
against the old log-probs, on the loss mask; ``clipfrac`` = the trainer's ``loss_metrics/clip_ratio``;
``approx_kl`` None (skyrl's policy loss logs none). Outputs: ``loss_mask``, ``rewards`` (per-token
rewards summed per row) and ``advantages`` (before ``_normalize_advantages``), each row's completion
tokens moved to its first columns (skyrl right-aligns them).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import socket
import sys
import tempfile
import types
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.step import StepBatch, StepResult
from ppo_ref.adapters.step_kit import (
    check_run,
    gradient_of,
    padded_width,
    save_tiny,
    step_result,
    step_vocabulary,
    tiny_config,
    word_tokenizer,
)

__all__ = ["LOSS_MODES", "MICRO_BATCH_LOCAL", "SkyrlStep", "SkyrlStepAdapter", "make_adapter", "make_step"]

LOSS_MODES: tuple[str, ...] = (
    "token_mean",
    "token_mean_legacy",
    "sequence_mean",
    "seq_mean_token_sum_norm",
    "prompt_mean",
)
"""Every ``trainer.algorithm.loss_reduction`` skyrl 0.4.0 accepts (``train/utils/utils.py:488``
``validate_cfg``; ``backends/skyrl_train/utils/ppo_utils.py:1152``); ``token_mean`` is its default."""

MICRO_BATCH_LOCAL: Mapping[str, str] = MappingProxyType(
    {
        "token_mean_legacy": "skyrl/backends/skyrl_train/utils/ppo_utils.py:1184 "
        "apply_loss_reduction_to_advantages_minibatch: 'legacy token-mean that normalizes per-microbatch "
        "then averages across microbatches' (each micro_train_batch_size_per_gpu slice divided by its own "
        "token count and by the number of micro-batches)",
    }
)
"""The loss reduction skyrl documents as normalised within a micro-batch."""

_CUDA = ("current_device", "synchronize", "empty_cache", "set_device", "manual_seed_all")


def _flash_attn_called(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("flash_attn is an import stub of ppo-ref's skyrl step runner; it is not installed")


class _FlashAttnStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``flash_attn`` and ``flash_attn.bert_padding`` (``pad_input`` / ``unpad_input`` raise when called):
    imported by skyrl's model wrapper, never called with ``remove_microbatch_padding`` off. Only these two
    names (the OpenRLHF stubs also stub ``vllm``, which skyrl's config imports behind its own
    ``ModuleNotFoundError`` fallback, ``inference_servers/new_inference_worker_wrap.py:64-74``)."""

    NAMES = ("flash_attn", "flash_attn.bert_padding")

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name in self.NAMES else None

    def create_module(self, spec: Any) -> Any:
        module: Any = types.ModuleType(spec.name)
        module.__path__ = []
        if spec.name == "flash_attn.bert_padding":
            module.pad_input = module.unpad_input = _flash_attn_called
        return module

    def exec_module(self, module: Any) -> None:
        return None


def _on_cpu(init_device_mesh: Callable[..., Any]) -> Callable[..., Any]:
    def cpu_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return init_device_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    cpu_mesh._ppo_ref_cpu = True  # type: ignore[attr-defined]
    return cpu_mesh


def _setup_process() -> None:
    """The stand-ins of the module docstring and a gloo group of world size 1, once per process."""
    import torch.distributed as dist
    from torch.distributed import device_mesh

    if not any(isinstance(finder, _FlashAttnStub) for finder in sys.meta_path):
        sys.meta_path.append(_FlashAttnStub())  # last: a real installation still wins
    skyrl_adapter = importlib.import_module("ppo_ref.adapters.thirdparty.skyrl")
    skyrl_adapter._import_tinker_types()
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
    mesh: Any = device_mesh
    if not getattr(mesh.init_device_mesh, "_ppo_ref_cpu", False):
        mesh.init_device_mesh = _on_cpu(mesh.init_device_mesh)
    fsdp_utils: Any = importlib.import_module("skyrl.backends.skyrl_train.distributed.fsdp_utils")
    if not getattr(fsdp_utils.init_device_mesh, "_ppo_ref_cpu", False):
        fsdp_utils.init_device_mesh = _on_cpu(fsdp_utils.init_device_mesh)
    tensor: Any = torch.Tensor
    if not torch.cuda.is_available() and not getattr(tensor.cuda, "_ppo_ref_cpu", False):

        def no_cuda(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
            return self

        no_cuda._ppo_ref_cpu = True  # type: ignore[attr-defined]
        tensor.cuda = no_cuda
        for name in _CUDA:
            setattr(
                torch.cuda,
                name,
                (lambda *a, **k: "cpu") if name == "current_device" else (lambda *a, **k: None),
            )
    worker_module: Any = importlib.import_module("skyrl.backends.skyrl_train.workers.worker")
    actor = worker_module.DistributedTorchRayActor
    if not getattr(actor.__init__, "_ppo_ref_cpu", False):

        def no_ray_init(
            self: Any,
            world_size: int,
            rank: int,
            local_rank: int,
            master_addr: str | None,
            master_port: int | None,
            sequence_parallel_size: int,
            record_memory: bool = False,
        ) -> None:
            self._world_size, self._rank, self._local_rank = world_size, rank, local_rank
            self._master_addr, self._master_port = master_addr, master_port
            self.sequence_parallel_size = sequence_parallel_size
            self.record_memory = record_memory

        no_ray_init._ppo_ref_cpu = True  # type: ignore[attr-defined]
        actor.__init__ = no_ray_init


class _Dispatch:
    """The trainer's ``WorkerDispatch`` calls, on the one policy worker in this process."""

    def __init__(self, worker: Any, on_optimizer_step: Callable[[], None]) -> None:
        self.worker = worker
        self.on_optimizer_step = on_optimizer_step

    def get_lcm_dp_size(self) -> int:
        return int(self.worker.mesh_rank.dp_size)

    def stage_data(self, model: str, data: Any, boundaries: list[tuple[int, int]]) -> list[list[Any]]:
        self._policy(model)
        return [[data[start:end]] for start, end in boundaries]  # MeshDispatch.stage_chunks at DP size 1

    def forward(self, model: str, data: Any, **kwargs: Any) -> Any:
        self._policy(model)
        return self.worker.forward(data, **kwargs)

    def forward_from_staged(self, model: str, chunks: list[Any], **kwargs: Any) -> Any:
        self._policy(model)
        return self.worker.forward(chunks[0], **kwargs)

    def forward_backward_from_staged(self, model: str, chunks: list[Any], **kwargs: Any) -> Any:
        self._policy(model)
        return self.worker.forward_backward(chunks[0], **kwargs)

    def optim_step(self, model: str, model_id: str | None = None) -> float | None:
        self._policy(model)
        self.on_optimizer_step()
        norm: float | None = self.worker.optim_step()
        return norm

    def empty_cache(self, model: str | None = None) -> None:
        return None

    @staticmethod
    def _policy(model: str) -> None:
        if model != "policy":
            raise RuntimeError(
                f"skyrl's trainer asked for the {model!r} model; this step has the policy only"
            )


def _left_aligned(values: Tensor, lengths: list[int], width: int) -> Tensor:
    """(B, width) each row's last ``lengths[i]`` columns of ``values`` (skyrl right-aligns the response
    tensors) moved to its first columns, zeros after."""
    out = torch.zeros((values.shape[0], width), dtype=torch.float64)
    for i, length in enumerate(lengths):
        out[i, :length] = values[i, values.shape[1] - length :].double()
    return out


class SkyrlStep:
    """One policy update of skyrl 0.4.0's trainer on a :class:`StepBatch` (module docstring)."""

    name = "skyrl"
    loss_modes = LOSS_MODES
    micro_batch_local = MICRO_BATCH_LOCAL
    accumulation_setting = (
        "trainer.micro_train_batch_size_per_gpu within trainer.policy_mini_batch_size (the runner's "
        "micro-batches: PolicyWorkerBase.forward_backward runs a backward per micro-batch, and "
        "train_critic_and_policy one optim_step per mini-batch; the run counts the optimizer steps)"
    )
    provenance = (
        "skyrl.train.trainer.RayPPOTrainer (train/trainer.py): postprocess_generator_output, "
        "convert_to_training_input (preprocess.convert_prompts_responses_to_batch_tensors), "
        "fwd_logprobs_values_reward, compute_advantages_and_returns (grpo), train_critic_and_policy -> "
        "_execute_training_step (_normalize_advantages: apply_loss_reduction_to_advantages_minibatch per "
        "mini-batch); FSDPPolicyWorkerBase (init_model: FSDPStrategy, HFModelWrapper, fully_shard, AdamW; "
        "FSDP2 over a gloo group of one, fp32, eager attention, remove_microbatch_padding false) forward and "
        "forward_backward (micro_train_batch_size_per_gpu split, ppo_policy_loss 'regular', backward); "
        "gradient read at FSDPStrategy.optimizer_step (before clipping); rows as SkyRLGymGenerator's "
        "GeneratorOutput (rewards = the scores, stop_reasons 'stop' / 'length'); truncation_run with "
        "generator.apply_overlong_filtering (generators/utils.py apply_overlong_filtering) and "
        "zero_reward_on_non_stop (SkyRLGymGenerator._zero_reward_if_not_stop); outputs: the trainer's "
        "loss_mask, rewards, advantages. Stand-ins: flash_attn.bert_padding import stubs (never called); "
        "skyrl.tinker.types imported with typing_extensions.TypedDict (Python 3.11); init_device_mesh on "
        "'cpu'; Tensor.cuda identity and torch.cuda current_device 'cpu' / synchronize / empty_cache / "
        "set_device / manual_seed_all no-ops; DistributedTorchRayActor.__init__ without Ray; an in-process "
        "WorkerDispatch (MeshDispatch.stage_chunks' slices at DP size 1, no object store); stop reasons and "
        "rewards as vLLM and the environment give them; use_kl_loss false (no reference model); a tiny Qwen2"
    )

    family = "qwen2"
    """The model the runner builds: a tiny Qwen2 (rotary positions), and no other
    family: STEP-7 (left padding on GPT-2) is not run."""

    def __init__(self, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: expected an int, got {seed!r}")
        self.version = importlib.metadata.version("skyrl")
        self.seed = seed
        self._dir = tempfile.mkdtemp(prefix="ppo-ref-skyrl-step-")

    def _model_path(self, vocab_size: int) -> str:
        path = os.path.join(self._dir, f"model-{vocab_size}")
        if not os.path.isdir(path):
            save_tiny(path, tiny_config(self.family, vocab_size), self.seed)
        return path

    def _config(self, batch: StepBatch, loss_mode: str, micro_batches: int, truncation: bool) -> Any:
        config_module: Any = importlib.import_module("skyrl.train.config")
        utils: Any = importlib.import_module("skyrl.train.utils.utils")
        cfg = config_module.SkyRLTrainConfig()
        trainer, algorithm = cfg.trainer, cfg.trainer.algorithm
        trainer.strategy = "fsdp"
        trainer.logger = "console"
        trainer.enable_ray_gpu_monitor = False
        cfg.generator.inference_engine.enable_ray_prometheus_stats = False
        trainer.flash_attn = False
        trainer.remove_microbatch_padding = False
        trainer.seed = self.seed
        trainer.policy.model.path = self._model_path(batch.vocab_size)
        trainer.policy.fsdp_config.mixed_precision = config_module.MixedPrecisionConfig(param_dtype="fp32")
        trainer.train_batch_size = len(batch.prompt_ids)
        trainer.policy_mini_batch_size = len(batch.prompt_ids)
        trainer.micro_train_batch_size_per_gpu = batch.size // micro_batches
        trainer.micro_forward_batch_size_per_gpu = batch.size // micro_batches
        cfg.generator.n_samples_per_prompt = batch.group_size
        cfg.generator.apply_overlong_filtering = truncation
        cfg.generator.zero_reward_on_non_stop = truncation
        algorithm.loss_reduction = loss_mode
        algorithm.max_seq_len = len(batch.prompt_ids[0]) + batch.budget
        algorithm.use_kl_loss = False
        utils.validate_cfg(cfg)
        return cfg

    def _generator_output(self, batch: StepBatch, cfg: Any) -> tuple[dict[str, Any], list[str]]:
        """What ``SkyRLGymGenerator.generate_batched`` returns for the batch (module docstring), with the
        generator's own truncation handling where ``cfg`` switches it on."""
        generator_utils: Any = importlib.import_module("skyrl.train.generators.utils")
        generator: Any = importlib.import_module("skyrl.train.generators.skyrl_gym_generator")
        stop_reasons = ["stop" if row[-1] == batch.eos_id else "length" for row in batch.completions]
        rewards: list[Any] = [float(score) for score in batch.scores]
        loss_masks = [[1] * len(row) for row in batch.completions]
        if cfg.generator.zero_reward_on_non_stop:  # skyrl_gym_generator.py:1141-1143
            rewards = generator.SkyRLGymGenerator._zero_reward_if_not_stop(None, rewards, stop_reasons)
        if cfg.generator.apply_overlong_filtering:  # skyrl_gym_generator.py:949-951, 1145-1147
            loss_masks = generator_utils.apply_overlong_filtering(loss_masks, stop_reasons)
        output = {
            "prompt_token_ids": [list(batch.prompt_ids[i // batch.group_size]) for i in range(batch.size)],
            "response_ids": [list(row) for row in batch.completions],
            "rewards": rewards,
            "loss_masks": loss_masks,
            "stop_reasons": stop_reasons,
            "rollout_metrics": None,
            "rollout_logprobs": None,
            "trajectory_ids": None,
            "rollout_expert_indices": None,
            "rollout_sample_support": None,
            "is_last_step": None,
        }
        uids = [f"prompt-{i // batch.group_size}" for i in range(batch.size)]
        return output, uids

    def _worker(self, cfg: Any) -> Any:
        fsdp_worker: Any = importlib.import_module("skyrl.backends.skyrl_train.workers.fsdp.fsdp_worker")
        worker = fsdp_worker.FSDPPolicyWorkerBase(
            cfg=cfg.trainer,
            world_size=1,
            rank=0,
            local_rank=0,
            master_addr=os.environ["MASTER_ADDR"],
            master_port=int(os.environ["MASTER_PORT"]),
            sequence_parallel_size=1,
        )
        worker.init_worker_process_group()
        worker.init_model(cfg.trainer.policy.model.path, num_training_steps=1)
        return worker

    def _step(
        self,
        batch: StepBatch,
        loss_mode: str,
        micro_batches: int,
        pad_to: int | None,
        fill: int,
        truncation: bool,
    ) -> tuple[dict[str, Any], dict[str, Any], Any]:
        _setup_process()
        trainer_module: Any = importlib.import_module("skyrl.train.trainer")
        cfg = self._config(batch, loss_mode, micro_batches, truncation)
        names = {index: token for token, index in step_vocabulary(batch.vocab_size).items()}
        tokenizer = word_tokenizer(batch.vocab_size, pad=names[fill])
        trainer = trainer_module.RayPPOTrainer(
            cfg,
            tracker=None,
            tokenizer=tokenizer,
            train_dataset=None,
            inference_engine_client=None,
            generator=None,
        )
        worker = self._worker(cfg)
        record: dict[str, Any] = {"ratio": 0.0, "losses": [], "optimizer_steps": 0}

        def capture() -> None:
            record["gradient"] = gradient_of(worker.model.model.named_parameters())
            record["optimizer_steps"] += 1

        trainer.dispatch = _Dispatch(worker, capture)
        policy_loss = worker.policy_loss_fn

        def spy_loss(log_probs: Tensor, old_log_probs: Tensor, *args: Any, **kwargs: Any) -> Any:
            loss, metrics = policy_loss(log_probs, old_log_probs, *args, **kwargs)
            if torch.is_grad_enabled():
                mask = kwargs["loss_mask"] > 0
                diff = (log_probs.detach() - old_log_probs).abs()[mask]
                if diff.numel():
                    record["ratio"] = max(record["ratio"], float(diff.max()))
                record["losses"].append(float(loss.detach()))
            return loss, metrics

        worker.policy_loss_fn = spy_loss
        output, uids = self._generator_output(batch, cfg)
        # RayPPOTrainer.train's step (train/trainer.py:381-442)
        output, uids = trainer.postprocess_generator_output(output, uids)
        convert = trainer_module.convert_prompts_responses_to_batch_tensors
        if pad_to is not None:
            prompt_width = padded_width(len(batch.prompt_ids[0]), pad_to)
            response_width = padded_width(max(len(c) for c in batch.completions), pad_to)
            trainer_module.convert_prompts_responses_to_batch_tensors = _widened(
                convert, prompt_width, response_width, fill
            )
        try:
            data = trainer.convert_to_training_input(output, uids)
        finally:
            trainer_module.convert_prompts_responses_to_batch_tensors = convert
        data = trainer.fwd_logprobs_values_reward(data)
        data = trainer.compute_advantages_and_returns(data)
        lengths = [len(row) for row in batch.completions]
        width = max(lengths)
        outputs = {
            "loss_mask": _left_aligned(data["loss_mask"], lengths, width),
            "rewards": data["rewards"].double().sum(dim=1),
            "advantages": _left_aligned(data["advantages"], lengths, width),
        }
        record["columns"] = float(data["loss_mask"].shape[1])
        record["sequence_columns"] = float(data["sequences"].shape[1])
        slots = data["sequences"][data["attention_mask"] == 0].unique().tolist()
        record["padding_id"] = float(slots[0]) if len(slots) == 1 else None  # None: no or mixed padding
        data.pop("rewards")
        data.metadata.pop("uids")
        status = trainer.train_critic_and_policy(data)
        if "gradient" not in record:
            raise RuntimeError("skyrl's trainer took no optimizer step")
        return record, outputs, status

    def run(
        self,
        batch: StepBatch,
        *,
        loss_mode: str,
        micro_batches: int = 1,
        pad_to: int | None = None,
        pad_fill: int | None = None,
    ) -> StepResult:
        """One policy update of skyrl's trainer on ``batch`` (module docstring)."""
        fill = check_run(batch, loss_mode, LOSS_MODES, micro_batches, pad_to, pad_fill)
        record, outputs, status = self._step(batch, loss_mode, micro_batches, pad_to, fill, truncation=False)
        clip = status.get("loss_metrics/clip_ratio")
        stats: dict[str, float | None] = {
            "max_abs_log_ratio": record["ratio"],
            "clipfrac": None if clip is None else float(clip),
            "approx_kl": None,
            "micro_batches_run": float(len(record["losses"])),
            "optimizer_steps": float(record["optimizer_steps"]),
            "columns": record["columns"],
            "sequence_columns": record["sequence_columns"],
            "padding_id": record["padding_id"],
        }
        if isinstance(status.get("policy_loss"), (int, float)):
            stats["logged_loss"] = float(status["policy_loss"])
        return step_result(record["gradient"], record["losses"], stats, outputs)

    def truncation_run(self, batch: StepBatch) -> StepResult:
        """The step with skyrl's truncation handling on (``generator.apply_overlong_filtering`` and
        ``generator.zero_reward_on_non_stop``, module docstring): its outputs and gradient."""
        fill = check_run(batch, LOSS_MODES[0], LOSS_MODES)
        record, outputs, _ = self._step(batch, LOSS_MODES[0], 1, None, fill, truncation=True)
        return step_result(
            record["gradient"], record["losses"], {"max_abs_log_ratio": record["ratio"]}, outputs
        )


def _widened(
    convert: Callable[..., Any], prompt_width: int, response_width: int, fill: int
) -> Callable[..., Any]:
    """``convert_prompts_responses_to_batch_tensors`` for the batch plus one row of a ``prompt_width``
    prompt and a ``response_width`` response (loss mask 0, reward 0), that row removed from every tensor
    it returns: the batch as wide as skyrl pads it when its longest row is that wide."""

    def widened(pad_token_id: int, prompts: list[Any], responses: list[Any], rewards: list[Any],
                loss_masks: list[Any], logprobs: Any = None, *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        if (
            logprobs is not None
            or any(a is not None for a in args)
            or any(v is not None for k, v in kwargs.items() if k != "max_seq_len")
        ):
            raise RuntimeError("the widened layout takes rows without rollout log-probs, routes or support")
        rows = len(prompts)
        out = convert(
            pad_token_id,
            [*prompts, [fill] * prompt_width],
            [*responses, [fill] * response_width],
            [*rewards, [0.0] * response_width],
            [*loss_masks, [0] * response_width],
            **{k: v for k, v in kwargs.items() if k == "max_seq_len"},
        )
        return tuple(None if value is None else value[:rows] for value in out)

    return widened


def make_step() -> SkyrlStep:
    """The skyrl step runner (a policy update of skyrl 0.4.0's trainer, see :class:`SkyrlStep`)."""
    return SkyrlStep()


class SkyrlStepAdapter:
    """An adapter with no ops and the step runner only
    (``--impl=ppo_ref.adapters.thirdparty.skyrl_step:make_adapter``; ``--impl=skyrl`` runs the step tier
    after the op tier, through ``BUILTIN_STEP_RUNNERS``)."""

    name = "skyrl"
    ops: frozenset[str] = frozenset()
    conventions: Mapping[str, object] = MappingProxyType({})

    def __init__(self) -> None:
        self.step = make_step()
        self.version = self.step.version
        self.provenance = self.step.provenance


def make_adapter() -> SkyrlStepAdapter:
    """The step-only skyrl adapter (see :class:`SkyrlStepAdapter`)."""
    return SkyrlStepAdapter()
