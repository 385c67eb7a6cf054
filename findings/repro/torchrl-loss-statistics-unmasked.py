"""torchrl-loss-statistics-unmasked (metrics-only), through TorchRL 0.14.1's ``ClipPPOLoss``.

Run from the repository root: ``.envs/torchrl/bin/python findings/repro/torchrl-loss-statistics-unmasked.py``.

``ClipPPOLoss.forward`` is TorchRL's PPO training step. With a padded batch and its mask in
``("collector", "mask")`` (what ``SliceSampler(pad_output=True)`` writes and ``loss_mask_key="auto"``
reads), ``loss_objective`` is a masked mean, but the logged ``clip_fraction``, ``kl_approx``,
``mean_ratio`` are means over every position: padding dilutes them. Default ``ClipPPOLoss`` settings
except ``entropy_bonus=False`` and an l2 critic loss; the actor returns given token log-probs.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from tensordict.nn import ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential, TensorDictModule
from torchrl.objectives import ClipPPOLoss


class GivenLogProb(torch.distributions.Distribution):
    """log_prob(action) = the given token log-prob."""

    arg_constraints: dict[str, object] = {}  # noqa: RUF012  (torch's Distribution API)

    def __init__(self, given: torch.Tensor) -> None:
        self.given = given
        super().__init__(batch_shape=given.shape, validate_args=False)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.given


actor = ProbabilisticTensorDictSequential(
    ProbabilisticTensorDictModule(
        in_keys={"given": "logp"}, out_keys=["action"], distribution_class=GivenLogProb
    )
)
critic = TensorDictModule(torch.nn.Identity(), in_keys=["v"], out_keys=["state_value"])
loss = ClipPPOLoss(
    actor, critic, clip_epsilon=0.2, entropy_bonus=False, loss_critic_type="l2", log_explained_variance=False
)
# one action token (ratio 2, A = 1) and one padded token (zeros, as split_trajectories pads), masked out
td = TensorDict(
    {
        "logp": torch.tensor([[0.0, 0.0]]),
        "action_log_prob": torch.tensor([[-0.6931472, 0.0]]),
        "advantage": torch.tensor([[[1.0], [0.0]]]),
        "action": torch.zeros(1, 2),
        ("collector", "mask"): torch.tensor([[True, False]]),
        "v": torch.tensor([[[1.0], [0.0]]]),
        "state_value": torch.zeros(1, 2, 1),
        "value_target": torch.zeros(1, 2, 1),
    },
    batch_size=[1, 2],
)
out = loss(td)
print("loss_objective:", round(out["loss_objective"].item(), 4), "(masked correctly: -min(2, 1.2) = -1.2)")
print("clip_fraction: got", round(out["clip_fraction"].item(), 4), "expected 1.0")
print("kl_approx:     got", round(out["kl_approx"].item(), 4), "expected -0.6931 (k1 over the action token)")
print("mean_ratio:    got", round(out["mean_ratio"].item(), 4), "expected 2.0")
