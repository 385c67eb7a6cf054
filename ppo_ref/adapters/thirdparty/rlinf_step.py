"""Trainer-step tier for RLinf 0.3.0 (spec STEP-1..8; contract :mod:`ppo_ref.adapters.step`).

Every run goes through RLinf's reasoning actor, ``rlinf.workers.actor.fsdp_actor_worker.FSDPActor``,
in this process, on the CPU:

- the actor is built by its own ``__init__`` and ``FSDPModelManager.setup_model_and_optimizer``
  (``init_worker`` without its rollout-weight handshake): FSDP2 (``fully_shard``) over a gloo group of
  one, fp32 parameters and ``mixed_precision``, AMP and the grad scaler off, AdamW at lr 0;
- the rows are a ``rlinf.data.io_struct.RolloutResult`` (``is_end`` = the row ends with EOS, as
  ``from_sglang_results`` sets it from finish_reason "stop"; ``rewards`` = the batch's scores, RLinf's
  reward worker is not on this path) turned into the actor's batch by its own ``to_actor_batch``: the
  prompt left-padded to ``data.max_prompt_length``, the completion right-padded to
  ``encoder_seq_length - max_prompt_length`` with ``pad_fill`` as ``pad_token``, ``attention_mask``,
  ``response_mask``, ``position_ids``;
- the old log-probs from ``FSDPActor.inference_step`` (``recomputed_logprobs``, one forward of the whole
  batch, as ``run_inference`` calls it under no_grad), the advantages from
  ``FSDPActor.compute_advantages_and_returns`` (``calculate_adv_and_returns``, ``adv_type: grpo``), the
  update from ``FSDPActor.training_step``: ``_split_to_micro_batch`` (``actor.micro_batch_size`` = B /
  micro_batches), ``forward_batch``, ``policy_loss`` (``loss_type: actor`` -> ``compute_ppo_actor_loss``
  with ``get_loss_agg_func(loss_agg_func)``), ``loss / gradient_accumulation``, backward; the gradient
  is read when it calls ``optimizer_step`` (before clipping), and the loss is ``actor/final_loss``
  (the mean over micro-batches of their losses = the sum of the backward losses).
- The model: a tiny ``Qwen2ForCausalLM`` from a fixed seed saved to a temporary directory, loaded by
  ``model_provider_func``.

Stand-ins (also in ``provenance``; none touches a reward, the loss or its normalisation):
``Worker.torch_device_type = "cpu"`` and a CPU ``Worker.torch_platform`` (RLinf has no CPU accelerator:
both are None under ``AcceleratorType.NO_ACCEL``, and ``create_device_mesh`` fails,
``rlinf/hybrid_engines/fsdp/utils.py:65``); ``Worker.__init__`` setting rank 0 of a group of one instead
of Ray's actor plumbing (``rlinf/scheduler/worker/worker.py:417``); eager attention where
``model_provider_func`` asks for ``flash_attention_2`` unconditionally
(``rlinf/hybrid_engines/fsdp/fsdp_model_manager.py:155-159``; flash-attn is CUDA-only);
``algorithm.entropy_op_type: torch`` (a setting; its default ``flash_attn`` is CUDA-only).
The feasibility note is ``findings/newcomer-trials/rlinf-step.md``.

Statistics: ``max_abs_log_ratio`` from the log-probs ``forward_batch`` returns inside
``training_step`` against the micro-batch's ``recomputed_logprobs`` on its ``response_mask``;
``clipfrac`` = ``actor/clip_fraction``, ``approx_kl`` = ``actor/approx_kl`` (means over micro-batches).
Outputs: ``loss_mask`` (the ``response_mask`` the loss reads) and ``advantages``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import socket
import tempfile
from collections.abc import Mapping
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.step import StepBatch, StepResult
from ppo_ref.adapters.step_kit import check_run, gradient_of, padded, save_tiny, step_result, tiny_config

__all__ = ["LOSS_MODES", "RlinfStep", "RlinfStepAdapter", "make_adapter", "make_step"]

LOSS_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
"""Every ``algorithm.loss_agg_func`` RLinf 0.3.0 accepts (``rlinf/utils/utils.py:345``
``get_loss_agg_func``); ``token-mean`` is its documented default."""

MICRO_BATCH_LOCAL: Mapping[str, str] = MappingProxyType({})
"""RLinf documents no aggregation as normalised within a micro-batch."""


class _CpuPlatform:
    """torch.cuda's calls that RLinf's FSDP path makes on ``Worker.torch_platform``, for the CPU."""

    @staticmethod
    def set_device(index: int) -> None:
        return None

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def synchronize() -> None:
        return None


def _setup_process() -> None:
    """The stand-ins (module docstring) and a gloo group of world size 1, once per process."""
    import torch.distributed as dist

    worker_module = importlib.import_module("rlinf.scheduler")
    worker: Any = worker_module.Worker
    if not getattr(worker, "_ppo_ref_cpu", False):
        worker.torch_platform = _CpuPlatform()
        worker.torch_device_type = "cpu"

        def no_ray_init(self: Any, *args: Any, **kwargs: Any) -> None:
            self._rank = 0
            self._world_size = 1
            self._is_ray_actor = False
            self._timer_metrics = {}  # set by _env_setup_before_init (worker.py:373) in a Ray worker

        worker.__init__ = no_ray_init
        manager: Any = importlib.import_module("rlinf.hybrid_engines.fsdp.fsdp_model_manager")
        auto_config = manager.AutoConfig

        class EagerAutoConfig:
            @staticmethod
            def from_pretrained(*args: Any, **kwargs: Any) -> Any:
                if kwargs.get("attn_implementation") == "flash_attention_2":
                    kwargs["attn_implementation"] = "eager"
                return auto_config.from_pretrained(*args, **kwargs)

        manager.AutoConfig = EagerAutoConfig
        worker._ppo_ref_cpu = True
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


def _config(
    model_path: str, loss_mode: str, batch: StepBatch, micro: int, prompt_width: int, response_width: int
) -> Any:
    omegaconf: Any = importlib.import_module("omegaconf")

    fsdp = {
        "strategy": "fsdp2", "use_liger_kernel": False, "gradient_checkpointing": False,
        "mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        "amp_autocast": {"enabled": False, "precision": "bf16"}, "grad_scaler": {"enabled": False},
        "cpu_offload": False, "offload_pin_memory": False, "reshard_after_forward": True,
        "enable_gradient_accumulation": False,
    }  # fmt: skip
    return omegaconf.OmegaConf.create(
        {
            "data": {"max_prompt_length": prompt_width, "rollout_batch_size": len(batch.prompt_ids)},
            "runner": {"task_type": "reasoning"},
            "rollout": {"group_name": "RolloutGroup"},
            "algorithm": {
                "calculate_entropy": False, "entropy_bonus": 0.0, "kl_beta": 0.0,
                "kl_penalty_type": "low_var_kl", "group_size": batch.group_size, "loss_agg_func": loss_mode,
                "n_minibatches": 1, "entropy_op_type": "torch", "ratio_clip_eps": 0.2, "loss_type": "actor",
                "adv_type": "grpo", "logprob_forward_micro_batch_size": batch.size,
                "sampling_params": {"temperature": 1.0},
            },
            "actor": {
                "micro_batch_size": micro,
                "model": {
                    "encoder_seq_length": prompt_width + response_width, "precision": "fp32",
                    "model_path": model_path,
                },
                "optim": {
                    "lr": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "clip_grad": 1e9, "weight_decay": 0.0,
                },
                "fsdp_config": fsdp,
            },
        }
    )  # fmt: skip


class RlinfStep:
    """One ``FSDPActor.training_step`` of RLinf 0.3.0 on a :class:`StepBatch` (module docstring)."""

    name = "rlinf"
    loss_modes = LOSS_MODES
    micro_batch_local = MICRO_BATCH_LOCAL
    accumulation_setting = (
        "actor.micro_batch_size (the runner's micro-batches: FSDPActor.training_step splits the batch "
        "with _split_to_micro_batch, divides each micro-batch's loss by gradient_accumulation "
        "(rlinf/workers/actor/fsdp_actor_worker.py:819), one backward each, one optimizer_step)"
    )
    provenance = (
        "rlinf.workers.actor.fsdp_actor_worker.FSDPActor (reasoning; FSDP2 over a gloo group of one, fp32): "
        "__init__ + FSDPModelManager.setup_model_and_optimizer; rows as RolloutResult(is_end = ends with "
        "EOS, rewards = scores).to_actor_batch; inference_step (recomputed_logprobs), "
        "compute_advantages_and_returns (calculate_adv_and_returns, grpo), training_step (micro-batch split, "
        "forward_batch, policy_loss 'actor' -> compute_ppo_actor_loss with get_loss_agg_func, loss / "
        "gradient_accumulation, backward); gradient read at optimizer_step; outputs: the response_mask the "
        "loss reads, the advantages. Stand-ins: Worker.torch_device_type 'cpu' and a CPU torch_platform (no "
        "CPU accelerator in RLinf), Worker.__init__ without Ray, eager attention where model_provider_func "
        "asks for flash_attention_2, entropy_op_type torch; rewards = the batch's scores (no reward worker); "
        "a tiny Qwen2"
    )
    truncation_convention = None
    truncation_not_provided = (
        "RLinf 0.3.0's reasoning path has no truncation handling: RolloutResult.is_end (the stop reason) "
        "reaches the actor's batch (rlinf/data/io_struct.py:795,832, to_actor_batch) but only the rollout "
        "metrics read it (rlinf/utils/distributed.py:67,199); the loss mask, the rewards and the GRPO "
        "advantages of a row cut at the budget are those of a row that ended"
    )

    family = "qwen2"
    """The model the runner builds: a tiny Qwen2 (rotary positions), and no other
    family: STEP-7 (left padding on GPT-2) is not run."""

    def __init__(self, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: expected an int, got {seed!r}")
        self.version = importlib.metadata.version("rlinf")
        self.seed = seed
        self._dir = tempfile.mkdtemp(prefix="ppo-ref-rlinf-step-")

    def _model_path(self, vocab_size: int) -> str:
        path = os.path.join(self._dir, f"model-{vocab_size}")
        if not os.path.isdir(path):
            save_tiny(path, tiny_config(self.family, vocab_size), self.seed)
        return path

    def run(
        self,
        batch: StepBatch,
        *,
        loss_mode: str,
        micro_batches: int = 1,
        pad_to: int | None = None,
        pad_fill: int | None = None,
    ) -> StepResult:
        """One ``FSDPActor.training_step`` on ``batch`` (module docstring)."""
        fill = check_run(batch, loss_mode, LOSS_MODES, micro_batches, pad_to, pad_fill)
        _setup_process()
        actor_module: Any = importlib.import_module("rlinf.workers.actor.fsdp_actor_worker")
        io_struct: Any = importlib.import_module("rlinf.data.io_struct")
        rows = padded(batch, pad_to, fill)
        prompt_width, response_width = int(rows.prompt_ids.shape[1]), int(rows.response_ids.shape[1])
        prompts = [list(batch.prompt_ids[i // batch.group_size]) for i in range(batch.size)]
        result = io_struct.RolloutResult(
            num_sequence=batch.size,
            group_size=batch.group_size,
            prompt_lengths=[len(p) for p in prompts],
            prompt_ids=prompts,
            response_lengths=[len(c) for c in batch.completions],
            response_ids=[list(c) for c in batch.completions],
            is_end=[c[-1] == batch.eos_id for c in batch.completions],  # sglang: finish_reason "stop"
            rewards=torch.tensor(batch.scores, dtype=torch.float32),
        )
        rollout: dict[str, Tensor] = result.to_actor_batch(
            data_seq_length=prompt_width, training_seq_length=prompt_width + response_width, pad_token=fill
        )
        cfg = _config(
            self._model_path(batch.vocab_size), loss_mode, batch, batch.size // micro_batches,
            prompt_width, response_width,
        )  # fmt: skip
        actor: Any = actor_module.FSDPActor(cfg, SimpleNamespace(is_disaggregated=False))
        actor.setup_model_and_optimizer()
        with torch.no_grad():
            recomputed, _ = actor.inference_step(
                rollout, num_sequences=batch.size, compute_ref_logprobs=False
            )
        rollout["recomputed_logprobs"] = recomputed
        rollout = actor.compute_advantages_and_returns(rollout)
        record: dict[str, Any] = {"ratio": 0.0}
        forward = actor.forward_batch

        def spy_forward(m_batch: dict[str, Any], calculate_entropy: bool = False) -> Any:
            out = forward(m_batch, calculate_entropy)
            logprobs = out[0] if isinstance(out, tuple) else out
            if torch.is_grad_enabled() and "recomputed_logprobs" in m_batch:
                mask = m_batch["response_mask"][:, -actor.response_len :].bool()
                diff = (logprobs.detach() - m_batch["recomputed_logprobs"]).abs()[mask]
                if diff.numel():
                    record["ratio"] = max(record["ratio"], float(diff.max()))
            return out

        step = actor.optimizer_step

        def capture_step() -> Any:
            record["gradient"] = gradient_of(actor.model.named_parameters())
            return step()

        actor.forward_batch = spy_forward
        actor.optimizer_step = capture_step
        metrics = actor.training_step({k: v.clone() for k, v in rollout.items()})
        if "gradient" not in record:
            raise RuntimeError("RLinf's FSDPActor.training_step took no optimizer step")
        width = max(len(c) for c in batch.completions)
        stats: dict[str, float | None] = {
            "max_abs_log_ratio": record["ratio"],
            "clipfrac": float(metrics["actor/clip_fraction"]),
            "approx_kl": float(metrics["actor/approx_kl"]),
            "micro_batches_run": float(actor.gradient_accumulation),
            "columns": float(response_width),
        }
        outputs = {
            "loss_mask": rollout["response_mask"][:, -response_width:][:, :width].double(),
            "advantages": rollout["advantages"][:, :width].double(),
        }
        return step_result(record["gradient"], [float(metrics["actor/final_loss"])], stats, outputs)


def make_step() -> RlinfStep:
    """The RLinf step runner (``FSDPActor.training_step`` of RLinf 0.3.0)."""
    return RlinfStep()


class RlinfStepAdapter:
    """An adapter with no ops and the step runner only (the op tier is
    :mod:`ppo_ref.adapters.thirdparty.rlinf`'s)."""

    name = "rlinf"
    ops: frozenset[str] = frozenset()
    conventions: Mapping[str, object] = MappingProxyType({})

    def __init__(self) -> None:
        self.step = make_step()
        self.version = self.step.version
        self.provenance = self.step.provenance


def make_adapter() -> RlinfStepAdapter:
    """The step-only RLinf adapter (see :class:`RlinfStepAdapter`)."""
    return RlinfStepAdapter()
