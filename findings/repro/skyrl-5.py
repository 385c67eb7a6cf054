"""skyrl-5 (non-default: ``trainer.algorithm.advantage_batch_normalize: true``): the batch normalisation
centres the advantages with a mean over every slot, padding included.

Run from the repository root: ``.envs/skyrl/bin/python findings/repro/skyrl-5.py``
(standalone: ``pip install skyrl-train==0.3.1 torch``; imports only torch, omegaconf and skyrl_train).

Drives skyrl-train 0.3.1's own ``RayPPOTrainer.compute_advantages_and_returns`` (trainer.py:721, stand-in
``self`` holding the config; default estimator ``grpo``, ``grpo_norm_by_std: true``), then, as
``RayPPOTrainer.train`` does when ``advantage_batch_normalize`` is true (trainer.py:264-265),
``normalize_advantages_dict``: ``mean = advantages.mean()`` over every slot (ppo_utils.py:142) but a
variance over the response tokens only. A right-padded batch of two prompts x two responses of 4, 2, 3
and 1 tokens (the GRPO advantages are 0 on the padding).

Expected (z-score over the action tokens, the mean and the biased variance ``normalize_advantages_dict``
itself uses for the scale): mean 0 over the action tokens. Got 0.1615; row 0's advantage 0.8076 instead
of 0.6547, row 1's -1.346 instead of -1.5275. At the default ``advantage_batch_normalize: false`` the
trainer does not call it (the GRPO advantages are used as computed). A batch without padding (all
responses of equal length) is not affected. Exit 1 when the action-token mean is not 0.
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
from skyrl_train.utils.ppo_utils import normalize_advantages_dict  # noqa: E402

CONFIG = pathlib.Path(skyrl_train.__file__).parent / "config" / "ppo_base_config.yaml"

# two prompts, two responses each, right-padded to 4 tokens; the score sits on the last action token
RESPONSE_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.float32)
SCORES = torch.tensor([1.0, 0.0, 1.0, 1.0 / 3.0])


def main() -> None:
    cfg = OmegaConf.load(CONFIG)
    print(
        f"defaults: advantage_estimator={cfg.trainer.algorithm.advantage_estimator}, "
        f"advantage_batch_normalize={cfg.trainer.algorithm.advantage_batch_normalize}"
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
    trainer = types.SimpleNamespace(cfg=cfg, all_metrics={})  # what the method reads of ``self``
    data = RayPPOTrainer.compute_advantages_and_returns(trainer, data)
    raw = data["advantages"].clone()
    got = normalize_advantages_dict(data)["advantages"]  # trainer.py:265, advantage_batch_normalize: true
    action = RESPONSE_MASK.bool()
    mean = raw[action].mean()
    std = raw[action].var(unbiased=False).sqrt()
    expected = torch.where(action, (raw - mean) / std, 0.0)
    r4 = lambda t: [round(x, 4) for x in t.tolist()]  # noqa: E731
    print("GRPO advantages from the trainer (0 on padding):", r4(raw[:, 0]), "per row")
    print(
        "advantage_batch_normalize=true: mean over action tokens expected 0.0 "
        f"got {got[action].mean().item():.4f}"
    )
    print(f"  each row's advantage: expected {r4(expected[:, 0])}")
    print(f"                        got      {r4(got[:, 0])}")
    print(f"advantage_batch_normalize=false (default): not normalised, mean {raw[action].mean().item():.4f}")
    wrong = abs(got[action].mean().item()) > 1e-5
    print("not centred (skyrl-5 reproduces)" if wrong else "centred (fixed)")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
