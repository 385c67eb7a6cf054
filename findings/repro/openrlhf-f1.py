"""openrlhf-f1 (non-default: ``--algo.kl.use_loss --algo.kl.estimator k3``; the default estimator is k1).

Run from the repository root: ``.envs/openrlhf/bin/python findings/repro/openrlhf-f1.py``.

``PPOActor.training_step`` (``openrlhf/trainer/ray/ppo_actor.py``) computes the KL loss as
``compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=...)`` and
``aggregate_loss(kl, action_mask, **loss_batch_info)``; this script makes those two calls. k3 is clamped
to [-10, 10] (its log-ratio from below at -10), so a token whose log-prob fell more than about 2.6 nats
below the reference's gets k3 = 10 and no gradient (spec KLL-1: 1 - exp(ref_logp - logp)). With
``--algo.kl.unbiased_gradient`` the gradient survives (it comes from k2).
"""

from __future__ import annotations

from ppo_ref.adapters.thirdparty import _openrlhf_stubs  # flash_attn / vllm stand-ins

_openrlhf_stubs.install()
import torch  # noqa: E402
from openrlhf.models.loss import aggregate_loss  # noqa: E402
from openrlhf.models.utils import compute_approx_kl  # noqa: E402

logp = torch.tensor([[-1.0, -4.0]], requires_grad=True)  # token 2: 3 nats below the reference
ref = torch.tensor([[-1.2, -1.0]])
mask = torch.ones(1, 2)
kl = compute_approx_kl(logp, ref, kl_estimator="k3")
aggregate_loss(kl, mask, batch_num_tokens=2.0, global_batch_size=1.0).backward()
expected_grad = (1 - torch.exp(ref - logp.detach())) / 2
print("k3 per token:", [round(v, 4) for v in kl[0].tolist()], "expected [0.0187, 16.0855]")
print(
    "d loss / d logp:",
    [round(v, 4) for v in logp.grad[0].tolist()],
    "expected",
    [round(v, 4) for v in expected_grad[0].tolist()],
)
