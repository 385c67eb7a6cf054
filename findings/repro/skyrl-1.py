"""skyrl-1 (non-default: ``trainer.algorithm.advantage_estimator: gae`` with ``lambd`` < 1): the value of
the state after EOS (and, without micro-batch padding removal, the critic's output on the padding) is
bootstrapped into the last action tokens.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-1.py``
(standalone: ``pip install --no-deps --ignore-requires-python skyrl==0.4.0`` plus the top-level imports
``tools/thirdparty_envs.py``'s recipe ``skyrl`` lists; imports only torch, numpy, typing_extensions and
skyrl).

Drives skyrl 0.4.0's own ``RayPPOTrainer.compute_advantages_and_returns`` (skyrl/train/trainer.py:1151,
with a stand-in ``self`` holding skyrl's own ``TrainerConfig`` and ``GeneratorConfig`` dataclasses at
their defaults) on a right-padded batch of two responses with ``advantage_estimator: gae``, ``gamma:
1.0`` (default) and ``lambd: 0.95`` (default 1.0). The trainer passes the critic's values as produced
(trainer.py:1215 ``values=data["values"]``) and ``compute_gae_advantage_return``
(skyrl/backends/skyrl_train/utils/ppo_utils.py:1312) reads ``values[:, t + 1]`` at every column,
ignoring ``response_mask``. The critic wrapper (workers/model_wrapper.py:580-586: ``values[:, :-1]``,
then the last ``num_actions``) gives action slot j the value head's output at sequence position
P + j - 1; for a response of L < A tokens, slot L reads the EOS token's own position (attention mask 1),
the state after the episode ended. With ``remove_microbatch_padding: true`` (the default; 0.3.1's
``use_sample_packing``) ``pad_input`` zeroes the slots read from padded positions (j > L) but not slot
L; with it false every pad slot holds the head's output on a pad token. The value head's per-position
output is a stand-in (0.5 on real tokens, 5.0 on pad tokens) laid out by the wrapper's slicing: the
wrapper module imports ``flash_attn.bert_padding`` at top level (model_wrapper.py:13), which needs CUDA.

Expected (the episode ends at EOS: no value after it): GAE by its formula, delta_t = r_t + gamma V_{t+1}
m_{t+1} - V_t, A_t = delta_t + gamma lambda m_{t+1} A_{t+1}, return = A + V (computed inline): the short
row's returns [0.975, 1.0]. skyrl-train 0.3.1 gave [0.9987, 1.025] with padding removal and [1.2244,
1.2625] without; 0.4.0 the same (printed). At the default ``lambd: 1.0`` the bootstrapped values
telescope away: the script runs the defaults too and gets [1.0, 1.0], as expected. The default estimator
``grpo`` reads no values. Exit 1 when a bootstrapped value appears at ``lambd: 0.95`` with the default
padding removal.

skyrl 0.4.0 declares Python >=3.12. On 3.11 ``skyrl/backends/__init__.py`` fails in pydantic ("Please
use `typing_extensions.TypedDict` instead of `typing.TypedDict` on Python < 3.12",
``skyrl/tinker/types.py``); the script imports that module with ``typing.TypedDict`` bound to
``typing_extensions.TypedDict`` (what Python 3.12's is) and restores it. No skyrl code is changed.
"""

from __future__ import annotations

import sys
import types
import typing

import torch
import typing_extensions

_td = typing.TypedDict
typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
try:
    import skyrl.tinker.types  # noqa: F401  (see the docstring)
finally:
    typing.TypedDict = _td  # type: ignore[misc]

from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch  # noqa: E402
from skyrl.train.config import GeneratorConfig, TrainerConfig  # noqa: E402
from skyrl.train.trainer import RayPPOTrainer  # noqa: E402

# prompt of P = 2 tokens, A = 4 response slots; row 0 uses all 4, row 1 ends with EOS after 2 tokens
P, A = 2, 4
ATTENTION_MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
RESPONSE_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
REWARDS = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])  # the score on the last action token


def advantages_and_returns(values: torch.Tensor, lambd: float) -> tuple[torch.Tensor, torch.Tensor]:
    trainer_cfg = TrainerConfig()
    print_defaults(trainer_cfg)
    trainer_cfg.algorithm.advantage_estimator = "gae"
    trainer_cfg.algorithm.lambd = lambd
    cfg = types.SimpleNamespace(trainer=trainer_cfg, generator=GeneratorConfig())
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
    out = RayPPOTrainer.compute_advantages_and_returns(trainer, data)  # type: ignore[arg-type]
    return out["advantages"], out["returns"]


_PRINTED: list[bool] = []


def print_defaults(cfg: TrainerConfig) -> None:
    if not _PRINTED:
        a = cfg.algorithm
        print(
            f"defaults: advantage_estimator={a.advantage_estimator} gamma={a.gamma} lambd={a.lambd} "
            f"remove_microbatch_padding={cfg.remove_microbatch_padding}"
        )
        _PRINTED.append(True)


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
    head = torch.where(ATTENTION_MASK.bool(), 0.5, 5.0)  # stand-in value-head output per sequence position
    unpadded = head[:, :-1][:, -A:]  # model_wrapper.py:580,586: values[:, :-1], then the last A
    padded = (head * ATTENTION_MASK)[:, :-1][:, -A:]  # pad_input's zeros on padded positions (:578)
    print("critic values, remove_microbatch_padding=true: ", padded.tolist())
    print("critic values, remove_microbatch_padding=false:", unpadded.tolist())
    r4 = lambda t: [round(x, 4) for x in t.tolist()]  # noqa: E731
    wrong = False
    for lambd, name in ((0.95, "lambd=0.95 (triggering)"), (1.0, "lambd=1.0 (default)")):
        expected = gae_returns(padded, lambd)[1, :2]
        _, with_removal = advantages_and_returns(padded, lambd)
        _, without_removal = advantages_and_returns(unpadded, lambd)
        print(f"{name}: returns of the short row's action tokens: expected {r4(expected)}")
        print(f"  remove_microbatch_padding=true (default): got {r4(with_removal[1, :2])}")
        print(f"  remove_microbatch_padding=false:          got {r4(without_removal[1, :2])}")
        if lambd != 1.0:
            wrong = not torch.allclose(with_removal[1, :2], expected, atol=1e-6)
    print(
        "a value after EOS is bootstrapped (skyrl-1 reproduces)"
        if wrong
        else "no bootstrap after EOS (fixed)"
    )
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
