"""Summary statistics for the result tables of the runners in ``examples/`` and ``bench/``: one rule each.

- ``mean_interval``: the mean and its two-sided 95% interval, Student's t over the values (seeds, say).
  Fewer than 2 values have no interval (``None``, ``None``); none at all give ``None`` for all three.
- ``quantile``: the ``q`` quantile, interpolated between the two nearest order statistics (the "inclusive"
  rule of :func:`statistics.quantiles`, numpy's default ``linear``); one value is its own quantile.

Standard library only: this module imports nothing of the package, so any layer may use it.
"""

from __future__ import annotations

import math
import statistics

# two-sided 95% quantiles of Student's t, by degrees of freedom; beyond 30 the value at 30 (a slightly wide
# interval, never a narrow one)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042}


def t_975(df: int) -> float:
    if df < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {df}")
    return T_975.get(df, T_975[30])


def mean_interval(values: list[float], digits: int | None = None) -> tuple[float | None, float | None, float | None]:
    """``(mean, low, high)``: the mean and its 95% interval; rounded to ``digits`` when given."""
    if not values:
        return None, None, None
    mean = statistics.mean(values)
    low = high = None
    if len(values) >= 2:
        half = t_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        low, high = mean - half, mean + half
    if digits is not None:
        mean, low, high = (None if x is None else round(x, digits) for x in (mean, low, high))
    return mean, low, high


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0 <= q <= 1) of ``values``, interpolated; ``None`` for no values."""
    if not 0 <= q <= 1:
        raise ValueError(f"a quantile is between 0 and 1, got {q}")
    if len(values) < 2:
        return values[0] if values else None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    low, high = ordered[below], ordered[min(below + 1, len(ordered) - 1)]
    if position == below or low == high:  # no interpolation needed: the value as it was (an int stays an int)
        return low
    return low + (high - low) * (position - below)
