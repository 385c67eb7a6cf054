"""trl116-step-position-ids (trainer-path for absolute-position models, e.g. GPT-2 and OPT, whenever a
batch's prompts have unequal lengths; spec STEP-3, known-bugs A5).

Run from the repository root: ``.envs/trl116/bin/python findings/repro/trl116-step-position-ids.py``.

TRL 1.16's ``GRPOTrainer`` left-pads the prompts (``_generate_and_score_completions``) and scores them
with ``_get_per_token_logps_and_entropies``, which calls the model with ``input_ids`` and
``attention_mask`` only: no ``position_ids``. A GPT-2-like model then numbers the positions from the
first *column*, so a prompt with k pads on its left is scored at positions shifted by k (``generate``
numbers them from the first real token). The same prompt and completion give another log-prob, and
the step another gradient, depending on how much padding the other prompts of the batch forced.

Part 1 runs one optimizer step of ``GRPOTrainer.train()`` (``rollout_func`` returning a fixed batch;
``ppo_ref.adapters.thirdparty.trl_step``) with and without one extra pad on every prompt
(``pad_to_multiple_of``). Part 2 scores one row with TRL's own log-prob function, unpadded and with
one left pad.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch

from ppo_ref.adapters.step import example_batch, gradient_difference
from ppo_ref.adapters.thirdparty.trl_step import TrlGrpoStep

runner = TrlGrpoStep()
batch = example_batch(budget=6, prompt_length=9)
plain = runner.run(batch, loss_mode="dapo")
padded = runner.run(batch, loss_mode="dapo", pad_to=10)  # prompts 9 -> 10 columns (1 left pad)
diff, scale = gradient_difference(plain, padded)
print(f"part 1, GRPOTrainer step (dapo): |gradient difference| {diff:.4f} of largest entry {scale:.4f}")

trainer, _ = runner._trainer(batch, "dapo", 1, None)
prompt = torch.tensor([batch.prompt_ids[0]])
completion = torch.tensor([batch.completions[0]])
rows = []
for pads in (0, 1):
    ids = torch.cat([torch.zeros(1, pads, dtype=torch.long), prompt, completion], dim=1)
    mask = torch.cat(
        [torch.zeros(1, pads, dtype=torch.long), torch.ones(1, ids.shape[1] - pads, dtype=torch.long)], 1
    )
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, completion.shape[1]
        )
    rows.append(logps[0])
print(f"part 2, _get_per_token_logps_and_entropies, no pad:  {[round(float(x), 4) for x in rows[0]]}")
print(f"part 2, _get_per_token_logps_and_entropies, one pad: {[round(float(x), 4) for x in rows[1]]}")
print("expected: gradient difference 0, the same log-probs with and without the pad")
