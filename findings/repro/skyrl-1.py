"""skyrl-1 (non-default: ``trainer.algorithm.advantage_estimator: gae`` with ``lambd`` < 1): the value of
the state after EOS (and, without sample packing, the critic's output on the padding) is bootstrapped into
the last action tokens.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-1.py``
(standalone: ``pip install skyrl-train==0.3.1 torch``; imports only torch, numpy, omegaconf and skyrl_train).

Drives skyrl-train 0.3.1's own ``RayPPOTrainer.compute_advantages_and_returns`` (trainer.py:721, with a
stand-in ``self`` holding the config) on a right-padded batch of two responses with
``advantage_estimator: gae``, ``gamma: 1.0`` (default) and ``lambd: 0.95`` (default 1.0). The trainer
passes the critic's values as produced
(trainer.py:777 ``values=data["values"]``) and ``compute_gae_advantage_return`` (ppo_utils.py:999) reads
``values[:, t + 1]`` at every column, ignoring ``response_mask``. The critic wrapper
(model_wrapper.py:502-513) returns, for action slot j, the value head's output at sequence position
P + j - 1; for a response of L < A tokens, slot L reads the EOS token's own position (attention mask 1),
the state after the episode ended. With ``use_sample_packing: true`` (default) ``pad_input`` zeroes the
slots read from padded positions (j > L) but not slot L; with ``use_sample_packing: false`` every pad slot
holds the head's output on a pad token. The value head's per-position output is a stand-in below
(0.5 on real tokens, 5.0 on pad tokens): skyrl-train 0.3.1's critic class does not load under the
environment's transformers 5.24 (``AttributeError: 'CriticModel' object has no attribute
'all_tied_weights_keys'``), so the two layouts are built by hand from the wrapper's slicing.

Expected (the episode ends at EOS: no value after it): GAE by its formula, delta_t = r_t + gamma V_{t+1}
m_{t+1} - V_t, A_t = delta_t + gamma lambda m_{t+1} A_{t+1}, return = A + V (computed inline): the short
row's returns [0.975, 1.0]. Got [0.9987, 1.025] with sample packing and [1.2244, 1.2625] without. At the
default ``lambd: 1.0`` (and ``gamma: 1.0``) the bootstrapped values telescope away (return_t = the sum of
the rewards still to come, A_t = that minus V_t): the script also runs the defaults and gets [1.0, 1.0],
as expected. The default estimator ``grpo`` reads no values. Exit 1 when a bootstrapped value appears at
``lambd: 0.95`` with the default sample packing.
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
# skyrl-train 0.3.1 declares these, and ``skyrl_train.trainer``'s import chain (tqdm, transformers:
# trainer.py; datasets: dataset/dataset.py; fastapi, uvicorn, pydantic:
# inference_engines/inference_engine_client_http_endpoint.py; skyrl_gym: generators; torchdata:
# utils/trainer_utils.py) imports them at top level, but the code driven here calls none of them except
# tqdm's iteration (a pass-through progress bar below). An environment with only skyrl-train's core (``pip
# install --no-deps skyrl-train``) lacks them; a finder at the END of sys.meta_path stands in for a missing
# one only: an installed module always wins.

STUBBED = ("tqdm", "transformers", "datasets", "fastapi", "uvicorn", "pydantic", "skyrl_gym", "torchdata")


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

from skyrl_train.trainer import RayPPOTrainer  # noqa: E402
from skyrl_train.training_batch import TrainingInputBatch  # noqa: E402

CONFIG = pathlib.Path(skyrl_train.__file__).parent / "config" / "ppo_base_config.yaml"


def advantages_and_returns(values: torch.Tensor, lambd: float) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = OmegaConf.load(CONFIG)
    cfg.trainer.algorithm.advantage_estimator = "gae"
    cfg.trainer.algorithm.lambd = lambd
    trainer = types.SimpleNamespace(cfg=cfg, all_metrics={})  # what the method reads of ``self``
    data = TrainingInputBatch(
        {
            "rewards": REWARDS.clone(),
            "response_mask": RESPONSE_MASK.clone(),
            "loss_mask": RESPONSE_MASK.clone(),
            "values": values,
        }
    )
    data.metadata = {"uids": ["p0", "p0"], "avg_response_length": 3.0}
    out = RayPPOTrainer.compute_advantages_and_returns(trainer, data)
    return out["advantages"], out["returns"]


# prompt of P = 2 tokens, A = 4 response slots; row 0 uses all 4, row 1 ends with EOS after 2 tokens
P, A = 2, 4
attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
RESPONSE_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
REWARDS = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])  # the score on the last action token


def gae_returns(values: torch.Tensor, lambd: float, gamma: float = 1.0) -> torch.Tensor:
    """GAE by its formula, the episode ending at the last action token (no value after it)."""
    m = RESPONSE_MASK
    adv = torch.zeros_like(values)
    for t in reversed(range(A)):
        nxt_v = values[:, t + 1] * m[:, t + 1] if t < A - 1 else torch.zeros(len(values))
        nxt_a = adv[:, t + 1] * m[:, t + 1] if t < A - 1 else torch.zeros(len(values))
        adv[:, t] = REWARDS[:, t] + gamma * nxt_v - values[:, t] + gamma * lambd * nxt_a
    return (adv + values) * m


def main() -> None:
    head = torch.where(attention_mask.bool(), 0.5, 5.0)  # stand-in value-head output per sequence position
    unpacked = head[:, :-1][:, -A:]  # model_wrapper.py:509,514: values[:, :-1], then the last A
    packed = (head * attention_mask)[:, :-1][:, -A:]  # pad_input's zeros on padded positions (:502-506)
    print("critic values, sample packing:   ", packed.tolist())
    print("critic values, no sample packing:", unpacked.tolist())
    r4 = lambda t: [round(x, 4) for x in t.tolist()]  # noqa: E731
    for lambd, name in ((0.95, "lambd=0.95 (triggering)"), (1.0, "lambd=1.0 (default)")):
        expected = gae_returns(packed, lambd)[1, :2]
        _, with_packing = advantages_and_returns(packed, lambd)
        _, without_packing = advantages_and_returns(unpacked, lambd)
        print(f"{name}: returns of the short row's action tokens: expected {r4(expected)}")
        print(f"  use_sample_packing=true (default): got {r4(with_packing[1, :2])}")
        print(f"  use_sample_packing=false:          got {r4(without_packing[1, :2])}")
        if lambd != 1.0:
            wrong = not torch.allclose(with_packing[1, :2], expected, atol=1e-6)
    print(
        "a value after EOS is bootstrapped (skyrl-1 reproduces)"
        if wrong
        else "no bootstrap after EOS (fixed)"
    )
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
