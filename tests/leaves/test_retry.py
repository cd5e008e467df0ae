"""RetryPolicy validation and delays, and the seeded uniform draws behind jitter."""

from __future__ import annotations

import dataclasses
import itertools
import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dopool import ConfigurationError, PermanentError, RetryAfter, RetryPolicy
from dopool._errors import MAX_DELAY
from dopool._retry import next_delay, uniform_draw

# -- construction ------------------------------------------------------------


def test_defaults_match_the_spec() -> None:
    policy = RetryPolicy()
    assert policy.max_attempts == 3
    assert policy.initial_delay == 1.0
    assert policy.multiplier == 2.0
    assert policy.max_delay == 300.0
    assert policy.jitter == 0.1


def test_timedeltas_are_normalised_to_float_seconds() -> None:
    policy = RetryPolicy(initial_delay=timedelta(milliseconds=1500), max_delay=timedelta(minutes=2))
    assert policy.initial_delay == 1.5
    assert policy.max_delay == 120.0
    assert type(policy.initial_delay) is float
    assert type(policy.max_delay) is float
    assert policy == RetryPolicy(initial_delay=1.5, max_delay=120)


def test_ints_are_normalised_to_floats() -> None:
    policy = RetryPolicy(initial_delay=2, multiplier=3, max_delay=10, jitter=0)
    assert [type(v) for v in (policy.initial_delay, policy.multiplier, policy.max_delay)] == [
        float,
        float,
        float,
    ]
    assert type(policy.jitter) is float


def test_boundary_values_are_accepted() -> None:
    policy = RetryPolicy(max_attempts=1, initial_delay=0, multiplier=1, max_delay=0, jitter=0)
    assert policy.delay(1, 0.5) == 0.0
    assert RetryPolicy(jitter=1).jitter == 1.0
    assert RetryPolicy(initial_delay=5, max_delay=5).max_delay == 5.0


def test_is_frozen_and_keyword_only() -> None:
    policy = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_attempts = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        RetryPolicy(5)  # type: ignore[call-arg]


def test_repr_shows_the_fields() -> None:
    assert repr(RetryPolicy(max_attempts=7)).startswith("RetryPolicy(max_attempts=7, ")


INVALID: list[tuple[str, Any]] = [
    ("max_attempts", 0),
    ("max_attempts", -1),
    ("max_attempts", True),
    ("max_attempts", 2.0),
    ("max_attempts", "3"),
    ("max_attempts", None),
    ("initial_delay", -0.001),
    ("initial_delay", timedelta(seconds=-1)),
    ("initial_delay", math.nan),
    ("initial_delay", math.inf),
    ("multiplier", 0.99),
    ("multiplier", 0),
    ("multiplier", math.nan),
    ("multiplier", math.inf),
    ("multiplier", "2"),
    ("multiplier", True),
    ("multiplier", None),
    ("max_delay", 0.5),  # below the default initial_delay of 1.0
    ("max_delay", timedelta(milliseconds=999)),
    ("max_delay", math.nan),
    ("max_delay", math.inf),
    ("jitter", -0.01),
    ("jitter", 1.01),
    ("jitter", math.nan),
    ("jitter", math.inf),
    ("jitter", "0.1"),
    ("jitter", False),
    ("jitter", None),
]


@pytest.mark.parametrize(("field", "value"), INVALID, ids=repr)
def test_invalid_values_raise_configuration_error_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=field):
        RetryPolicy(**{field: value})


NON_NUMERIC_DURATIONS: list[tuple[str, Any]] = [
    ("initial_delay", "1"),
    ("initial_delay", None),
    ("initial_delay", True),
    ("max_delay", "300"),
    ("max_delay", None),
]


@pytest.mark.parametrize(("field", "value"), NON_NUMERIC_DURATIONS, ids=repr)
def test_non_numeric_durations_raise_configuration_error(field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**{field: value})


@pytest.mark.parametrize(("field", "value"), [("initial_delay", "1"), ("max_delay", None)])
def test_non_numeric_durations_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=field):
        RetryPolicy(**{field: value})


# -- delay -------------------------------------------------------------------


def test_delay_without_jitter_is_exponential_then_capped() -> None:
    policy = RetryPolicy(initial_delay=1, multiplier=2, max_delay=10, jitter=0)
    assert [policy.delay(k, 0.5) for k in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_multiplier_one_gives_a_constant_delay() -> None:
    policy = RetryPolicy(initial_delay=3, multiplier=1, max_delay=100, jitter=0)
    assert {policy.delay(k, 0.9) for k in range(1, 50)} == {3.0}


def test_jitter_scales_the_base_delay_by_the_draw() -> None:
    policy = RetryPolicy(initial_delay=10, multiplier=2, max_delay=1000, jitter=0.5)
    # attempt 2: base 20, factor within [0.5, 1.5]
    assert policy.delay(2, 0.0) == pytest.approx(10.0)
    assert policy.delay(2, 0.5) == pytest.approx(20.0)
    assert policy.delay(2, 0.25) == pytest.approx(15.0)
    assert policy.delay(2, math.nextafter(1.0, 0.0)) == pytest.approx(30.0)


def test_jitter_applies_to_the_capped_delay() -> None:
    policy = RetryPolicy(initial_delay=1, multiplier=10, max_delay=50, jitter=0.2)
    assert policy.delay(5, 0.0) == pytest.approx(40.0)
    assert policy.delay(5, 0.5) == pytest.approx(50.0)
    assert policy.delay(5, 0.99999) == pytest.approx(60.0, rel=1e-4)


def test_full_jitter_can_reach_zero_but_never_below() -> None:
    policy = RetryPolicy(initial_delay=4, max_delay=4, jitter=1)
    assert policy.delay(1, 0.0) == 0.0
    assert policy.delay(1, 0.5) == 4.0


@pytest.mark.parametrize("attempt", [1_100, 10**6, 10**400])
def test_huge_attempt_numbers_do_not_overflow(attempt: int) -> None:
    policy = RetryPolicy(initial_delay=1, multiplier=2, max_delay=300, jitter=0.1)
    assert policy.delay(attempt, 0.5) == pytest.approx(300.0)
    assert policy.delay(attempt, 0.0) == pytest.approx(270.0)


def test_huge_multiplier_stays_capped() -> None:
    policy = RetryPolicy(initial_delay=1e-300, multiplier=1e300, max_delay=7, jitter=0)
    assert policy.delay(500, 0.5) == 7.0


@st.composite
def policies(draw: st.DrawFn) -> RetryPolicy:
    initial = draw(st.floats(0, 1e6))
    maximum = draw(st.floats(initial, MAX_DELAY))
    return RetryPolicy(
        max_attempts=draw(st.integers(1, 100)),
        initial_delay=initial,
        multiplier=draw(st.floats(1, 1000)),
        max_delay=maximum,
        jitter=draw(st.floats(0, 1)),
    )


@given(
    policy=policies(),
    attempt=st.integers(1, 10_000),
    draw=st.floats(0, 1, exclude_max=True),
)
def test_delay_is_within_the_jittered_bounds(
    policy: RetryPolicy, attempt: int, draw: float
) -> None:
    try:
        base = min(policy.initial_seconds * policy.multiplier ** (attempt - 1), policy.max_seconds)
    except OverflowError:
        base = policy.max_seconds
    delay = policy.delay(attempt, draw)
    assert math.isfinite(delay)
    assert delay >= 0.0
    low, high = base * (1 - policy.jitter), min(base * (1 + policy.jitter), MAX_DELAY)
    assert low * (1 - 1e-12) <= delay <= high * (1 + 1e-12)
    assert delay <= policy.max_seconds * (1 + policy.jitter) * (1 + 1e-12)
    assert delay <= MAX_DELAY


@given(policy=policies(), draw=st.floats(0, 1, exclude_max=True))
def test_delay_never_decreases_with_the_attempt(policy: RetryPolicy, draw: float) -> None:
    delays = [policy.delay(k, draw) for k in range(1, 40)]
    assert all(a <= b * (1 + 1e-12) for a, b in itertools.pairwise(delays))


# -- uniform_draw ------------------------------------------------------------


def test_uniform_draw_is_pinned() -> None:
    # BLAKE2b of the identifiers' text: the same on every process, platform and version.
    assert uniform_draw(0, "pool", 1, 2, 3) == 0.9853865993465856
    assert uniform_draw("seed", "p", 0, 0, 1) == 0.7007473691466464


def test_uniform_draw_is_deterministic() -> None:
    assert uniform_draw(42, "orders", 3, 17, 2) == uniform_draw(42, "orders", 3, 17, 2)


def test_uniform_draw_differs_with_any_part() -> None:
    base = uniform_draw(1, "p", 0, 5, 1)
    assert uniform_draw(2, "p", 0, 5, 1) != base
    assert uniform_draw(1, "q", 0, 5, 1) != base
    assert uniform_draw(1, "p", 1, 5, 1) != base
    assert uniform_draw(1, "p", 0, 6, 1) != base
    assert uniform_draw(1, "p", 0, 5, 2) != base
    draws = {uniform_draw(7, "pool", 0, seq, 1) for seq in range(2_000)}
    assert len(draws) == 2_000


def test_uniform_draw_is_roughly_uniform() -> None:
    draws = [uniform_draw(3, "pool", 0, seq) for seq in range(10_000)]
    assert abs(sum(draws) / len(draws) - 0.5) < 0.02
    quarters = [sum(1 for d in draws if q / 4 <= d < (q + 1) / 4) for q in range(4)]
    assert all(2_250 < n < 2_750 for n in quarters), quarters


@given(
    seed=st.one_of(st.none(), st.integers(), st.text(st.characters(codec="utf-8"))),
    parts=st.lists(st.one_of(st.integers(), st.text(st.characters(codec="utf-8"))), max_size=5),
)
def test_uniform_draw_is_in_the_unit_interval(seed: int | str | None, parts: list[object]) -> None:
    value = uniform_draw(seed, *parts)
    assert 0.0 <= value < 1.0


def test_next_delay_after_a_failure() -> None:
    """None when no attempt is left; a RetryAfter's own delay; else the policy's, whose
    jitter is drawn only then."""
    policy = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)
    draws: list[int] = []

    def draw() -> float:
        draws.append(1)
        return 0.5

    assert next_delay(ValueError(), 1, 3, policy, draw) == 1.0
    assert next_delay(ValueError(), 2, 3, policy, draw) == 2.0
    assert next_delay(ValueError(), 3, 3, policy, draw) is None  # the last one failed
    assert next_delay(PermanentError("no"), 1, 3, policy, draw) is None
    assert next_delay(RetryAfter(7.5), 1, 3, policy, draw) == 7.5
    assert next_delay(RetryAfter(7.5), 3, 3, policy, draw) is None
    assert len(draws) == 2


class _SkippedInit(RetryAfter):
    def __init__(self) -> None:  # no super().__init__: no ``seconds`` at all
        pass


class _Raising(RetryAfter):
    @property
    def seconds(self) -> float:
        raise SystemExit("from seconds")

    @seconds.setter
    def seconds(self, _value: float) -> None:
        pass

    def __init__(self) -> None:
        Exception.__init__(self, "raising")


def _set(seconds: object) -> RetryAfter:
    failure = RetryAfter(7.5)
    failure.seconds = seconds  # type: ignore[assignment]  # handler code may do anything
    return failure


@pytest.mark.parametrize(
    ("failure", "delay"),
    [
        (_set(math.inf), MAX_DELAY),
        (_set(-5.0), 0.0),
        (_set(10**400), MAX_DELAY),
        (_set(math.nan), 1.0),
        (_set("soon"), 1.0),
        (_set(True), 1.0),
        (_SkippedInit(), 1.0),
        (_Raising(), 1.0),
    ],
    ids=["inf", "negative", "huge-int", "nan", "str", "bool", "skipped-init", "raising"],
)
def test_a_retry_after_that_handler_code_broke_waits_a_delay_the_store_takes(
    failure: RetryAfter, delay: float
) -> None:
    """An infinite delay was written into the meta record, which then failed its checks:
    the pool was refused. A delay that is no number crashed the instance at every attempt.
    Now out-of-range delays are clamped and the others wait the policy's delay."""
    policy = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)
    assert next_delay(failure, 1, 3, policy, lambda: 0.5) == delay


class _Broken(RetryPolicy):
    """A policy subclass whose delay() is the user's, and broken."""

    def delay(self, attempt: int, u: float) -> float:
        value: Any = {1: math.inf, 2: math.nan, 3: "soon"}.get(attempt)
        if value is None:
            raise SystemExit("from delay")
        return value  # type: ignore[no-any-return]


@pytest.mark.parametrize(("attempt", "delay"), [(1, MAX_DELAY), (2, 8.0), (3, 16.0), (4, 32.0)])
def test_a_policy_subclass_whose_delay_breaks_waits_a_delay_the_store_takes(
    attempt: int, delay: float
) -> None:
    """An infinite delay made the meta record unreadable; one that was no number or raised
    crashed every recovery of the instance, its event stuck. A number is clamped; the rest
    wait RetryPolicy's own formula."""
    policy = _Broken(max_attempts=9, initial_delay=4.0, jitter=0.0)
    assert next_delay(ValueError(), attempt, 9, policy, lambda: 0.5) == delay
