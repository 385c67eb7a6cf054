"""trl-ppo-accumulation-end-of-dataloader (trainer-path: ``gradient_accumulation_steps > 1``, in the
iteration that draws the last batch of each pass over the prompts; every iteration when the prompts
fill one batch; spec STEP-1, STEP-2).

Run from the repository root:
``.envs/trl/bin/python findings/repro/trl-ppo-accumulation-end-of-dataloader.py``.

TRL 1.12's ``PPOTrainer.train()`` wraps each micro-batch in ``accelerator.accumulate(model)`` and
calls ``optimizer.step()``, relying on accelerate to skip the step until the last micro-batch. But
its prompts come from ``repeat_generator()`` over an accelerate-prepared dataloader, and accelerate
(``Accelerator._do_sync``, ``sync_with_dataloader`` True by default) syncs at every micro-batch once
the dataloader has yielded its last batch. In that iteration each micro-batch takes its own optimizer
step: the later micro-batches of the first mini-batch see a ratio off 1, and the update is k steps
of 1/k-scaled gradients instead of one. One iteration of ``train()`` on a fixed batch of one
dataloader batch (``ppo_ref.adapters.thirdparty.trl_step``), TRL's settings as they are.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from ppo_ref.adapters.step import example_batch
from ppo_ref.adapters.thirdparty.trl_step import TrlPpoStep

runner = TrlPpoStep(sync_with_dataloader=True)  # accelerate's default, as train() runs it
batch = example_batch(budget=6, prompt_length=9)
for k in (1, 2, 4):
    stats = runner.run(batch, loss_mode="token-mean", micro_batches=k).stats
    print(
        f"gradient_accumulation_steps={k}: optimizer steps in the mini-batch {stats['optimizer_steps']:.0f} "
        f"(expected 1); max |logp - old_logp| over its micro-batches {stats['max_abs_log_ratio']:.3g} "
        "(expected 0 before the mini-batch's step)"
    )
