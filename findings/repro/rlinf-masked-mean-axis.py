"""rlinf-masked-mean-axis (latent): ``rlinf.utils.utils.masked_mean(values, mask, axis=...)`` gives NaN
for a slice without a masked-in entry (0 / 0), while its whole-tensor form returns 0 for an all-False
mask. RLinf 0.3.0 calls it without ``axis`` everywhere (losses, advantages, metrics), so its own
pipeline never makes this input: latent.

Run from the repository root: ``.envs/rlinf/bin/python findings/repro/rlinf-masked-mean-axis.py``
(standalone: ``pip install --no-deps rlinf==0.3.0`` plus ``omegaconf ray regex torch``; imports only
torch and rlinf).

Drives ``rlinf.utils.utils.masked_mean`` (rlinf/utils/utils.py:309-316): ``(values * mask).sum(axis) /
mask.sum(axis)``, guarded only by ``(~mask).all()`` for the whole mask. Trigger: ``axis=0`` on a
right-padded batch whose last column holds no action token (every row shorter than the width, the
common shape of a padded batch). Default (what RLinf calls): ``axis=None``, same batch; and the
all-False mask without ``axis``.

Expected (spec MASK-1: an empty mask, or an empty slice with ``dim``, gives 0): per column, the sum of
the masked-in entries over their count, 0 for a column without one, computed inline with plain torch.
Got: NaN in the empty column. Exit 1 while the NaN appears.
"""

from __future__ import annotations

import sys

import torch
from rlinf.utils.utils import masked_mean

values = torch.tensor([[1.0, 2.0, 5.0], [3.0, 7.0, 9.0]], dtype=torch.float64)
mask = torch.tensor([[True, True, False], [True, False, False]])  # column 2: no action token

counts = mask.sum(dim=0)
sums = torch.where(mask, values, torch.zeros((), dtype=values.dtype)).sum(dim=0)
expected = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros((), dtype=values.dtype))
got = masked_mean(values, mask, axis=0)
print(f"trigger  axis=0:            expected {expected.tolist()} got {got.tolist()}")

whole_expected = float(sums.sum() / counts.sum())
whole = masked_mean(values, mask)
print(f"default  axis=None:         expected {whole_expected} got {float(whole)}")
empty = masked_mean(values, torch.zeros_like(mask))
print(f"default  all-False mask:    expected 0.0 got {float(empty)}")

sys.exit(1 if bool(torch.isnan(got).any()) else 0)
