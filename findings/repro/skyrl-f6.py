"""skyrl-f6 (metrics-only: ``policy_loss_type: gspo`` with ``micro_train_batch_size_per_gpu`` > 1): GSPO's
logged ``loss_metrics/clip_ratio`` changes with the micro-batch size.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-f6.py``
(standalone: ``pip install --no-deps --ignore-requires-python skyrl==0.4.0`` plus the top-level imports
``tools/thirdparty_envs.py``'s recipe ``skyrl`` lists; imports only torch, numpy, typing_extensions and
skyrl).

Path: ``RayPPOTrainer._normalize_advantages`` (skyrl/train/trainer.py:1497: the trainer folds the loss
reduction into the advantages per mini-batch, ``apply_loss_reduction_to_advantages_minibatch``) then
``PolicyWorkerBase.forward_backward`` / ``CriticWorkerBase.forward_backward``
(skyrl/backends/skyrl_train/workers/worker.py: it splits the mini-batch into micro-batches itself and
each micro-batch's policy loss is a masked sum), configs skyrl's own ``TrainerConfig`` dataclass at its
defaults except what each case sets. Stand-ins only for what a CPU process without Ray/FSDP lacks: the
"model" returns one trainable log-prob (critic: value) per response token, so the gradient printed is
d loss / d logp; the strategy's ``backward`` is ``loss.backward()``; DP size 1;
``torch.cuda.current_device`` is the CPU.

The batch: two responses of 4 and 1 tokens, the first with every token clipped (log-ratio 0.5 against
the old log-probs), the second unclipped. Each micro-batch's clip fraction is a token share, and the
worker averages the micro-batches' values, so with one response per micro-batch (the default 1) the
logged number is the share of sequences, 0.5, and with both in one micro-batch the share of tokens,
0.8: the same batch logs a different statistic depending on a memory setting. Expected: the same value
at both micro-batch sizes (0.5, the share of sequences GSPO's ratio is per; or 0.8, the token share
the GSPO paper reports, at both). Got 0.8000 at micro-batch 2 and 0.5000 at the default 1, as
skyrl-train 0.3.1's ``ppo_clip_ratio``. The gradient is unaffected. Exit 1 when the two differ.

skyrl 0.4.0 declares Python >=3.12. On 3.11 ``skyrl/backends/__init__.py`` fails in pydantic ("Please
use `typing_extensions.TypedDict` instead of `typing.TypedDict` on Python < 3.12",
``skyrl/tinker/types.py``); the script imports that module with ``typing.TypedDict`` bound to
``typing_extensions.TypedDict`` (what Python 3.12's is) and restores it. No skyrl code is changed.
"""

from __future__ import annotations

import sys
import types
import typing
from typing import Any

import numpy as np
import torch
import typing_extensions

_td = typing.TypedDict
typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
try:
    import skyrl.tinker.types  # noqa: F401  (see the docstring)
finally:
    typing.TypedDict = _td  # type: ignore[misc]

from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch  # noqa: E402
from skyrl.backends.skyrl_train.utils import ppo_utils  # noqa: E402
from skyrl.backends.skyrl_train.workers.worker import PolicyWorkerBase  # noqa: E402
from skyrl.train.config import TrainerConfig  # noqa: E402
from skyrl.train.trainer import RayPPOTrainer  # noqa: E402

torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]  # CPU stand-in


def r(x: torch.Tensor, n: int = 4) -> list[Any]:
    return np.round(x.detach().double().numpy(), n).tolist()


def trainer_cfg(micro: int = 1, **algorithm: Any) -> TrainerConfig:
    cfg = TrainerConfig()
    cfg.micro_train_batch_size_per_gpu = micro
    for key, value in algorithm.items():
        setattr(cfg.algorithm, key, value)
    return cfg


def ppo_step(cfg: TrainerConfig, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    """One mini-batch through RayPPOTrainer._normalize_advantages then PolicyWorkerBase.forward_backward;
    returns d loss / d logp and the worker's metrics."""
    logp = torch.nn.Parameter(batch.get("policy_log_probs", batch["action_log_probs"]).clone())
    n, a = logp.shape

    def model(sequences: torch.Tensor, num_actions: int, **kwargs: Any) -> Any:
        rows = sequences[:, 0]  # the stand-in reads which responses this micro-batch holds
        return logp[rows] * 1.0, {"entropy": torch.zeros(sequences.shape)}

    model.train = model.eval = lambda: None  # type: ignore[attr-defined]
    sequences = torch.cat([torch.arange(n)[:, None], torch.zeros(n, a + 1, dtype=torch.long)], dim=1)
    fields = {
        "sequences": sequences,
        "attention_mask": torch.ones_like(sequences),
        "action_log_probs": batch["action_log_probs"],
        "base_action_log_probs": batch.get("base_action_log_probs", batch["action_log_probs"]),
        "advantages": batch["advantages"].clone(),
        "loss_mask": batch["loss_mask"],
        "response_mask": batch.get("response_mask", batch["loss_mask"]),
    }
    data = TrainingInputBatch(fields)
    data.metadata = {"global_step": 1, "response_length": a}
    trainer = types.SimpleNamespace(cfg=types.SimpleNamespace(trainer=cfg))
    data = RayPPOTrainer._normalize_advantages(trainer, data, [(0, n)])  # type: ignore[arg-type]
    worker = types.SimpleNamespace(
        cfg=cfg,
        model=model,
        optimizer=None,
        scheduler=types.SimpleNamespace(get_last_lr=lambda: [0.0]),
        strategy=types.SimpleNamespace(
            backward=lambda loss, model, optimizer: loss.backward(),
            all_reduce=lambda x, **kwargs: x,
        ),
        mesh_rank=types.SimpleNamespace(dp_size=1),
        device_mesh=types.SimpleNamespace(get_group=lambda name: None),
        policy_loss_fn=ppo_utils.PolicyLossRegistry.get(cfg.algorithm.policy_loss_type),
    )
    worker._forward_backward_micro = lambda *args, **kwargs: PolicyWorkerBase._forward_backward_micro(
        worker, *args, **kwargs
    )
    out = PolicyWorkerBase.forward_backward(worker, data)  # type: ignore[arg-type]
    grad = logp.grad.clone() if logp.grad is not None else torch.zeros_like(logp)
    return grad, out.metrics


def main() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    batch = {
        "policy_log_probs": torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]),
        "action_log_probs": torch.zeros(2, 4),
        "advantages": mask.clone(),
        "loss_mask": mask,
    }
    gspo = {"use_kl_loss": False, "policy_loss_type": "gspo", "loss_reduction": "sequence_mean"}
    _, two = ppo_step(trainer_cfg(2, **gspo), batch)
    _, one = ppo_step(trainer_cfg(1, **gspo), batch)
    key = "loss_metrics/clip_ratio"
    print(
        f"skyrl-f6 logged {key}: micro-batch 2 {two[key]:.4f}, micro-batch 1 (default) {one[key]:.4f}; "
        "share of sequences 0.5, share of tokens 0.8"
    )
    wrong = abs(two[key] - one[key]) > 1e-6
    print(
        "the logged clip ratio depends on the micro-batch size (skyrl-f6 reproduces)"
        if wrong
        else "the same at both micro-batch sizes (fixed)"
    )
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
