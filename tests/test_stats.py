"""verl_agentic.stats: the one interval rule and the one quantile rule the result tables use."""

import math
import statistics

import pytest

from verl_agentic.stats import mean_interval, quantile, t_975


def test_mean_interval_is_students_t_at_95_percent():
    values = [0.4, 0.4, 0.0]
    mean, low, high = mean_interval(values)
    half = 4.303 * statistics.stdev(values) / math.sqrt(3)  # t(0.975, df=2) = 4.303
    assert mean == pytest.approx(0.8 / 3)
    assert (low, high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert mean_interval(values, digits=3) == (0.267, round(mean - half, 3), round(mean + half, 3))


def test_mean_interval_says_what_it_cannot_know():
    assert mean_interval([]) == (None, None, None)
    assert mean_interval([2.5]) == (2.5, None, None)
    assert mean_interval([3, 3, 3]) == (3, 3, 3)  # no spread, no width


def test_t_quantiles_narrow_with_more_values_and_never_go_below_the_table():
    table = [t_975(df) for df in range(1, 31)]
    assert table == sorted(table, reverse=True) and table[0] == 12.706 and table[9] == 2.228
    assert t_975(200) == t_975(30) > 1.96  # beyond the table: wider than the normal's, never narrower
    with pytest.raises(ValueError, match="degree of freedom"):
        t_975(0)


@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.5, 0.9, 0.99, 1.0])
def test_quantile_interpolates_as_statistics_inclusive_does(q):
    values = [5.0, 1.0, 4.0, 2.5, 9.0, 7.0, 3.0]
    expected = {0.0: 1.0, 1.0: 9.0}.get(q)
    if expected is None:
        expected = statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]
    assert quantile(values, q) == pytest.approx(expected)


def test_quantile_keeps_observed_values_and_rejects_nonsense():
    assert quantile([], 0.5) is None and quantile([7], 0.9) == 7
    assert quantile([30, 48, 48, 48], 0.9) == 48 and isinstance(quantile([30, 48, 48, 48], 0.9), int)
    assert quantile([27, 28], 0.5) == 27.5
    with pytest.raises(ValueError, match="between 0 and 1"):
        quantile([1, 2], 90)
