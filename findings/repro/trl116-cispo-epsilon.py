"""trl116-cispo-epsilon (non-default: ``loss_type="cispo"`` without ``epsilon_high``; spec STEP-1, CISPO-2).

Run from the repository root: ``.envs/trl116/bin/python findings/repro/trl116-cispo-epsilon.py``.

TRL 1.16's CISPO clamps the importance weight at ``max=self.epsilon_high`` (``grpo_trainer.py``,
``_compute_loss``: ``torch.clamp(coef_1, max=self.epsilon_high)``): an absolute bound, the eps_max
of ScaleRL. ``epsilon_high`` defaults to ``epsilon`` (0.2) when not given, so with the defaults every
on-policy token (ratio exactly 1) is clipped to weight 0.2: the gradient is 1/5 of CISPO's, and the
logged ``cispo_clip_ratio`` counts every positive-advantage token as clipped before any update.
This script runs one optimizer step of ``GRPOTrainer.train()`` (``rollout_func`` returning a fixed
batch; ``ppo_ref.adapters.thirdparty.trl_step``) with ``loss_type="cispo"`` and ``"dapo"``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from ppo_ref.adapters.step import example_batch
from ppo_ref.adapters.thirdparty.trl_step import TrlGrpoStep

runner = TrlGrpoStep()
batch = example_batch(budget=6, prompt_length=9)
cispo = runner.run(batch, loss_mode="cispo")
dapo = runner.run(batch, loss_mode="dapo")
ratio = max(float(g.abs().max()) for g in cispo.gradient.values()) / max(
    float(g.abs().max()) for g in dapo.gradient.values()
)
print(f"step-0 max |logp - old_logp|: {cispo.stats['max_abs_log_ratio']} (ratio exactly 1)")
print(f"cispo_clip_ratio at step 0: {cispo.stats['clipfrac']:.4f}; expected 0")
print(f"largest gradient entry, cispo / dapo: {ratio:.4f}; expected 1 (at ratio 1 both are -A grad log p)")
