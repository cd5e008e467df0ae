"""``RateLimit``: read from text, checked, and the token bucket's bound over any window."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dopool import ConfigurationError, RateLimit
from dopool._rates import MAX_BURST


@pytest.mark.parametrize(
    ("text", "rate", "per"),
    [
        ("100/s", 100.0, 1.0),
        ("30/m", 30.0, 60.0),
        ("5/10s", 5.0, 10.0),
        ("1000/hours", 1000.0, 3600.0),
        ("2.5/min", 2.5, 60.0),
        (" 7 / 2 h ", 7.0, 7200.0),
        ("1/day", 1.0, 86400.0),
    ],
)
def test_text_names_a_count_per_period(text: str, rate: float, per: float) -> None:
    assert RateLimit.of(text, "rate_limit") == RateLimit(rate=rate, per=per)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("100/ms", "must read '<count>/<unit>'"),  # not minutes: no unit "ms"
        ("100", "must read '<count>/<unit>'"),
        ("fast", "must read '<count>/<unit>'"),
        ("0/s", "rate must be a finite number > 0"),
        ("1/0s", "per must be a finite number > 0"),
        ("10000000/s", "keep that within"),  # tokens closer than a microsecond
        (100, "must be a RateLimit, text such as '100/s', or None"),
        (True, "must be a RateLimit"),
    ],
)
def test_bad_limits_are_refused_by_name(value: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        RateLimit.of(value, "rate_limit")
    assert "rate_limit" in str(caught.value) or "rate limit" in str(caught.value)


@pytest.mark.parametrize(
    "options",
    [
        {"rate": float("nan")},
        {"rate": 1, "per": float("inf")},
        {"rate": 1, "burst": 0},
        {"rate": 1, "burst": 1.5},
        {"rate": 1, "burst": MAX_BURST + 1},
        {"rate": 1, "per": 10**9},  # a year between tokens is the most
    ],
)
def test_a_limit_out_of_range_is_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="rate limit"):
        RateLimit(**options)


def test_a_full_bucket_lets_a_burst_through_then_spaces_the_rest() -> None:
    limit = RateLimit(rate=10, burst=3)
    tat: float | None = None
    admitted = []
    for _ in range(5):
        tat, wait = limit.take(tat, 0.0)
        if wait is None:
            admitted.append(0.0)
    assert admitted == [0.0, 0.0, 0.0]
    refused_tat, next_token = limit.take(tat, 0.0)
    assert refused_tat == tat  # nothing taken
    assert next_token == pytest.approx(0.1)
    assert next_token is not None
    assert limit.take(tat, next_token)[1] is None  # the time it names is the token's
    assert str(limit) == "10/1s, burst 3"


@given(
    rate=st.integers(1, 50),
    burst=st.integers(1, 5),
    times=st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=80),
)
def test_the_starts_it_admits_fit_the_bound_over_every_window(
    rate: int, burst: int, times: list[float]
) -> None:
    """Whatever the order of the clock readings (transactions of several processes), no
    window of W seconds admits more than ``burst + rate * W`` starts."""
    limit = RateLimit(rate=rate, burst=burst)
    tat: float | None = None
    admitted = []
    for now in times:
        tat, wait = limit.take(tat, now)
        if wait is None:
            admitted.append(now)
    admitted.sort()
    for first in range(len(admitted)):
        for last in range(first, len(admitted)):
            window = admitted[last] - admitted[first]
            assert last - first + 1 <= limit.allows(window) + 1e-9
