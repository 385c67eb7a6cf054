"""verl-step-overlong-eos (non-default: ``reward_model.reward_manager: dapo`` with
``overlong_buffer.enable: True``, as the DAPO recipe sets it; spec STEP-5).

Run from the repository root: ``.envs/verl/bin/python findings/repro/verl-step-overlong-eos.py``.

verl's ``DAPORewardManager.__call__`` scores each response, then adds the soft overlong penalty
``min(-(valid_response_length - (max_resp_len - len)) / len * penalty_factor, 0)`` computed from the
response's length alone (``workers/reward_manager/dapo.py``). The step-tier batch has three rows of
exactly ``max_resp_len`` = 6 tokens: row 0 ends with EOS on its last allowed token (a finished
answer), rows 2 and 7 were cut at the budget. With ``overlong_buffer.len`` 1 all three get the same
penalty: the finished answer is treated as the truncated ones. The batch is laid out as verl's agent
loop hands it to the trainer (``ppo_ref.adapters.thirdparty.verl_step``: left-padded prompts,
right-padded responses, attention mask, position ids). Without the overlong buffer (the naive and
default managers) no row is penalised, and verl's GAE bootstraps no row (its last step's next value is
0), so the default path treats no row as truncated.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

from ppo_ref.adapters.step import example_batch  # noqa: E402
from ppo_ref.adapters.thirdparty.verl_step import VerlStep  # noqa: E402

batch = example_batch(budget=6, prompt_length=9)
runner = VerlStep()
data = runner._rollout(batch, None, None)
plain = runner._rewards(batch, data, overlong=False).sum(dim=1)
shaped = runner._rewards(batch, data, overlong=True).sum(dim=1)
for row, completion in enumerate(batch.completions):
    kind = "cut at the budget" if batch.truncated[row] else "ends with EOS"
    print(
        f"row {row}: {len(completion)} tokens, {kind:17s} score {plain[row]:+.2f} -> with overlong buffer "
        f"{shaped[row]:+.2f} (penalty {shaped[row] - plain[row]:+.2f})"
    )
print(
    f"rows penalised: {[r for r in range(batch.size) if shaped[r] < plain[r]]}; truncated rows: "
    f"{[r for r in range(batch.size) if batch.truncated[r]]}"
)
print("expected: row 0 (EOS on the last allowed token) unpenalised, as a finished answer")
