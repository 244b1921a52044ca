"""Intervals and standard errors (popplay.stats)."""
import numpy as np
import pytest

from popplay.stats import mean_and_error, normal_interval, wilson_interval


def test_wilson_interval_known_values_and_edges():
    low, high = wilson_interval(5, 10)
    assert (float(low), float(high)) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson_interval(0, 10)  # no collapse to a point at 0 successes
    assert float(low) == 0.0 and float(high) == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(np.array([10, 3.5]), np.array([10, 7]))
    assert high[0] == 1.0 and low[0] < 1.0 and low[1] < 0.5 < high[1]
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_mean_and_error():
    mean, error = mean_and_error(np.array([1.0, 2.0, 3.0, 4.0]))
    assert mean == 2.5 and error == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)
    assert np.isnan(mean_and_error(np.array([3.0]))[1])
    low, high = normal_interval(2.5, 0.5)
    assert (float(low), float(high)) == pytest.approx((2.5 - 0.98, 2.5 + 0.98), abs=1e-3)
