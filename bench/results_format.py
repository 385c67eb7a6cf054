"""The number formats every section of ``bench/RESULTS.md`` shares: MiB, quantiles and the
met/missed cell of a target."""

from __future__ import annotations

__all__ = ["met", "mib", "quantile"]


def mib(value: float | None) -> str:
    """Bytes in MiB, rounded (``n/a`` for None).

    >>> mib(3 * 2**20), mib(None)
    ('3 MiB', 'n/a')
    """
    return "n/a" if value is None else f"{value / 2**20:.0f} MiB"


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, linear between the two nearest ranks.

    >>> quantile([4.0, 1.0, 2.0, 3.0], 0.25)
    1.75
    """
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def met(ok: bool | None) -> str:
    """A target's cell: ``met``, ``**missed**`` or ``n/a`` (not measured)."""
    return "n/a" if ok is None else ("met" if ok else "**missed**")
