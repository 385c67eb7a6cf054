"""swift-junk-in-padding (robustness): ``swift.rl_core.advantage._sdar_agg_loss`` (advantage.py:346-359)
multiplies the per-token loss by the mask, so a NaN or inf in a masked-out slot makes the aggregated
loss NaN (0 * NaN = NaN). ms-swift's own inputs there are finite (model log-probs on padding), so this
is a robustness cell, not a wrong number on the pipeline's inputs.

Run from the repository root: ``.envs/swift/bin/python findings/repro/swift-junk-in-padding.py``
(standalone: ``pip install ms-swift==4.6.0 msgspec torch``; imports only torch and swift).

Trigger: NaN / inf off the mask. Default: finite padding. Expected: the token mean of the masked-in
entries (2.0). Exit 1 while NaN appears.
"""

from __future__ import annotations

import sys

import torch
from swift.rl_core.advantage import _sdar_agg_loss

mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
junk = torch.tensor([[1.0, 3.0, float("nan")], [2.0, float("inf"), 0.0]], dtype=torch.float64)
finite = torch.nan_to_num(junk, nan=7.0, posinf=9.0)
got = float(_sdar_agg_loss(junk, mask, "token-mean"))
print(f"trigger  NaN/inf padding: expected 2.0 got {got}")
print(f"default  finite padding:  got {float(_sdar_agg_loss(finite, mask, 'token-mean'))}")
sys.exit(1 if got != 2.0 else 0)
