"""skyrl-f3 (non-default: ``trainer.algorithm.policy_loss_type: cispo`` with the shipped ``cispo`` block of
``ppo_base_config.yaml``: ``cispo_eps_clip_low: 0``, ``cispo_eps_clip_high: 5``).

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-f3.py``
(standalone: ``pip install skyrl-train==0.3.1 torch``; imports only torch, omegaconf and skyrl_train).

Drives skyrl-train 0.3.1's own ``PolicyWorkerBase.ppo_train`` -> ``forward_backward`` -> the registered
``cispo`` loss (``compute_policy_loss_cispo``, ppo_utils.py:744: ``clamp(ratio, 1 - low, 1 + high)``) with
every other key at its default. With the shipped offsets the clamp is [1, 6]: a ratio below 1 is raised
to 1. One token, ratio 0.5 (log-prob log 0.5 against old log-prob 0), A = 1, token_mean; the KL term has
no gradient in 0.3.1 (skyrl-2), so the gradient is minus the CISPO weight.

Expected (CISPO as ScaleRL writes it, clip(ratio, 0, 5), the bounds SkyRL PR #1928 set in 0.4.0): weight 0.5.
Got: 1.0. Also run: the default ``policy_loss_type: regular`` (PPO clip, [0.8, 1.2]), where the ratio 0.5
sits on the unclipped branch for A > 0 and the weight is 0.5. Exit 1 when the CISPO weight is 1.0.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import pathlib
import sys
import types
from typing import Any

import skyrl_train
import torch
from omegaconf import OmegaConf

# ---- stand-ins (inlined) for imports an environment may lack ----
# skyrl-train 0.3.1 declares these, and ``skyrl_train.workers.worker``'s import chain (tqdm: worker.py;
# transformers: distributed/fsdp_strategy.py; datasets: dataset/dataset.py; fastapi, uvicorn, pydantic:
# inference_engines/inference_engine_client_http_endpoint.py) imports them at top level, but the code driven
# here calls none of them except tqdm's iteration (a pass-through progress bar below). An environment with
# only skyrl-train's core (``pip install --no-deps skyrl-train``) lacks them; a finder at the END of
# sys.meta_path stands in for a missing one only: an installed module always wins.

STUBBED = ("tqdm", "transformers", "datasets", "fastapi", "uvicorn", "pydantic")


class _Bar:  # tqdm(iterable, desc=..., disable=...): iterate, accept set_postfix
    def __init__(self, iterable: Any = (), *args: Any, **kwargs: Any) -> None:
        self.iterable = iterable

    def __iter__(self) -> Any:
        return iter(self.iterable)

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Missing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__getattr__ = lambda attr: _Bar if attr == "tqdm" else type(attr, (), {})  # type: ignore[method-assign]
        return module

    def exec_module(self, module: Any) -> None:
        return None


sys.meta_path.append(_Missing())

from skyrl_train.training_batch import TrainingInputBatch  # noqa: E402
from skyrl_train.utils.ppo_utils import PolicyLossRegistry  # noqa: E402
from skyrl_train.workers.worker import PolicyWorkerBase  # noqa: E402

CONFIG = pathlib.Path(skyrl_train.__file__).parent / "config" / "ppo_base_config.yaml"


def load_config(**overrides: Any) -> Any:
    """ppo_base_config.yaml with ``overrides`` (dotted keys), plus what skyrl's ``validate_cfg`` adds
    before the workers start (``utils/utils.py:278``: ``max_seq_len``)."""
    cfg = OmegaConf.load(CONFIG)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    cfg.trainer.algorithm.max_seq_len = (
        cfg.generator.max_input_length + cfg.generator.sampling_params.max_generate_length
    )
    return cfg


def ppo_train(cfg: Any, batch: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Run skyrl-train's own ``PolicyWorkerBase.ppo_train`` (its BatchIterator, ``forward_backward`` per
    micro-batch, ``optim_step`` every ``accumulation_steps``) on one mini-batch. Stand-ins for what a CPU
    process without Ray/FSDP lacks: the "model" returns one trainable log-prob per response token (so
    the gradient is d loss / d logp), the strategy's ``backward`` is ``loss.backward()`` and its
    ``optimizer_step`` records the accumulated gradient, DP size 1. Returns the gradient at each
    optimizer step and the worker's logged status."""
    # the policy's log-probs now: the old ``action_log_probs`` (on-policy) unless ``policy_log_probs``
    logp = torch.nn.Parameter(batch.get("policy_log_probs", batch["action_log_probs"]).clone())
    n, a = logp.shape

    def model(sequences: torch.Tensor, num_actions: int, **kwargs: Any) -> Any:
        rows = sequences[:, 0]  # the stand-in reads which responses this micro-batch holds
        return logp[rows] * 1.0, {"entropy": torch.zeros(sequences.shape)}

    model.train = model.eval = lambda: None  # type: ignore[attr-defined]
    grads: list[torch.Tensor] = []

    def optimizer_step(optimizer: Any, model: Any, scheduler: Any, name: str) -> None:
        grads.append(logp.grad.clone() if logp.grad is not None else torch.zeros_like(logp))
        logp.grad = None
        return None

    worker = types.SimpleNamespace(
        cfg=cfg,
        model=model,
        optimizer=None,
        scheduler=types.SimpleNamespace(get_last_lr=lambda: [0.0]),
        strategy=types.SimpleNamespace(
            backward=lambda loss, model, optimizer: loss.backward(),
            optimizer_step=optimizer_step,
            is_rank_0=lambda: True,
            all_reduce=lambda status: status,
        ),
        policy_loss_fn=PolicyLossRegistry.get(cfg.trainer.algorithm.policy_loss_type),
        record_memory=False,
        # as PolicyWorkerBase's init computes it (worker.py:621), DP size 1
        policy_mini_batch_size_per_gpu=cfg.trainer.policy_mini_batch_size
        * cfg.generator.n_samples_per_prompt,
    )
    worker.forward_backward = lambda exp, steps: PolicyWorkerBase.forward_backward(worker, exp, steps)
    worker.optim_step = lambda: PolicyWorkerBase.optim_step(worker)
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]  # CPU stand-in
    torch.distributed.barrier = lambda *args, **kwargs: None  # type: ignore[assignment]  # one process
    sequences = torch.cat([torch.arange(n)[:, None], torch.zeros(n, a + 1, dtype=torch.long)], dim=1)
    data = TrainingInputBatch(
        {
            "sequences": sequences,
            "attention_mask": torch.ones_like(sequences),
            "action_log_probs": batch["action_log_probs"],
            "base_action_log_probs": batch.get("base_action_log_probs", batch["action_log_probs"]),
            "values": None,
            "returns": None,
            "advantages": batch["advantages"],
            "loss_mask": batch["loss_mask"],
            "response_mask": batch.get("response_mask", torch.ones(n, a)),
        }
    )
    data.metadata = {"global_step": 1, "response_length": a}
    out = PolicyWorkerBase.ppo_train(worker, data)
    return grads, out.metadata["train_status"]


def main() -> None:
    batch = {
        "policy_log_probs": torch.log(torch.tensor([[0.5]])),  # the policy's log-prob now: ratio 0.5
        "action_log_probs": torch.zeros(1, 1),  # the old (rollout-time) log-prob
        "advantages": torch.ones(1, 1),
        "loss_mask": torch.ones(1, 1),
    }
    size = {"trainer.policy_mini_batch_size": 1, "generator.n_samples_per_prompt": 1}
    cispo = load_config(**size, **{"trainer.algorithm.policy_loss_type": "cispo"})

    def weight(cfg: Any) -> float:
        (grad,), _ = ppo_train(cfg, batch)
        return -grad.item()

    low, high = (
        cispo.trainer.algorithm.cispo.cispo_eps_clip_low,
        cispo.trainer.algorithm.cispo.cispo_eps_clip_high,
    )
    got = weight(cispo)
    print(
        f"cispo defaults: bounds [{1 - low}, {1 + high}]; IS weight of ratio 0.5: expected 0.5 got {got:.4f}"
    )
    regular = weight(load_config(**size))
    print(f"regular (default policy loss): weight of ratio 0.5: expected 0.5 got {regular:.4f}")
    wrong = abs(got - 0.5) > 1e-6
    print("ratio raised to 1 (skyrl-f3 reproduces)" if wrong else "weight 0.5 (fixed)")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
