"""skyrl-2 (trainer-path, default settings): the KL loss adds no gradient.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-2.py``.

Drives skyrl-train 0.3.1's own ``PolicyWorkerBase.forward_backward`` (the worker's micro-batch
forward and backward) with the defaults of its ``ppo_base_config.yaml`` (``use_kl_loss: true``,
``kl_loss_coef: 0.001``, ``kl_estimator_type: k3``). Ray, the distributed strategy and the model are
replaced by stand-ins: the "model" returns the log-probs of one trainable logit vector, the strategy's
``backward`` is ``loss.backward()``. The worker computes the KL term with ``compute_approx_kl``, which
is decorated ``@torch.no_grad()``, so the term is a constant: the gradient with the default
``kl_loss_coef`` equals the gradient with ``kl_loss_coef = 0``; the expected gradient adds
``kl_loss_coef * d KL_k3 / d logp``.
"""

from __future__ import annotations

import pathlib
import sys
import types
from typing import Any

import skyrl_train
import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _skyrl_stubs

_skyrl_stubs.install()  # the worker module imports tqdm, transformers, ... at top level

from skyrl_train.utils.ppo_utils import PolicyLossRegistry  # noqa: E402
from skyrl_train.workers.worker import PolicyWorkerBase  # noqa: E402

CONFIG = pathlib.Path(skyrl_train.__file__).parent / "config" / "ppo_base_config.yaml"


def gradient(kl_loss_coef: float | None) -> tuple[torch.Tensor, dict[str, Any]]:
    cfg = OmegaConf.load(CONFIG)
    cfg.trainer.algorithm.max_seq_len = None  # filled in by skyrl's config validation; unused by token_mean
    if kl_loss_coef is not None:
        cfg.trainer.algorithm.kl_loss_coef = kl_loss_coef
    logp = torch.nn.Parameter(torch.tensor([[-0.5, -1.0, -2.0]]))  # the policy's action log-probs

    def model(sequences: Any, num_actions: int, **kwargs: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        return logp * 1.0, {"entropy": torch.zeros(1, sequences.shape[1])}

    model.train = lambda: None  # type: ignore[attr-defined]
    experience = types.SimpleNamespace(
        sequences=torch.zeros(1, 5, dtype=torch.long),
        action_log_probs=logp.detach().clone(),  # on-policy: ratio 1
        base_action_log_probs=torch.tensor([[-1.0, -0.7, -2.5]]),  # the reference
        advantages=torch.zeros(1, 3),  # no policy-gradient signal: only the KL term can move logp
        num_actions=3,
        attention_mask=torch.ones(1, 5, dtype=torch.long),
        loss_mask=torch.ones(1, 3),
        rollout_logprobs=None,
        to_device=lambda device: None,
    )
    worker = types.SimpleNamespace(
        cfg=cfg,
        model=model,
        policy_loss_fn=PolicyLossRegistry.get(cfg.trainer.algorithm.policy_loss_type),
        strategy=types.SimpleNamespace(backward=lambda loss, model, optimizer: loss.backward()),
        optimizer=None,
    )
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]  # CPU stand-in
    status = PolicyWorkerBase.forward_backward(worker, experience, accumulation_steps=1)
    assert logp.grad is not None
    return logp.grad.clone(), status


def main() -> None:
    cfg = OmegaConf.load(CONFIG).trainer.algorithm
    print(
        f"defaults: use_kl_loss={cfg.use_kl_loss}, kl_loss_coef={cfg.kl_loss_coef}, "
        f"kl_estimator_type={cfg.kl_estimator_type}"
    )
    got, status = gradient(None)
    without, _ = gradient(0.0)
    logp = torch.tensor([[-0.5, -1.0, -2.0]])
    ref = torch.tensor([[-1.0, -0.7, -2.5]])
    # k3 = exp(ref - logp) - (ref - logp) - 1; d k3 / d logp = 1 - exp(ref - logp); token-mean over 3
    expected = cfg.kl_loss_coef * (1 - torch.exp(ref - logp)) / 3
    print(f"policy_kl logged by the worker: {status['policy_kl']:.6f}")
    print(f"d loss / d logp with the default kl_loss_coef: {got.tolist()}")
    print(f"d loss / d logp with kl_loss_coef = 0:         {without.tolist()}")
    print(f"expected with the default kl_loss_coef:        {expected.tolist()}")


if __name__ == "__main__":
    main()
