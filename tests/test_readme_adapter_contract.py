"""The adapter contract (docs/adapters.md, found by its title through ``tests/docs_text.py``)
states, next to the signatures, what every op of the contract returns off the mask and when the
padding holds NaN or inf (issue 15, item 6): a third-party author reads there why a clause such as
IN-1 or GAE-4 fails."""

from __future__ import annotations

import re

from ppo_ref.adapters import OP_NAMES
from tests.docs_text import section

CONTRACT = "The adapter contract"


def _semantics_rows() -> dict[str, tuple[str, str]]:
    text = section(CONTRACT)
    start = text.index("| op | output off the mask (mask 0) | output when the padding holds NaN / ±inf |")
    rows: dict[str, tuple[str, str]] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == 3, line
        for op in re.findall(r"`(\w+)`", cells[0]):
            rows[op] = (cells[1], cells[2])
    return rows


def test_every_op_has_its_output_semantics_off_the_mask_and_under_nonfinite_padding() -> None:
    rows = _semantics_rows()
    assert set(OP_NAMES) <= set(rows), sorted(set(OP_NAMES) - set(rows))
    for op, (off_mask, padding) in rows.items():
        assert off_mask and len(padding) > 5, op
    # The two statements a third-party author most often misses (issue 15's examples).
    assert rows["kl_penalty"][0].startswith("0 when `mask` is given")
    assert "gradient" in rows["policy_loss"][1] and "0 on the padding" in rows["policy_loss"][1]
    assert "0" in rows["gae"][0] and "GAE-4" in rows["gae"][0]


def test_the_semantics_sit_next_to_the_signatures() -> None:
    text = section(CONTRACT)
    signatures = text.index('`kl_penalty(logp, ref_logp, estimator="k1", mask=None)`')
    semantics = text.index("| op | output off the mask (mask 0) |")
    conventions = text.index("Declared conventions (`ppo_ref.adapters.conventions.CONVENTIONS`")
    assert signatures < semantics < conventions
