"""trl-ppo-score-slot-width (trainer-path: any response that fills the padded width, with TRL's
default ``lam = 0.95``; spec STEP-3, STEP-5).

Run from the repository root: ``.envs/trl/bin/python findings/repro/trl-ppo-score-slot-width.py``.

TRL 1.12's ``PPOTrainer.train()`` puts the score one slot after the last response token
(``actual_end = where(sequence_lengths_p1 < width, sequence_lengths_p1, sequence_lengths)``,
``ppo_trainer.py:778``) and keeps the critic's value there (``padding_mask_p1``): except for a
response that fills the padded width, whose score lands on its last token and whose EOS advantage
has no ``V(EOS+1)``. The same response gets other advantages, and the step another gradient,
depending on whether the batch's padding leaves a slot after it: the EOS-ended response that is the
longest of the batch (and every response cut at the budget) is treated unlike the others. One
iteration of ``train()`` on a fixed batch (``ppo_ref.adapters.thirdparty.trl_step``), completions
padded to the budget (6) and to 9 columns.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from ppo_ref.adapters.step import example_batch, gradient_difference
from ppo_ref.adapters.thirdparty.trl_step import TrlPpoStep

runner = TrlPpoStep(sync_with_dataloader=False)
batch = example_batch(budget=6, prompt_length=9)
tight = runner.run(batch, loss_mode="token-mean")
wide = runner.run(batch, loss_mode="token-mean", pad_to=9)
diff, scale = gradient_difference(tight, wide)
print(f"width 6 vs 9: |gradient difference| {diff:.4f} of largest entry {scale:.4f}; expected 0")
filled = runner.run(batch, loss_mode="token-mean", pad_fill=15)
junk = gradient_difference(tight, filled)[0]
print(f"token 15 after EOS instead of the pad: |gradient difference| {junk:.2g}")
