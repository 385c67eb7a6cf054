"""skyrl-4 and skyrl-f2 (non-default: ``generator.apply_overlong_filtering: true``): a response the filter
empties (its loss mask all zero, the row kept in the batch) still counts as a row, so the kept rows'
gradient shrinks with the sequence reductions, GSPO, CISPO ``sequence_mean``, the critic and the logged
KL.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-4.py``
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

The batch: one mini-batch of two 3-token responses, the second truncated and filtered by skyrl's own
``apply_overlong_filtering`` (skyrl/train/generators/utils.py), A = [1, 2, 3] on the kept row. The
sequence reductions divide by the mini-batch's row count: ``sequence_mean`` by ``batch_size *`` the
row's tokens (ppo_utils.py:1199), ``seq_mean_token_sum_norm`` by ``batch_size * max_seq_len``
(:1203), the critic and the KL loss ``masked_mean(..., dim=-1).mean()`` over every row
(``ppo_critic_loss``, ppo_utils.py:156; worker.py:1232).

Expected (the filtered row excluded, computed inline): d loss / d logp of the kept row
[-0.3333, -0.6667, -1.0] in every case; the logged ``policy_kl`` the kept row's k3 mean 0.08764; the
critic's d loss / d v [0.3333, 0.6667, 1.0]. Got [-0.1667, -0.3333, -0.5] with ``sequence_mean``
(micro-batch 1 and 2), ``seq_mean_token_sum_norm``, GSPO and CISPO with ``sequence_mean``;
``policy_kl`` 0.04382; critic [0.1667, 0.3333, 0.5]. Not affected (printed): the default ``token_mean``
at micro-batch 1 and 2 and CISPO with ``token_mean`` (skyrl-train 0.3.1 was wrong with ``token_mean``
at the default micro-batch 1; 0.4.0's per-mini-batch token count fixed that). Exit 1 when a case is
wrong.

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
from skyrl.backends.skyrl_train.workers.worker import CriticWorkerBase, PolicyWorkerBase  # noqa: E402
from skyrl.train.config import TrainerConfig  # noqa: E402
from skyrl.train.generators.utils import apply_overlong_filtering  # noqa: E402
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


def critic_step(cfg: TrainerConfig, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One mini-batch through CriticWorkerBase.forward_backward (values a trainable stand-in)."""
    v = torch.nn.Parameter(batch["values"].clone())
    n, a = v.shape

    def model(sequences: torch.Tensor, num_actions: int, **kwargs: Any) -> Any:
        return v[sequences[:, 0]] * 1.0

    model.train = model.eval = lambda: None  # type: ignore[attr-defined]
    sequences = torch.cat([torch.arange(n)[:, None], torch.zeros(n, a + 1, dtype=torch.long)], dim=1)
    data = TrainingInputBatch(
        {
            "sequences": sequences,
            "attention_mask": torch.ones_like(sequences),
            "values": batch["values"],
            "returns": batch["returns"],
            "loss_mask": batch["loss_mask"],
            "response_mask": batch["loss_mask"],
        }
    )
    data.metadata = {"global_step": 1, "response_length": a}
    worker = types.SimpleNamespace(
        cfg=cfg,
        model=model,
        optimizer=None,
        scheduler=types.SimpleNamespace(get_last_lr=lambda: [0.0]),
        strategy=types.SimpleNamespace(
            backward=lambda loss, model, optimizer: loss.backward(), all_reduce=lambda x, **kwargs: x
        ),
        mesh_rank=types.SimpleNamespace(dp_size=1),
        device_mesh=types.SimpleNamespace(get_group=lambda name: None),
        critic_loss_fn=ppo_utils.ppo_critic_loss,
        _micro_batches_accumulated=0,
    )
    worker._forward_backward_micro = lambda *args, **kwargs: CriticWorkerBase._forward_backward_micro(
        worker, *args, **kwargs
    )
    CriticWorkerBase.forward_backward(worker, data)  # type: ignore[arg-type]
    return v.grad.clone() if v.grad is not None else torch.zeros_like(v)


def close(x: torch.Tensor, y: torch.Tensor) -> bool:
    return bool(torch.allclose(x.double(), y.double(), rtol=1e-4, atol=1e-7))


def main() -> None:
    masks = apply_overlong_filtering([[1, 1, 1], [1, 1, 1]], ["stop", "length"])
    mask = torch.tensor(masks, dtype=torch.float32)
    print(f"skyrl-4 apply_overlong_filtering loss masks: {masks}")
    batch = {
        "action_log_probs": torch.zeros(2, 3),
        "base_action_log_probs": torch.zeros(2, 3),
        "advantages": torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]) * mask,
        "loss_mask": mask,
        "response_mask": torch.ones(2, 3),
    }
    expected = torch.tensor([-1 / 3, -2 / 3, -1.0])
    wrong = []
    for label, micro, alg in [
        ("token_mean, micro-batch 1 (default)", 1, {}),
        ("token_mean, micro-batch 2", 2, {}),
        ("sequence_mean, micro-batch 1", 1, {"loss_reduction": "sequence_mean"}),
        ("sequence_mean, micro-batch 2", 2, {"loss_reduction": "sequence_mean"}),
        (
            "seq_mean_token_sum_norm (max_seq_len 3)",
            1,
            {"loss_reduction": "seq_mean_token_sum_norm", "max_seq_len": 3},
        ),
        ("gspo, sequence_mean", 2, {"policy_loss_type": "gspo", "loss_reduction": "sequence_mean"}),
        ("cispo, token_mean", 1, {"policy_loss_type": "cispo"}),
        ("cispo, sequence_mean", 1, {"policy_loss_type": "cispo", "loss_reduction": "sequence_mean"}),
    ]:
        got, _ = ppo_step(trainer_cfg(micro, use_kl_loss=False, **alg), batch)
        ok = close(got[0], expected)
        wrong += [] if ok else [label]
        print(f"  {label}: kept row expected {r(expected)} got {r(got[0])}{'' if ok else '  <- wrong'}")
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.5, -1.0, -2.0]])
    ref = torch.tensor([[-1.0, -0.7, -2.5], [-1.0, -0.7, -2.5]])
    kl_batch = {
        **batch,
        "action_log_probs": logp,
        "base_action_log_probs": ref,
        "advantages": torch.zeros(2, 3),
    }
    _, metrics = ppo_step(trainer_cfg(2), kl_batch)
    kl = (torch.exp(ref[0] - logp[0]) - (ref[0] - logp[0]) - 1).mean()
    ok = abs(metrics["policy_kl"] - kl.item()) < 1e-6
    wrong += [] if ok else ["policy_kl"]
    print(f"  policy_kl (micro-batch 2): expected {kl.item():.5f} got {metrics['policy_kl']:.5f}")
    values = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    cgrad = critic_step(trainer_cfg(2), {"values": values, "returns": torch.zeros(2, 3), "loss_mask": mask})
    cexp = torch.tensor([1 / 3, 2 / 3, 1.0])
    ok = close(cgrad[0], cexp)
    wrong += [] if ok else ["critic"]
    print(f"  critic d loss / d v (micro-batch 2): kept row expected {r(cexp)} got {r(cgrad[0])}")
    print(
        f"rows without action tokens counted (skyrl-4 / skyrl-f2 reproduce): {', '.join(wrong)}"
        if wrong
        else "rows without action tokens not counted (fixed)"
    )
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
