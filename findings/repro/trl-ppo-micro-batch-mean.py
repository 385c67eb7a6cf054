"""trl-ppo-micro-batch-mean (trainer-path: ``gradient_accumulation_steps > 1`` with responses of
unequal lengths; spec STEP-2).

Run from the repository root: ``.envs/trl/bin/python findings/repro/trl-ppo-micro-batch-mean.py``.

TRL 1.12's ``PPOTrainer.train()`` takes ``pg_loss = masked_mean(pg_loss_max, ~padding_mask[micro])``
per micro-batch (``ppo_trainer.py:846``) and accelerate divides each by the accumulation steps: the
accumulated gradient is a mean of micro-batch means, so a token of a short micro-batch weighs more
than a token of a long one, and the same mini-batch split into 2 or 4 micro-batches gives another
gradient. One iteration of ``train()`` on a fixed batch (``ppo_ref.adapters.thirdparty.trl_step``:
``batch_generation`` returns the batch's completions; the gradient is read before
``optimizer.step``), with accelerate's end-of-dataloader sync turned off so that the k micro-batches
make one optimizer step (see trl-ppo-accumulation-end-of-dataloader).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from ppo_ref.adapters.step import example_batch, gradient_difference
from ppo_ref.adapters.thirdparty.trl_step import TrlPpoStep

runner = TrlPpoStep(sync_with_dataloader=False)
batch = example_batch(budget=6, prompt_length=9)
whole = runner.run(batch, loss_mode="token-mean")
for k in (2, 4):
    split = runner.run(batch, loss_mode="token-mean", micro_batches=k)
    diff, scale = gradient_difference(whole, split)
    print(
        f"{k} micro-batches ({split.stats['optimizer_steps']:.0f} optimizer step): |gradient difference| "
        f"{diff:.4f} of largest entry {scale:.4f}; expected 0"
    )
