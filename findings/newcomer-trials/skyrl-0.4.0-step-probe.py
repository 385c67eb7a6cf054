"""Feasibility probe for a skyrl 0.4.0 trainer-step runner (issue 22, Deliver 2's second half): not a runner.

Run from the repository root: ``.envs/skyrl/bin/python findings/newcomer-trials/skyrl-0.4.0-step-probe.py``
(imports only torch, transformers, typing_extensions and skyrl; no ppo_ref).

What it measures: skyrl 0.4.0's real FSDP2 policy worker builds and takes a training micro-step on a
CPU, and its gradient is the PPO formula's. ``FSDPPolicyWorkerBase.init_model``
(skyrl/backends/skyrl_train/workers/fsdp/fsdp_worker.py:44: ``FSDPStrategy``, ``HFModelWrapper``,
``fully_shard``, AdamW) on a tiny Qwen2 saved to a temporary directory, ``init_worker_process_group``'s
device mesh, ``RayPPOTrainer._normalize_advantages`` (token_mean folded into the advantages) and
``PolicyWorkerBase.forward_backward`` (worker.py) at ``TrainerConfig()`` defaults except fp32 FSDP
mixed precision (``param_dtype: fp32``; the default bf16 would make the cross-check a bf16 one), no
flash attention and ``remove_microbatch_padding: false``. The expected gradient: a plain fp32 copy of
the same checkpoint, loss = -sum_t A_t m_t log pi(a_t) / sum m (ratio 1 at step 0; the default KL loss
is 0 with its gradient at base = old), autograd. Measured 2026-12-04: max relative difference 3.2e-7
over the 15 parameters (exit 0 when below 1e-5).

Stand-ins, each for what a CPU process without Ray or CUDA lacks (none changes a number):
- ``flash_attn.bert_padding`` (model_wrapper.py:13 imports it at top level; used only with
  ``remove_microbatch_padding``, off here);
- ``init_device_mesh`` on ``"cpu"`` instead of ``"cuda"`` (``fsdp_utils.create_device_mesh``
  fsdp_utils.py:256, ``Worker.init_worker_process_group`` worker.py:134), a gloo process group of
  world size 1, ``torch.distributed.is_initialized`` answering True so the worker does not re-create it;
- ``Tensor.cuda`` returning the tensor (``_sync_non_persistent_buffers``, fsdp_utils.py:125, the one
  direct ``.cuda()`` on this path), ``torch.cuda.current_device`` answering ``"cpu"``,
  ``synchronize`` / ``empty_cache`` / ``set_device`` doing nothing;
- no Ray: the worker is ``object.__new__(FSDPPolicyWorkerBase)`` with the attributes
  ``DistributedTorchRayActor.__init__`` / ``PolicyWorkerBase.__init__`` set (worker.py:85-106, 974-982).

What a runner still needs (not done): the rollout through skyrl's own generator output ->
``RayPPOTrainer`` batch conversion and ``compute_advantages_and_returns`` (GRPO), micro-batch splits
through ``micro_train_batch_size_per_gpu``, padding to ``pad_to``, the ``StepRunner`` contract
(``ppo_ref/adapters/step.py``), its outputs for STEP-5, tests, and the step rows of the matrix.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
import types
import typing
from typing import Any

import torch
import torch.distributed as dist
import typing_extensions
from torch.distributed import device_mesh


class _NoFlashAttn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    NAMES = ("flash_attn", "flash_attn.bert_padding")

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name in self.NAMES else None

    def create_module(self, spec: Any) -> Any:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.pad_input = module.unpad_input = None  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: Any) -> None:
        return None


sys.meta_path.append(_NoFlashAttn())
_td = typing.TypedDict
typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
try:
    import skyrl.tinker.types  # noqa: F401  (Python 3.11: see findings/newcomer-trials/skyrl-0.4.0.md)
finally:
    typing.TypedDict = _td  # type: ignore[misc]

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo", rank=0, world_size=1)
_init_device_mesh = device_mesh.init_device_mesh
device_mesh.init_device_mesh = lambda device, *a, **k: _init_device_mesh("cpu", *a, **k)  # type: ignore[assignment]
dist.is_initialized = lambda: True  # type: ignore[assignment]
torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
torch.cuda.empty_cache = lambda: None  # type: ignore[assignment]
torch.cuda.set_device = lambda *a: None  # type: ignore[assignment]

from skyrl.backends.skyrl_train.distributed import fsdp_strategy, fsdp_utils  # noqa: E402
from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch  # noqa: E402
from skyrl.backends.skyrl_train.utils.ppo_utils import PolicyLossRegistry  # noqa: E402
from skyrl.backends.skyrl_train.workers.fsdp.fsdp_worker import FSDPPolicyWorkerBase  # noqa: E402
from skyrl.train.config import MixedPrecisionConfig, TrainerConfig  # noqa: E402
from skyrl.train.trainer import RayPPOTrainer  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402


def _cpu_mesh(world_size: int, fsdp_size: int) -> Any:
    return _init_device_mesh("cpu", (world_size,), mesh_dim_names=["fsdp"])


fsdp_utils.create_device_mesh = _cpu_mesh
fsdp_strategy.create_device_mesh = _cpu_mesh  # type: ignore[attr-defined]


def main() -> None:
    path = tempfile.mkdtemp()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    cfg = TrainerConfig()
    cfg.strategy = "fsdp"
    cfg.flash_attn = False
    cfg.remove_microbatch_padding = False
    cfg.policy.fsdp_config.mixed_precision = MixedPrecisionConfig(param_dtype="fp32")
    cfg.algorithm.temperature = 1.0  # None by default; Worker.__init__ refuses None (sampling temperature)
    worker: Any = object.__new__(FSDPPolicyWorkerBase)
    worker.cfg = cfg
    worker.sequence_parallel_size = 1
    worker.record_memory = False
    worker._world_size, worker._rank, worker._local_rank = 1, 0, 0
    worker.profiler = None
    worker.init_worker_process_group()
    worker.policy_loss_fn = PolicyLossRegistry.get(cfg.algorithm.policy_loss_type)
    worker.init_model(path, num_training_steps=1)
    print("init_model:", type(worker.model).__name__, type(worker.optimizer).__name__, worker.mesh_rank)

    n, prompt, actions = 2, 3, 4
    sequences = torch.randint(1, 64, (n, prompt + actions))
    attention = torch.ones_like(sequences)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    advantages = torch.tensor([[1.0, 1, 1, 1], [-1, -1, 0, 0]])
    with torch.no_grad():
        old = worker.model(sequences, actions, attention_mask=attention)
    data = TrainingInputBatch(
        {
            "sequences": sequences,
            "attention_mask": attention,
            "action_log_probs": old.detach(),
            "base_action_log_probs": old.detach(),
            "advantages": advantages,
            "loss_mask": mask,
            "response_mask": mask,
        }
    )
    data.metadata = {"global_step": 1, "response_length": actions}
    trainer = types.SimpleNamespace(cfg=types.SimpleNamespace(trainer=cfg))
    data = RayPPOTrainer._normalize_advantages(trainer, data, [(0, n)])  # type: ignore[arg-type]
    out = worker.forward_backward(data)
    print("forward_backward metrics:", {k: round(v, 6) for k, v in out.metrics.items() if k != "policy_lr"})

    reference = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32)
    position_ids = attention.cumsum(-1) - 1
    logits = reference(sequences, attention_mask=attention, position_ids=position_ids).logits.float()
    logp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, sequences[:, 1:, None])[..., 0][:, -actions:]
    (-(advantages * logp * mask).sum() / mask.sum()).backward()
    worst = 0.0
    pairs = zip(worker.model.model.named_parameters(), reference.named_parameters(), strict=True)
    for (_, got), (_, want) in pairs:
        grad = got.grad.full_tensor() if hasattr(got.grad, "full_tensor") else got.grad
        worst = max(worst, float((grad - want.grad).abs().max()) / max(float(want.grad.abs().max()), 1e-12))
    print(f"max relative gradient difference against the formula: {worst:.3g}")
    sys.exit(0 if worst < 1e-5 else 1)


if __name__ == "__main__":
    main()
