"""EDGE-1..3: the value clauses' numbers on edge inputs (issue 20; spec section 21).

Value clauses are checked on what a library's own pipeline produces: by default no holes in the
masks, at least one action token in every row, finite logits. The inputs some pipelines produce and
most never do are checked here, as clauses of kind ``edge`` (a FAIL still fails the run, counted
apart): an adapter that declares one in ``edge_inputs`` gets these clauses as value clauses.

Each property isolates the edge input: it draws the op's inputs as the value clauses do (no edge
input) and, when the adapter matches the reference variant there (else the value clauses report
the difference and this example proves nothing more), adds the edge input and compares again.
Re-run by the convention inference under an alternative, a difference without the edge input fails
too: an alternative explains an edge FAIL only if it also explains the op's numbers without it.

- EDGE-1: holes (masked-out columns inserted inside the rows, holding what ``masked_fill`` allows);
- EDGE-2: rows without an action token inserted into the batch;
- EDGE-3: ``-inf`` logits (banned tokens, never the scored token nor a whole position).

The hand cases of value clauses whose inputs have an undeclared edge input are reported under these
clauses too (``test_hand_cases.py``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from . import strategies as cs
from .support import Context, assert_close, call_both, examples, note_repro, rerunning
from .test_invariances import OPS, _compare, _outputs, _whitening_scale, outputs_and_grad


def _param(op: str, clause: str) -> Any:
    return pytest.param(op, marks=[pytest.mark.ops(op), pytest.mark.clause(clause)])


def _base(ctx: Context, op: str, data: st.DataObject) -> dict[str, Any]:
    """The op's inputs as the value clauses draw them: no edge input whatever the clause forces."""
    with cs.declared_inputs(ctx.conventions.masked_fill, holes=False, empty_rows=False, inf_logits=False):
        return OPS[op].draw(ctx, data)


def _both(ctx: Context, op: str, kwargs: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(adapter's outputs, the variant's), with the gradient in the op's differentiated input."""
    note_repro(ctx, op, **kwargs)
    wrt = OPS[op].grad_wrt
    results = []
    for function in (ctx.op(op), getattr(ctx.variant, op)):
        if wrt is None:
            fresh = {k: v.detach().clone() if isinstance(v, Tensor) else v for k, v in kwargs.items()}
            results.append(_outputs(op, function(**fresh)))
        else:
            outputs, grad = outputs_and_grad(function, op, kwargs, wrt)
            results.append({**outputs, "grad": grad})
    return results[0], results[1]


def _matches(ctx: Context, op: str, kwargs: dict[str, Any]) -> bool:
    """Whether the adapter matches the variant on ``kwargs`` (the isolation step)."""
    try:
        got, want = _both(ctx, op, kwargs)
        dtype = kwargs[OPS[op].per_token[0]].dtype
        _compare(op, got, want, dtype, "without the edge input", scale=_whitening_scale(ctx, op, kwargs))
    except (AssertionError, ValueError, RuntimeError):
        return False
    return True


def _check(ctx: Context, op: str, base: dict[str, Any], edged: dict[str, Any], what: str) -> None:
    if not _matches(ctx, op, base):
        # a value clause's difference, reported there; under a convention the inference tries, the
        # alternative must explain it too
        assert not rerunning(), f"{op} differs from the variant without the edge input"
        return
    got, want = _both(ctx, op, edged)
    dtype = edged[OPS[op].per_token[0]].dtype
    _compare(op, got, want, dtype, what, scale=_whitening_scale(ctx, op, edged))


@pytest.mark.parametrize("op", [_param(op, "EDGE-1") for op in OPS])
@examples()
@given(data=st.data())
def test_holes_inside_the_rows(ctx: Context, op: str, data: st.DataObject) -> None:
    """EDGE-1: masked-out columns inserted inside the rows (tool or observation tokens) hold what
    ``masked_fill`` allows; the outputs and the gradient are the reference variant's."""
    if op in ctx.conventions.prefix_masks:
        pytest.skip(f"not provided: the adapter declares prefix_masks for {op!r} (its masks have no holes)")
    base = _base(ctx, op, data)
    mask = base["mask"]
    steps = mask.shape[1]
    if steps < 2:
        return  # no room for a hole inside a row
    positions = data.draw(st.lists(st.integers(1, steps - 1), min_size=1, max_size=3).map(sorted), "holes")
    edged = dict(base, mask=cs.insert_holes(mask, positions, 0))
    for name in OPS[op].per_token:
        fill = data.draw(cs.masked_fills((mask.shape[0], len(positions)), base[name].dtype))
        edged[name] = cs.insert_holes(base[name], positions, fill)
    _check(ctx, op, base, edged, f"with holes inserted before columns {positions}")


def _insert_rows(tensor: Tensor, at: int, rows: Tensor) -> Tensor:
    return torch.cat([tensor[:at], rows.to(tensor.dtype), tensor[at:]], dim=0)


@pytest.mark.parametrize("op", [_param(op, "EDGE-2") for op in OPS])
@examples()
@given(data=st.data())
def test_rows_without_action_tokens(ctx: Context, op: str, data: st.DataObject) -> None:
    """EDGE-2: rows without any action token inserted into the batch (an empty response, a padded
    micro-batch row) hold what ``masked_fill`` allows; the outputs and the gradient are the
    reference variant's (an empty row adds nothing and divides nothing by zero)."""
    base = _base(ctx, op, data)
    mask = base["mask"]
    batch, steps = mask.shape
    count = data.draw(st.integers(1, 2), label="empty rows")
    at = data.draw(st.integers(0, batch), label="inserted at row")
    edged = dict(base, mask=_insert_rows(mask, at, torch.zeros(count, steps, dtype=mask.dtype)))
    for name, value in base.items():
        if name == "mask" or not isinstance(value, Tensor) or value.dim() == 0 or value.shape[0] != batch:
            continue
        if name in OPS[op].per_token:
            extra = data.draw(cs.masked_fills((count, steps), value.dtype))
        else:  # per-row inputs (scores, bootstrap values): finite values of the row
            extra = data.draw(cs.float_tensors((count, *value.shape[1:]), value.dtype, -1.0, 1.0))
        edged[name] = _insert_rows(value, at, extra)
    _check(ctx, op, base, edged, f"with {count} row(s) without action tokens inserted at row {at}")


LOGIT_OPS = ("token_logprobs", "entropy")


@pytest.mark.parametrize("op", [_param(op, "EDGE-3") for op in LOGIT_OPS])
@examples()
@given(data=st.data())
def test_minus_infinity_logits(ctx: Context, op: str, data: st.DataObject) -> None:
    """EDGE-3: some logits are ``-inf`` (banned tokens, as a sampler's logits processors leave them;
    never the scored next token nor a whole position): log-probs and entropies are the reference's,
    finite (a banned token has probability 0 and adds 0 to the entropy)."""
    with cs.declared_inputs(ctx.conventions.masked_fill, holes=False, empty_rows=False, inf_logits=False):
        batch = data.draw(cs.logits_batches(dtypes=cs.FLOAT_DTYPES), label="batch")
    logits, ids = batch.logits, batch.input_ids
    rows, length, vocab = logits.shape
    if vocab < 2:
        return  # one token: nothing to ban
    kwargs: dict[str, Any] = {"logits": logits} if op == "entropy" else {"logits": logits, "input_ids": ids}
    actual, expected = call_both(ctx, op, **kwargs)
    try:
        assert_close(actual, expected, logits.dtype, f"{op} with finite logits")
    except AssertionError:
        if rerunning():  # under a convention the inference tries, it must explain this too
            raise
        return  # a value clause's difference (LOGP-1, ENT-1), reported there
    seed = data.draw(st.integers(0, 2**32 - 1), label="banned-token seed")
    generator = torch.Generator().manual_seed(seed)
    banned = torch.rand(rows, length, vocab, generator=generator) < 0.4
    kept = torch.zeros(rows, length, dtype=torch.long)
    kept[:, :-1] = ids[:, 1:]  # the next token stays allowed: its log-prob is scored (LOGP-1)
    banned.scatter_(2, kept.unsqueeze(-1), False)
    edged = logits.masked_fill(banned, -math.inf)
    actual, expected = call_both(ctx, op, **{**kwargs, "logits": edged})
    assert_close(actual, expected, logits.dtype, f"{op} with {int(banned.sum())} banned (-inf) logits")
