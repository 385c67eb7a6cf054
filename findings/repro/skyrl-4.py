"""skyrl-4 / skyrl-f2 (non-default: ``generator.apply_overlong_filtering: true``): rows without action
tokens are counted, so every kept row's gradient shrinks by the share of filtered rows.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-4.py``
(standalone: ``pip install skyrl-train==0.3.1 skyrl-gym==0.2.0 torch``; imports only torch, omegaconf,
skyrl_train and what it imports).

skyrl-train 0.3.1's generator zeroes the whole loss mask of a response that does not end in EOS when
``apply_overlong_filtering`` is true (``generators/utils.py:216``, called by
``skyrl_gym_generator.py:639``). The script filters a mini-batch of two responses (3 tokens each, the
second cut at the length limit) with that function, then runs skyrl's own
``PolicyWorkerBase.ppo_train`` -> ``forward_backward`` (and ``CriticWorkerBase.ppo_train`` for the
critic) on it: ``policy_mini_batch_size: 1`` x ``n_samples_per_prompt: 2`` = one mini-batch of 2, every
other key at its ``ppo_base_config.yaml`` default unless named. On-policy (ratio 1), so the policy
gradient of a kept token is -A_t times its reduction weight.

Expected (the filtered row has no tokens and is left out, as verl and OpenRLHF do): the kept row alone
-> d loss / d logp_t = -A_t / 3 for ``sequence_mean`` and for ``token_mean`` (3 kept tokens); critic
d loss / d v_t = (v_t - R_t) / 3 (0.5 x the kept row's mean squared error); logged ``policy_kl`` = the kept
row's mean k3. Got: half of each. ``reduce_loss``'s ``sequence_mean`` is
``masked_mean(loss, mask, dim=-1).mean()`` over every row (ppo_utils.py:892; ``ppo_critic_loss`` the same at
:195, the worker's KL at worker.py:686); with the default ``micro_train_batch_size_per_gpu: 1`` the
worker also divides each micro-batch by ``accumulation_steps`` (worker.py:692), which counts the filtered
row's micro-batch, so the default ``token_mean`` halves it too. Triggering setting:
``apply_overlong_filtering: true`` with ``loss_reduction: sequence_mean`` (GSPO's); also run: the default
``token_mean`` with micro-batches of 1 (halved) and of 2 (correct), GSPO, CISPO, the KL metric and the
critic. With ``apply_overlong_filtering: false`` (default) no row is empty and nothing is counted.
Exit 1 when the kept row's gradient is halved at the triggering setting, 0 when it is not.
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
# inference_engines/inference_engine_client_http_endpoint.py) or ``generators/utils.py`` (skyrl_gym) imports
# them at top level, but the code driven here calls none of them except tqdm's iteration (a pass-through
# progress bar below). An environment with only skyrl-train's core (``pip install --no-deps skyrl-train``)
# lacks them; a finder at the END of sys.meta_path stands in for a missing one only: an installed module
# always wins.

STUBBED = ("tqdm", "transformers", "datasets", "fastapi", "uvicorn", "pydantic", "skyrl_gym")


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

from skyrl_train.generators.utils import apply_overlong_filtering  # noqa: E402
from skyrl_train.training_batch import TrainingInputBatch  # noqa: E402
from skyrl_train.utils.ppo_utils import PolicyLossRegistry, ppo_critic_loss  # noqa: E402
from skyrl_train.workers.worker import CriticWorkerBase, PolicyWorkerBase  # noqa: E402

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


def critic_ppo_train(cfg: Any, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The same for ``CriticWorkerBase.ppo_train`` (its ``forward_backward`` calls ``ppo_critic_loss``):
    the stand-in critic returns one trainable value per response token; returns d loss / d values at
    each optimizer step."""
    values = torch.nn.Parameter(batch["values"].clone())
    n, a = values.shape

    def model(sequences: torch.Tensor, num_actions: int, **kwargs: Any) -> Any:
        return values[sequences[:, 0]] * 1.0, {}

    model.train = model.eval = lambda: None  # type: ignore[attr-defined]
    grads: list[torch.Tensor] = []

    def optimizer_step(optimizer: Any, model: Any, scheduler: Any, name: str) -> None:
        grads.append(values.grad.clone() if values.grad is not None else torch.zeros_like(values))
        values.grad = None
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
        critic_loss_fn=ppo_critic_loss,  # as CriticWorkerBase sets it (worker.py:889)
        critic_mini_batch_size_per_gpu=cfg.trainer.critic_mini_batch_size
        * cfg.generator.n_samples_per_prompt,
    )
    worker.forward_backward = lambda exp, steps: CriticWorkerBase.forward_backward(worker, exp, steps)
    worker.optim_step = lambda: CriticWorkerBase.optim_step(worker)
    sequences = torch.cat([torch.arange(n)[:, None], torch.zeros(n, a + 1, dtype=torch.long)], dim=1)
    data = TrainingInputBatch(
        {
            "sequences": sequences,
            "attention_mask": torch.ones_like(sequences),
            "action_log_probs": torch.zeros(n, a),
            "base_action_log_probs": torch.zeros(n, a),
            "values": batch["values"],
            "returns": batch["returns"],
            "advantages": torch.zeros(n, a),
            "loss_mask": batch["loss_mask"],
            "response_mask": torch.ones(n, a),
        }
    )
    data.metadata = {"global_step": 1, "response_length": a}
    CriticWorkerBase.ppo_train(worker, data)
    return grads


def r4(t: torch.Tensor) -> list[float]:
    return [round(x, 4) for x in t.tolist()]


def main() -> None:
    eos = 2
    responses = [[5, 6, eos], [7, 8, 9]]  # the second one was cut at the length limit
    loss_masks = apply_overlong_filtering([[1, 1, 1], [1, 1, 1]], responses, eos)
    mask = torch.tensor(loss_masks, dtype=torch.float32)
    print("loss masks after apply_overlong_filtering:", loss_masks)
    advantages = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    logp = torch.zeros(2, 3)
    ref = torch.tensor([[-0.5, 0.3, -0.2], [0.0, 0.0, 0.0]])
    batch = {
        "action_log_probs": logp,
        "base_action_log_probs": ref,
        "advantages": advantages,
        "loss_mask": mask,
    }
    size = {
        "trainer.policy_mini_batch_size": 1,
        "trainer.critic_mini_batch_size": 1,
        "generator.n_samples_per_prompt": 2,
    }
    expected = -advantages[0] / 3
    print(f"expected d loss / d logp of the kept row (every case below): {r4(expected)}")
    wrong_at_trigger = False
    for name, overrides in [
        ("sequence_mean, micro-batch 1 (triggering)", {"trainer.algorithm.loss_reduction": "sequence_mean"}),
        (
            "sequence_mean, micro-batch 2",
            {
                "trainer.algorithm.loss_reduction": "sequence_mean",
                "trainer.micro_train_batch_size_per_gpu": 2,
            },
        ),
        ("token_mean (default), micro-batch 1 (default)", {}),
        ("token_mean (default), micro-batch 2", {"trainer.micro_train_batch_size_per_gpu": 2}),
        (
            "gspo (sequence_mean), micro-batch 2",
            {
                "trainer.algorithm.policy_loss_type": "gspo",
                "trainer.algorithm.loss_reduction": "sequence_mean",
                "trainer.micro_train_batch_size_per_gpu": 2,
            },
        ),
        ("cispo (token_mean), micro-batch 1", {"trainer.algorithm.policy_loss_type": "cispo"}),
    ]:
        (grad,), status = ppo_train(load_config(**size, **overrides), batch)
        print(f"  {name}: got {r4(grad[0])}")
        if not overrides:
            default_status = status
        if "triggering" in name:
            wrong_at_trigger = not torch.allclose(grad[0], expected, atol=1e-6)
    k3 = torch.exp(ref[0] - logp[0]) - (ref[0] - logp[0]) - 1
    print(
        f"policy_kl logged (defaults): got {default_status['policy_kl']:.5f} expected {k3.mean().item():.5f}"
    )
    values = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]])
    returns = torch.zeros(2, 3)
    cbatch = {"values": values, "returns": returns, "loss_mask": mask}
    (cgrad,) = critic_ppo_train(load_config(**size, **{"trainer.micro_train_batch_size_per_gpu": 2}), cbatch)
    print(
        f"critic d loss / d v of the kept row (micro-batch 2): got {r4(cgrad[0])} "
        f"expected {r4((values[0] - returns[0]) / 3)}"
    )
    print("kept row's gradient halved (skyrl-4 reproduces)" if wrong_at_trigger else "not halved (fixed)")
    sys.exit(1 if wrong_at_trigger else 0)


if __name__ == "__main__":
    main()
