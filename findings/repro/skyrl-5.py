"""skyrl-5 (non-default: ``trainer.algorithm.advantage_batch_normalize: true``): the batch normalisation
centres the advantages with a mean over every slot, padding included.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-5.py``
(standalone: ``pip install --no-deps --ignore-requires-python skyrl==0.4.0`` plus the top-level imports
``tools/thirdparty_envs.py``'s recipe ``skyrl`` lists; imports only torch, typing_extensions and skyrl).

Drives skyrl 0.4.0's own ``RayPPOTrainer.compute_advantages_and_returns`` (skyrl/train/trainer.py:1151,
stand-in ``self`` holding skyrl's ``TrainerConfig`` / ``GeneratorConfig`` dataclasses; default estimator
``grpo``, ``grpo_norm_by_std: true``), then ``RayPPOTrainer._normalize_advantages`` (trainer.py:1497),
which the trainer calls on every training batch. Its step 1, when ``advantage_batch_normalize`` is true,
is 0.3.1's ``normalize_advantages_dict`` moved verbatim: ``mean = advantages.mean()`` over every slot
(trainer.py:1509) but a variance over the response tokens only; its step 2 folds the loss reduction into
the advantages (``apply_loss_reduction_to_advantages_minibatch``; the default ``token_mean`` divides by
the mini-batch's token count, here the whole batch as one mini-batch: 10 tokens). A right-padded batch of
two prompts x two responses of 4, 2, 3 and 1 tokens (the GRPO advantages are 0 on the padding).

Expected (z-score over the action tokens, the mean and the biased variance the method itself uses for
the scale, then step 2's division by the 10 action tokens, computed inline): mean 0 over the action
tokens. Got (the printed advantages are times 10, step 2 undone): mean 0.1615; row 0's advantage 0.8076
instead of 0.6547, row 1's -1.346 instead of -1.5275, as skyrl-train 0.3.1's ``normalize_advantages_dict``.
At the default ``advantage_batch_normalize: false`` step 1 is skipped. A batch without padding is not
affected. Exit 1 when the action-token mean is not 0.

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

# two prompts, two responses each, right-padded to 4 tokens; the score sits on the last action token
RESPONSE_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.float32)
SCORES = torch.tensor([1.0, 0.0, 1.0, 1.0 / 3.0])


def main() -> None:
    trainer_cfg = TrainerConfig()
    a = trainer_cfg.algorithm
    print(
        f"defaults: advantage_estimator={a.advantage_estimator}, "
        f"advantage_batch_normalize={a.advantage_batch_normalize}, loss_reduction={a.loss_reduction}"
    )
    rewards = torch.zeros(4, 4)
    rewards[torch.arange(4), RESPONSE_MASK.sum(-1).long() - 1] = SCORES
    data = TrainingInputBatch(
        {
            "rewards": rewards,
            "response_mask": RESPONSE_MASK.clone(),
            "loss_mask": RESPONSE_MASK.clone(),
            "values": None,
        }
    )
    data.metadata = {"uids": ["a", "a", "b", "b"], "avg_response_length": 2.5}
    cfg = types.SimpleNamespace(trainer=trainer_cfg, generator=GeneratorConfig())
    trainer = types.SimpleNamespace(cfg=cfg, all_metrics={})  # what the methods read of ``self``
    data = RayPPOTrainer.compute_advantages_and_returns(trainer, data)  # type: ignore[arg-type]
    raw = data["advantages"].clone()
    tokens = RESPONSE_MASK.sum()
    action = RESPONSE_MASK.bool()
    r4 = lambda t: [round(x, 4) for x in t.tolist()]  # noqa: E731
    print("GRPO advantages from the trainer (0 on padding):", r4(raw[:, 0]), "per row")

    a.advantage_batch_normalize = True
    got = RayPPOTrainer._normalize_advantages(trainer, data, [(0, 4)])["advantages"] * tokens  # type: ignore[arg-type]
    mean = raw[action].mean()
    std = raw[action].var(unbiased=False).sqrt()
    expected = torch.where(action, (raw - mean) / std, 0.0)
    print(
        "advantage_batch_normalize=true: mean over action tokens expected 0.0 "
        f"got {got[action].mean().item():.4f} "
        f"(advantages times the {int(tokens)} tokens token_mean divides by)"
    )
    print(f"  each row's advantage: expected {r4(expected[:, 0])}")
    print(f"                        got      {r4(got[:, 0])}")

    a.advantage_batch_normalize = False
    data["advantages"] = raw.clone()
    default = RayPPOTrainer._normalize_advantages(trainer, data, [(0, 4)])["advantages"] * tokens  # type: ignore[arg-type]
    print(
        f"advantage_batch_normalize=false (default): not normalised, mean {default[action].mean().item():.4f}"
    )
    wrong = abs(got[action].mean().item()) > 1e-5
    print("not centred (skyrl-5 reproduces)" if wrong else "centred (fixed)")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
