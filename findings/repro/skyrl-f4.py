"""skyrl-f4 (trainer-path, skyrl-train 0.3.1 defaults): the policy loss is a mean of micro-batch means,
so a token's weight depends on the length of the responses it shares a micro-batch with.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-f4.py``
(standalone: ``pip install skyrl-train==0.3.1 torch``; imports only torch, omegaconf and skyrl_train).

Drives skyrl-train 0.3.1's own ``PolicyWorkerBase.ppo_train`` (BatchIterator over micro-batches of
``micro_train_batch_size_per_gpu``, ``forward_backward`` per micro-batch, one optimizer step per
mini-batch) at the defaults of ``ppo_base_config.yaml``: ``loss_reduction: token_mean``,
``micro_train_batch_size_per_gpu: 1``, ``policy_loss_type: regular``. One mini-batch of two responses of
4 and 1 tokens (``policy_mini_batch_size: 1`` x ``n_samples_per_prompt: 2``), on-policy, A = 1 on every
token. ``reduce_loss``'s ``token_mean`` divides by *this micro-batch's* token count and the worker divides
each micro-batch's loss by ``accumulation_steps`` (worker.py:692).

Expected (``token_mean``: the mean over the mini-batch's 5 tokens): d loss / d logp = -1/5 = -0.2 on every
token. Got at the defaults (micro-batches of 1 response): -1/4/2 = -0.125 and -1/1/2 = -0.5, i.e. each
response weighs the same whatever its length (a per-sequence mean). Also run: micro-batches of 2 (the
whole mini-batch in one): -0.2, correct. Exit 1 when the default split changes the gradient, 0 when not
(SkyRL PRs #925/#1296 fold the reduction into the advantages; skyrl 0.4.0 measures -0.2 both ways).
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


def r4(t: torch.Tensor) -> list[float]:
    return [round(x, 4) for x in t.tolist()]


def main() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])  # responses of 4 tokens and 1 token
    batch = {"action_log_probs": torch.zeros(2, 4), "advantages": mask.clone(), "loss_mask": mask}
    size = {"trainer.policy_mini_batch_size": 1, "generator.n_samples_per_prompt": 2}
    cfg = load_config(**size)
    print(
        f"defaults: loss_reduction={cfg.trainer.algorithm.loss_reduction}, "
        f"micro_train_batch_size_per_gpu={cfg.trainer.micro_train_batch_size_per_gpu}"
    )
    expected = -mask / mask.sum()
    (got,), _ = ppo_train(cfg, batch)
    (one,), _ = ppo_train(load_config(**size, **{"trainer.micro_train_batch_size_per_gpu": 2}), batch)
    print(f"d loss / d logp of each response's first token: expected {r4(expected[:, 0])}")
    print(f"  defaults (2 micro-batches of 1 response): got {r4(got[:, 0])}")
    print(f"  micro_train_batch_size_per_gpu=2 (1 micro-batch): got {r4(one[:, 0])}")
    wrong = not torch.allclose(got, expected, atol=1e-6)
    print("the split changes the gradient (skyrl-f4 reproduces)" if wrong else "split-invariant (fixed)")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
