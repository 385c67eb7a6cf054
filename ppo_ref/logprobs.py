"""Per-token log-probabilities and entropies from language-model logits (spec LOGP-*, ENT-1).

Both work through the (B, L, V) logits in blocks, each upcast to float32 (or float64) on its own,
so half-precision logits are handled at full precision without a float32 copy of the whole
tensor: the peak extra memory is about one block of ``CHUNK_ELEMENTS`` floats, not B * L * V.
``token_logprobs`` slices its blocks out of the logits as views (no copy of the logits, whatever
their strides); small blocks stay in the allocator's cache instead of being faulted in afresh.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ppo_ref._validate import check_float, check_real, compute_dtype

__all__ = ["CHUNK_ELEMENTS", "entropy", "token_logprobs"]

CHUNK_ELEMENTS = 1 << 20
"""Upper bound on the logits elements of one ``token_logprobs`` block (1M floats = 4 MiB in float32)."""

_ENTROPY_CHUNK_ELEMENTS = 1 << 22
"""Rows of ``entropy`` are processed in chunks of at most this many logits (16 MiB in float32)."""


def _row_chunks(rows: int, vocab: int) -> list[slice]:
    step = max(1, _ENTROPY_CHUNK_ELEMENTS // max(vocab, 1))
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def _even_slices(total: int, parts: int) -> list[slice]:
    bounds = [total * i // parts for i in range(parts + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(parts)]


def _blocks(batch: int, steps: int, vocab: int) -> list[list[tuple[slice, slice]]]:
    """(rows, positions) blocks of a (batch, steps, vocab) tensor, grouped by batch rows.

    Whole batch rows go together while a block stays near ``CHUNK_ELEMENTS``; a longer row is cut
    into near-equal runs of positions. A block holds at least two positions whenever the tensor
    allows it and V <= 2M: torch may split the reduction of a lone row across threads, which
    rounds differently, so this keeps the results bit-identical to one-row-chunk-free layouts.
    """
    positions = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    if vocab <= _ENTROPY_CHUNK_ELEMENTS // 2:
        positions = max(2, positions)
    if positions >= steps:
        groups = max(1, batch // max(1, positions // max(steps, 1)))
        return [[(rows, slice(0, steps))] for rows in _even_slices(batch, groups)]
    runs = _even_slices(steps, max(1, steps // positions))
    return [[(slice(row, row + 1), run) for run in runs] for row in range(batch)]


def _check_logsumexp(lse: Tensor, name: str) -> None:
    # logsumexp is NaN if a logit is NaN, +inf if one is +inf, -inf if all are -inf; a finite result
    # proves the row is usable, at no extra pass over the logits.
    if not bool(torch.isfinite(lse).all()):
        bad = int((~torch.isfinite(lse)).nonzero()[0, 0])
        raise ValueError(
            f"{name}: a row of logits (flat position {bad} of its chunk) contains NaN or +inf or is "
            "entirely -inf; expected finite logits (-inf allowed for banned tokens)"
        )


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    r"""Log-probability of each next token under the temperature-scaled logits (spec LOGP-1..3).

    .. math:: \text{out}[b, i] = \log\operatorname{softmax}\!\big(\text{logits}[b, i] / \tau\big)
              [\text{input\_ids}[b, i + 1]], \qquad i = 0, \dots, L - 2

    ===============  ===========  ===========================================================
    argument         shape        meaning
    ===============  ===========  ===========================================================
    ``logits``       (B, L, V)    the model's output for the sequence ``input_ids``
                                  (any float dtype; bf16/fp16 are computed in float32)
    ``input_ids``    (B, L)       integer token ids in [0, V)
    ``temperature``  number > 0   the sampling temperature τ: logits are divided by it
    returns          (B, L - 1)   float32 (float64 for float64 logits); always <= 0
    ===============  ===========  ===========================================================

    Position ``i`` of the result scores token ``i + 1``: the logits at a position predict the
    *next* token. For a response that starts at column P of ``input_ids``, its log-probs are
    ``out[:, P - 1:]``. Computed as gather-then-logsumexp per row chunk.

    Example (V = 2, uniform logits, then a confident one)::

        >>> logits = torch.tensor([[[0.0, 0.0], [0.0, 2.0], [0.0, 0.0]]])
        >>> token_logprobs(logits, torch.tensor([[0, 1, 1]]))
        tensor([[-0.6931, -0.1269]])
    """
    check_float(logits, "logits", ndim=3)
    if (
        not isinstance(input_ids, Tensor)
        or input_ids.is_floating_point()
        or input_ids.is_complex()
        or input_ids.dtype == torch.bool
    ):
        raise ValueError("input_ids: expected an integer torch.Tensor of shape (B, L)")
    batch, length, vocab = logits.shape
    if tuple(input_ids.shape) != (batch, length):
        raise ValueError(
            f"input_ids: expected shape (B, L) = {(batch, length)} to match logits, "
            f"got {tuple(input_ids.shape)}"
        )
    if length < 1 or vocab < 1:
        raise ValueError(f"logits: expected L >= 1 and V >= 1, got shape {tuple(logits.shape)}")
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
        raise ValueError(
            f"input_ids: expected ids in [0, {vocab}), got [{int(input_ids.min())}, {int(input_ids.max())}]"
        )
    tau = check_real(temperature, "temperature", low=0.0, low_open=True)
    return _token_logprobs(logits, input_ids, tau)


def _token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float) -> Tensor:
    """token_logprobs without validation, except the logsumexp check that costs nothing."""
    dtype = compute_dtype(logits)
    batch, length, vocab = logits.shape
    steps = length - 1
    if steps == 0 or batch == 0:  # nothing to score; an empty result that is still part of the graph
        return logits[:, :steps, 0].to(dtype)
    targets = input_ids[:, 1:].long().unsqueeze(-1)
    rows = []
    for group in _blocks(batch, steps, vocab):
        pieces = []
        for row_slice, step_slice in group:
            block = logits[row_slice, step_slice].to(dtype)  # a view unless upcast
            if temperature != 1.0:
                block = block / temperature
            lse = torch.logsumexp(block, dim=-1)
            _check_logsumexp(lse.reshape(-1), "logits")
            pieces.append(block.gather(-1, targets[row_slice, step_slice]).squeeze(-1) - lse)
        rows.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1))
    return rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)


def entropy(logits: Tensor) -> Tensor:
    r"""Natural-log entropy of ``softmax(logits)`` at every position (spec ENT-1).

    .. math:: H[b, t] = -\sum_v p_v \log p_v = \operatorname{logsumexp}(z) - \sum_v p_v z_v,
              \qquad p = \operatorname{softmax}(z),\ z = \text{logits}[b, t]

    ``logits`` is (B, T, V), any float dtype (half precision is computed in float32); the result
    is (B, T) in nats, in [0, log V]. Divide the logits by the sampling temperature first if the
    entropy of the sampling distribution is wanted. ``-inf`` logits (banned tokens) contribute 0.

    Example::

        >>> entropy(torch.zeros(1, 1, 4))  # uniform over 4 tokens: log 4
        tensor([[1.3863]])
    """
    check_float(logits, "logits", ndim=3)
    batch, steps, vocab = logits.shape
    if vocab < 1:
        raise ValueError(f"logits: expected V >= 1, got shape {tuple(logits.shape)}")
    dtype = compute_dtype(logits)
    flat = logits.reshape(-1, vocab)
    zero = torch.zeros((), dtype=dtype, device=logits.device)
    pieces = []
    for rows in _row_chunks(flat.shape[0], vocab):
        chunk = flat[rows].to(dtype)
        lse = torch.logsumexp(chunk, dim=-1, keepdim=True)
        _check_logsumexp(lse, "logits")
        probs = torch.exp(chunk - lse)
        # A banned token (-inf logit) has p = 0; p * z would be 0 * -inf = NaN, also in backward.
        finite_logits = torch.where(probs > 0, chunk, zero)
        pieces.append(lse.squeeze(-1) - (probs * finite_logits).sum(-1))
    if not pieces:  # no position: an empty result that is still part of the graph
        return logits[..., 0].to(dtype)
    return torch.cat(pieces).view(batch, steps)
