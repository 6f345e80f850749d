"""The one quantile the benchmarks quote: nearest rank over the sorted values."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank; `values` must not be empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
