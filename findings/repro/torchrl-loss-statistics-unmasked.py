"""torchrl-loss-statistics-unmasked (metrics-only): TorchRL 0.14.1's ``ClipPPOLoss`` masks its losses
with the validity mask TorchRL's own padding writes, but reduces the logged statistics
(``clip_fraction``, ``kl_approx``, ``ESS``, ``mean_ratio``, ``max_ratio``, ``entropy``,
``explained_variance``) over every position, the padding included (``ESS`` and ``explained_variance``
over the leading, trajectory, dimension only: one value per time step).

Interpreter: ``.envs/torchrl/bin/python findings/repro/torchrl-loss-statistics-unmasked.py`` (from the
repository root; standalone: ``pip install torchrl==0.14.1 tensordict torch``).

What it drives, TorchRL's PPO pipeline on a tiny discrete policy (``ProbabilisticActor`` over a
``Categorical``, a ``ValueOperator`` critic, both ``nn.Linear``): a rollout of two trajectories (3 and 1
steps) as a collector returns it, advantages from TorchRL's ``GAE`` on it, one optimizer step on the
loss (the first PPO epoch), then ``ClipPPOLoss.forward`` again (the second epoch, where the ratio is
no longer 1) on

- the trigger: the batch padded per trajectory by ``torchrl.collectors.utils.split_trajectories``
  (what a recurrent policy trains on), which writes ``("collector", "mask")``; ``ClipPPOLoss``'s
  default ``loss_mask_key="auto"`` reads it (so do ``SliceSampler(pad_output=True)`` batches, and
  ``"shifted_valid"`` from a value estimator with ``shifted=True``);
- the default: the same four transitions as the flat batch (no padding, no mask).

Expected, computed inline with plain torch from the definitions over the 4 real transitions:
``r = exp(logp_new - logp_old)``; ``clip_fraction`` = share with ``|log r| > log(1 +- 0.2)`` bounds
outside, ``kl_approx`` = mean of ``logp_old - logp_new``, ``mean_ratio`` / ``max_ratio`` of ``r``, ``ESS`` =
``exp(2 logsumexp(log r) - logsumexp(2 log r)) / n``, ``entropy`` the policy's mean entropy, and
``explained_variance`` = ``1 - var(target - value) / var(target)``, and ``loss_objective`` =
``-mean(min(r A, clip(r) A))``. Got: ``ClipPPOLoss``'s outputs. The flat batch
gives the expected numbers; the padded batch gives the right ``loss_objective`` and diluted statistics.

Exit 1 when a statistic of the padded batch differs from the expected (by more than 1e-5); 0 when none
does (a fixed release).
"""

from __future__ import annotations

import sys

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors.utils import split_trajectories
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

torch.manual_seed(0)
OBS, ACTIONS, EPS = 3, 4, 0.2
actor = ProbabilisticActor(
    TensorDictModule(nn.Linear(OBS, ACTIONS), in_keys=["observation"], out_keys=["logits"]),
    in_keys=["logits"], distribution_class=torch.distributions.Categorical, return_log_prob=True,
)  # fmt: skip
critic = ValueOperator(nn.Linear(OBS, 1), in_keys=["observation"])

# the rollout as a collector returns it: two trajectories (ids 0: 3 steps, 1: 1 step), done at their ends
observation = torch.randn(4, OBS)
rollout = TensorDict(
    {
        "observation": observation,
        ("next", "observation"): torch.randn(4, OBS),
        ("next", "reward"): torch.tensor([[1.0], [0.0], [0.5], [-1.0]]),
        ("next", "done"): torch.tensor([[False], [False], [True], [True]]),
        ("next", "terminated"): torch.tensor([[False], [False], [True], [True]]),
        ("collector", "traj_ids"): torch.tensor([0, 0, 0, 1]),
    },
    batch_size=[4],
)
with torch.no_grad():
    actor(rollout)  # samples "action", writes its log-prob ("action_log_prob")
    GAE(gamma=0.99, lmbda=0.95, value_network=critic)(rollout)  # "advantage", "value_target"
loss = ClipPPOLoss(actor, critic, clip_epsilon=EPS)  # TorchRL's defaults otherwise
optimizer = torch.optim.SGD(actor.parameters(), lr=2.0)
loss(rollout.clone())["loss_objective"].backward()  # epoch 1 (ratio 1), then one step
optimizer.step()
optimizer.zero_grad()

# expected, from the definitions over the 4 transitions (the policy after the step)
with torch.no_grad():
    dist = torch.distributions.Categorical(logits=actor.module[0].module(observation))
    log_r = dist.log_prob(rollout["action"]) - rollout["action_log_prob"]
    r, a = log_r.exp(), rollout["advantage"].squeeze(-1)
    low, high = torch.log(torch.tensor(1 - EPS)), torch.log(torch.tensor(1 + EPS))
    residual = rollout["value_target"] - critic(rollout.clone())["state_value"]
    expected = {
        "loss_objective": float(-torch.minimum(r * a, r.clamp(1 - EPS, 1 + EPS) * a).mean()),
        "clip_fraction": float(((log_r < low) | (log_r > high)).float().mean()),
        "kl_approx": float((-log_r).mean()),
        "ESS": float((2 * log_r.logsumexp(0) - (2 * log_r).logsumexp(0)).exp() / len(r)),
        "mean_ratio": float(r.mean()),
        "max_ratio": float(r.max()),
        "entropy": float(dist.entropy().mean()),
        "explained_variance": float(
            1 - torch.var(residual, correction=0) / torch.var(rollout["value_target"], correction=0)
        ),
    }

padded = split_trajectories(rollout.clone())  # [2, 3], zero-padded, ("collector", "mask")
print(f"split_trajectories: batch {list(padded.batch_size)}, mask {padded['collector', 'mask'].tolist()}")
wrong = []
for label, batch in (("flat batch, no mask (default)", rollout.clone()), ("padded + mask (trigger)", padded)):
    with torch.no_grad():
        out = loss(batch)
    print(label)
    for key, want in expected.items():
        value = out[key]
        bad = value.numel() != 1 or not abs(float(value) - want) <= 1e-5
        got = (
            f"{float(value): .4f}"
            if value.numel() == 1
            else f"shape {list(value.shape)}: {value.flatten().tolist()}"
        )
        print(f"  {key:18s} expected {want: .4f}  got {got}" + ("  <- WRONG" if bad else ""))
        if bad and label.startswith("padded"):
            wrong.append(key)
sys.exit(1 if wrong else 0)
