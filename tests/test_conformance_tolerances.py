"""The suite's allowances for declared conventions (issue 28, found on RLinf 0.3.0): the whitened
variance under a declared ``whiten_eps``/``whiten_eps_placement`` (MASK-2) and the clip statistics
where an advantage rounds to 0 in a declared float32 computation (CLIP-3)."""

from __future__ import annotations

import pytest
import torch

from conformance.support import sign_lost, whitened_variance


def test_whitened_variance_follows_the_declared_eps_and_placement() -> None:
    x = torch.tensor([-15.0, 3.0, 12.0, 0.5], dtype=torch.float64)
    var = float(x.var())
    for eps, placement, scale in (
        (1e-8, "inside-sqrt", (var + 1e-8) ** -0.5),
        (1e-5, "outside-sqrt", 1.0 / (var**0.5 + 1e-5)),  # RLinf safe_normalize
        (1e-8, "clamp", max(var, 1e-8) ** -0.5),
    ):
        whitened = (x - x.mean()) * scale
        assert float(whitened.var()) == pytest.approx(whitened_variance(var, eps, placement), rel=1e-12)
    # the old expectation var / (var + 1e-8) is 1.6e-6 off RLinf's outside-sqrt 1e-5 at this std
    assert abs(whitened_variance(var, 1e-5, "outside-sqrt") - var / (var + 1e-8)) > 1e-6
    with pytest.raises(ValueError, match="placement"):
        whitened_variance(var, 1e-8, "inside")
    with pytest.raises(ValueError, match="eps"):
        whitened_variance(var, 0.0, "clamp")


def test_an_advantage_that_rounds_to_zero_in_float32_makes_its_token_ambiguous() -> None:
    a = torch.tensor([[-1.3486499568386152e-108, 1.48, 0.0, 1e-300]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    assert sign_lost(a, mask, torch.float32).tolist() == [[True, False, False, False]]
    # computed in float64 (nothing declared float32 in this test): no sign is lost
    assert sign_lost(a, mask, torch.float64).tolist() == [[False, False, False, False]]
    assert a.to(torch.float32)[0, 0].item() == 0.0  # what RLinf's float32 assert makes the adapter pass
