"""The skyrl findings re-run on skyrl 0.4.0 (issue 22), through 0.4.0's own training path.

Run from the repository root: ``.envs/skyrl04/bin/python findings/newcomer-trials/skyrl-0.4.0-recheck.py``
(standalone: ``pip install --no-deps --ignore-requires-python skyrl==0.4.0`` plus what
``tools/thirdparty_envs.py``'s recipe ``skyrl04`` lists; imports only torch, numpy and skyrl).

The 0.3.1 scripts (``findings/repro/skyrl-*.py``) drive ``skyrl_train``, which 0.4.0 renamed and
restructured: the worker is ``skyrl.backends.skyrl_train.workers.worker.PolicyWorkerBase``, its
``forward_backward`` splits a mini-batch into micro-batches itself and each micro-batch's policy loss
is a masked *sum*, because ``RayPPOTrainer._normalize_advantages`` (``skyrl/train/trainer.py:1497``)
first folds the loss reduction into the advantages (``apply_loss_reduction_to_advantages_minibatch``).
So each finding here runs (1) the trainer's ``_normalize_advantages`` on the mini-batch, then (2) the
worker's ``forward_backward`` on it, with stand-ins only for what a CPU process without Ray/FSDP lacks:
the "model" returns one trainable log-prob per response token (so the gradient is d loss / d logp),
the strategy's ``backward`` is ``loss.backward()``, DP size 1, ``torch.cuda.current_device`` is the CPU.
Configs are skyrl's own ``TrainerConfig`` dataclass at its defaults except what each check sets.

skyrl 0.4.0 declares Python >=3.12. On 3.11 ``skyrl/backends/__init__.py`` fails in pydantic ("Please
use `typing_extensions.TypedDict` instead of `typing.TypedDict` on Python < 3.12",
``skyrl/tinker/types.py:132``); the script imports that module with ``typing.TypedDict`` bound to
``typing_extensions.TypedDict`` (what Python 3.12's is) and restores it.

Prints one block per finding with expected and got, and a last line per finding: ``HOLDS``,
``FIXED`` or ``CHANGED``. Exit 1 if any finding still holds, else 0.
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
from skyrl.backends.skyrl_train.utils import ppo_utils, torch_utils  # noqa: E402
from skyrl.backends.skyrl_train.workers.worker import CriticWorkerBase, PolicyWorkerBase  # noqa: E402
from skyrl.train.config import AlgorithmConfig, CISPOConfig, TrainerConfig  # noqa: E402
from skyrl.train.generators.utils import apply_overlong_filtering  # noqa: E402
from skyrl.train.trainer import RayPPOTrainer  # noqa: E402

torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]  # CPU stand-in
VERDICTS: dict[str, str] = {}


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


def verdict(name: str, holds: bool, note: str = "") -> None:
    VERDICTS[name] = "HOLDS" if holds else "FIXED"
    print(f"{name}: {'HOLDS' if holds else 'FIXED'}{(' ' + note) if note else ''}\n")


def close(x: torch.Tensor, y: torch.Tensor) -> bool:
    return bool(torch.allclose(x.double(), y.double(), rtol=1e-4, atol=1e-7))


def skyrl_2() -> None:
    """skyrl-2 / skyrl-f1: the KL loss's gradient at the defaults (use_kl_loss, k3, coef 0.001)."""
    logp = torch.tensor([[-0.5, -1.0, -2.0]])
    ref = torch.tensor([[-1.0, -0.7, -2.5]])
    batch = {
        "action_log_probs": logp,
        "base_action_log_probs": ref,
        "advantages": torch.zeros(1, 3),
        "loss_mask": torch.ones(1, 3),
    }
    cfg = trainer_cfg()
    alg = cfg.algorithm
    print(
        f"skyrl-2 defaults: use_kl_loss={alg.use_kl_loss} kl_loss_coef={alg.kl_loss_coef} "
        f"kl_estimator_type={alg.kl_estimator_type} loss_reduction={alg.loss_reduction}"
    )
    got, metrics = ppo_step(cfg, batch)
    expected = alg.kl_loss_coef * (1 - torch.exp(ref - logp)) / 3
    print(
        f"  d loss / d logp expected {r(expected[0], 7)} got {r(got[0], 7)}; "
        f"policy_kl {metrics['policy_kl']:.6f}"
    )
    verdict("skyrl-2/skyrl-f1", not close(got, expected))


def skyrl_4() -> None:
    """skyrl-4 / skyrl-f2: a response filtered by apply_overlong_filtering still counts as a row."""
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
    verdict("skyrl-4/skyrl-f2", bool(wrong), f"(wrong: {', '.join(wrong)})" if wrong else "")


def skyrl_f3() -> None:
    """skyrl-f3: CISPO's default bounds; the IS weight of a token with ratio 0.5."""
    c = CISPOConfig()
    print(
        f"skyrl-f3 CISPOConfig defaults: low {c.cispo_eps_clip_low} high {c.cispo_eps_clip_high} -> bounds "
        f"[{1 - c.cispo_eps_clip_low}, {1 + c.cispo_eps_clip_high}]"
    )
    batch = {
        "policy_log_probs": torch.tensor([[float(np.log(0.5))]]),
        "action_log_probs": torch.zeros(1, 1),
        "advantages": torch.ones(1, 1),
        "loss_mask": torch.ones(1, 1),
    }
    got, _ = ppo_step(trainer_cfg(use_kl_loss=False, policy_loss_type="cispo"), batch)
    # CISPO: loss = -A * clamp(ratio).detach() * logp, so d loss / d logp = -A * w: w = -grad
    weight = -got[0, 0].item()
    print(f"  IS weight of ratio 0.5: expected 0.5 got {weight:.4f}")
    verdict("skyrl-f3", abs(weight - 0.5) > 1e-6)


def skyrl_f4() -> None:
    """skyrl-f4: token_mean at the default micro-batch 1 is a mean of micro-batch means?"""
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    batch = {"action_log_probs": torch.zeros(2, 4), "advantages": mask.clone(), "loss_mask": mask}
    got1, _ = ppo_step(trainer_cfg(1, use_kl_loss=False), batch)
    got2, _ = ppo_step(trainer_cfg(2, use_kl_loss=False), batch)
    leg1, _ = ppo_step(trainer_cfg(1, use_kl_loss=False, loss_reduction="token_mean_legacy"), batch)
    first = lambda g: [round(g[0, 0].item(), 4), round(g[1, 0].item(), 4)]  # noqa: E731
    print(
        f"skyrl-f4 token_mean, first token of each response: expected [-0.2, -0.2]; micro-batch 1 (default) "
        f"{first(got1)}, micro-batch 2 {first(got2)}; token_mean_legacy micro-batch 1 {first(leg1)}"
    )
    verdict(
        "skyrl-f4",
        not (close(got1, got2) and abs(got1[0, 0].item() + 0.2) < 1e-6),
        "(token_mean_legacy keeps the old weights on purpose: SkyRL PR #1637)",
    )


def skyrl_f6() -> None:
    """skyrl-f6: GSPO's logged clip_ratio depends on the micro-batch size."""
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
    verdict("skyrl-f6", abs(two[key] - one[key]) > 1e-6)


def skyrl_1() -> None:
    """skyrl-1: compute_gae_advantage_return reads the value after EOS (function level, as the trainer
    calls it through compute_advantages_and_returns with values=data['values'])."""
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])  # the critic's value at the slot after EOS (never trained)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, ret = ppo_utils.compute_advantages_and_returns(
        token_level_rewards=rewards,
        response_mask=mask,
        index=np.array([0]),
        adv_estimator="gae",
        config=AlgorithmConfig(),
        values=values,
        gamma=1.0,
        lambd=0.95,
    )
    # expected: the padded slot's value is not read: delta_1 = 1 - 0.5, delta_0 = 0 + 0.5 - 0.5
    expected = torch.tensor([[0.975, 1.0]])
    print(
        f"skyrl-1 GAE (lambd 0.95) returns of the action tokens: expected {r(expected[0])} "
        f"got {r(ret[0, :2])}"
    )
    verdict("skyrl-1", not close(ret[:, :2], expected))


def skyrl_3() -> None:
    """skyrl-3: masked_mean multiplies by the mask (NaN in a masked slot)."""
    m = torch_utils.masked_mean(torch.tensor([[1.0, 2.0, float("nan")]]), torch.tensor([[1.0, 1.0, 0.0]]))
    kl = ppo_utils.compute_approx_kl(
        torch.tensor([[0.0, float("nan")]]),
        torch.zeros(1, 2),
        loss_mask=torch.tensor([[1.0, 0.0]]),
        kl_estimator_type="k1",
    )
    print(
        f"skyrl-3 masked_mean([1, 2, nan], [1, 1, 0]): expected 1.5 got {m.item()}; "
        f"compute_approx_kl with nan in the masked slot: {kl.tolist()} (PR #1635)"
    )
    verdict("skyrl-3", not bool(torch.isfinite(m)), "(robustness; compute_approx_kl fixed by PR #1635)")


def skyrl_5() -> None:
    """skyrl-5: the batch normalisation centres with the unmasked mean (now in _normalize_advantages)."""
    cfg = trainer_cfg(advantage_batch_normalize=True)
    data = TrainingInputBatch(
        {
            "advantages": torch.tensor([[1.0, 2.0, 3.0, 9.0]]),
            "response_mask": torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
            "loss_mask": torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
        }
    )
    trainer = types.SimpleNamespace(cfg=types.SimpleNamespace(trainer=cfg))
    out = RayPPOTrainer._normalize_advantages(trainer, data, [(0, 1)])  # type: ignore[arg-type]
    got = out["advantages"] * 3  # undo step 2 (token_mean: / 3 action tokens)
    print(f"skyrl-5 advantage_batch_normalize: expected [-1.2247, 0.0, 1.2247] got {r(got[0, :3])}")
    verdict("skyrl-5", not close(got[:, :3], torch.tensor([[-1.2247449, 0.0, 1.2247449]])))


def skyrl_6() -> None:
    """skyrl-6: bf16 logits give bf16 log-probs and entropy (function level)."""
    logits = torch.arange(8, dtype=torch.bfloat16).reshape(1, 1, 8)
    lp = torch_utils.logprobs_from_logits(logits, torch.tensor([[7]]))
    ent = torch_utils.chunked_entropy_from_logits(logits)
    exact = torch.log_softmax(logits.float(), -1)[0, 0, 7].item()
    print(
        f"skyrl-6 logprobs_from_logits(bf16): dtype {lp.dtype} value {lp.item()} (float32 math {exact:.6f}); "
        f"chunked_entropy_from_logits dtype {ent.dtype}"
    )
    verdict("skyrl-6", lp.dtype == torch.bfloat16, "(latent: the workers run under CUDA autocast)")


def skyrl_6_whiten() -> None:
    w = ppo_utils.masked_whiten(torch.tensor([1.0, 2.0, 3.0, 9.0]), torch.tensor([1.0, 1.0, 1.0, 0.0]))
    print(
        f"skyrl-6-whiten masked_whiten([1, 2, 3, 9], [1, 1, 1, 0]): {r(w)} (convention: off-mask unspecified)"
    )
    verdict("skyrl-6-whiten", abs(w[3].item()) > 1e-6, "(convention)")


def skyrl_f5() -> None:
    got = {}
    for estimator in ("grpo", "rloo"):
        adv, _ = ppo_utils.compute_advantages_and_returns(
            torch.tensor([[3.0]]), torch.ones(1, 1), np.array([0]), estimator, AlgorithmConfig()
        )
        got[estimator] = round(adv.item(), 6)
    print(f"skyrl-f5 a group of one: {got} (convention, declared per method)")
    verdict("skyrl-f5", got["grpo"] != got["rloo"], "(convention)")


def main() -> None:
    for check in (
        skyrl_1,
        skyrl_2,
        skyrl_3,
        skyrl_4,
        skyrl_5,
        skyrl_6,
        skyrl_6_whiten,
        skyrl_f3,
        skyrl_f4,
        skyrl_f5,
        skyrl_f6,
    ):
        check()
    print("summary:", VERDICTS)
    bugs = [k for k, v in VERDICTS.items() if v == "HOLDS" and k not in ("skyrl-6-whiten", "skyrl-f5")]
    sys.exit(1 if bugs else 0)


if __name__ == "__main__":
    main()
