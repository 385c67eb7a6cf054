"""verl-step-norm-width (non-default: ``actor.loss_agg_mode: seq-mean-token-sum-norm`` with
``actor.loss_scale_factor`` left null; spec STEP-3, AGG-1; the op-level side is verl-f3).

Run from the repository root: ``.envs/verl/bin/python findings/repro/verl-step-norm-width.py``.

One actor update of verl's trainer (``RayPPOTrainer._compute_old_log_prob`` and ``_update_actor``
through ``TrainingWorker.train_mini_batch`` and the FSDP2 engine's ``forward_backward_batch`` /
``ppo_loss``; ``ppo_ref.adapters.thirdparty.verl_step``) on the same batch with its responses padded
to 6 columns (the token budget, what verl's agent loop pads to) and to 9. ``agg_loss`` divides the
Dr. GRPO sum by ``loss_scale_factor``, whose default is ``loss_mask.shape[-1]``: the padded response
width that ``no_padding_2_padding`` restores, so the three extra columns scale the gradient by 6/9.
``loss_scale_factor`` set to a constant (the documented remedy) removes the dependence.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

from ppo_ref.adapters.step import example_batch, gradient_difference  # noqa: E402
from ppo_ref.adapters.thirdparty.verl_step import VerlStep  # noqa: E402

batch = example_batch(budget=6, prompt_length=9)
for label, runner in (
    ("loss_scale_factor null (default)", VerlStep()),
    ("loss_scale_factor 6", VerlStep(loss_scale_factor=6)),
):
    plain = runner.run(batch, loss_mode="seq-mean-token-sum-norm")
    wide = runner.run(batch, loss_mode="seq-mean-token-sum-norm", pad_to=9)
    diff, scale = gradient_difference(plain, wide)
    ratio = max(float(g.abs().max()) for g in wide.gradient.values()) / scale
    print(
        f"{label}: width 6 vs 9: |gradient difference| {diff:.4f} of largest entry {scale:.4f} "
        f"(largest entry ratio {ratio:.4f}); loss {plain.loss:.5f} vs {wide.loss:.5f}"
    )
token = VerlStep()
diff, scale = gradient_difference(
    token.run(batch, loss_mode="token-mean"), token.run(batch, loss_mode="token-mean", pad_to=9)
)
print(f"token-mean (default mode), width 6 vs 9: |gradient difference| {diff:.2g} of {scale:.4f}")
print("expected: gradient difference 0 at every width (a constant normaliser)")
