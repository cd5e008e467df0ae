"""The longest delay: refused in a policy and in an enqueue's ``delay`` or ``not_before``,
clamped in RetryAfter, survived by the clock.

A delay past ``threading.TIMEOUT_MAX`` used to kill the real clock's thread, and with it
every timed alarm of the runtime. The real-clock tests wait on events, never sleep.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import dopool
from cli_support import assert_one_line_error, invoke
from dopool import (
    ConfigurationError,
    EventContext,
    RealClock,
    RetryAfter,
    RetryPolicy,
    Runtime,
    ScheduleError,
    SimulatedClock,
)
from dopool._errors import MAX_DELAY
from dopool._ops.check import check_store

WAIT = 10.0  # wall seconds any single wait may take before the test fails


def test_max_delay_is_a_year_well_below_what_a_thread_can_wait() -> None:
    assert MAX_DELAY == 365 * 24 * 3600
    assert MAX_DELAY < threading.TIMEOUT_MAX / 100


# -- RetryPolicy ---------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"initial_delay": 10**400},
        {"max_delay": 10**400},
        {"multiplier": 10**400},
        {"jitter": 10**400},
        {"initial_delay": -(10**400)},
    ],
    ids=["initial_delay", "max_delay", "multiplier", "jitter", "negative initial_delay"],
)
def test_numbers_too_large_for_a_float_are_configuration_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**options)


@pytest.mark.parametrize(
    "options",
    [
        {"max_delay": MAX_DELAY + 1},
        {"max_delay": 1.7e12},
        {"max_delay": timedelta(days=366)},
        {"initial_delay": MAX_DELAY + 1, "max_delay": MAX_DELAY + 1},
        {"initial_delay": MAX_DELAY * 2},
    ],
    ids=repr,
)
def test_delays_above_the_maximum_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="365 days"):
        RetryPolicy(**options)


def test_the_maximum_itself_is_accepted() -> None:
    policy = RetryPolicy(initial_delay=MAX_DELAY, max_delay=timedelta(days=365), jitter=0)
    assert policy.max_seconds == MAX_DELAY
    assert policy.delay(1, 0.5) == MAX_DELAY


def test_jitter_never_takes_a_delay_past_the_maximum() -> None:
    policy = RetryPolicy(initial_delay=MAX_DELAY, max_delay=MAX_DELAY, jitter=1)
    assert policy.delay(1, 0.999) == MAX_DELAY
    assert policy.delay(1, 0.25) == pytest.approx(MAX_DELAY * 0.5)


# -- RetryAfter ----------------------------------------------------------------


@pytest.mark.parametrize("value", [1.7e12, MAX_DELAY + 0.5, timedelta(days=400), 10**15])
def test_retry_after_is_clamped_to_the_maximum(value: float | timedelta) -> None:
    error = RetryAfter(value)
    assert error.seconds == MAX_DELAY
    assert error.requested > MAX_DELAY
    assert str(error) == f"retry after {MAX_DELAY:g} s (the maximum; {error.requested:g} s asked)"


def test_retry_after_below_the_maximum_is_kept() -> None:
    error = RetryAfter(MAX_DELAY)
    assert error.seconds == error.requested == MAX_DELAY
    assert str(error) == f"retry after {MAX_DELAY:g} s"


def test_retry_after_too_large_for_a_float_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        RetryAfter(10**400)


# -- an enqueue's delay and not_before -----------------------------------------------


#: Due times too far ahead under a clock at 0: a delay over MAX_DELAY, a not_before more
#: than MAX_DELAY after now. ``delay=1e300`` used to be stored, pending for ever.
TOO_FAR = [
    {"delay": 1e300},
    {"delay": MAX_DELAY + 1},
    {"delay": timedelta(days=366)},
    {"not_before": MAX_DELAY + 1.0},
    {"not_before": 1e300},
]


def _assert_too_far(error: ScheduleError, options: dict[str, Any]) -> None:
    """The error names the argument, its value and the limit."""
    ((argument, value),) = options.items()
    assert (error.argument, error.value) == (argument, value)
    assert "MAX_DELAY, 31536000 s (365 days)" in error.reason
    assert str(error).startswith(f"{argument}={value!r} refused: ")


@pytest.mark.parametrize("options", TOO_FAR, ids=repr)
@pytest.mark.parametrize("many", [False, True])
def test_a_due_time_more_than_max_delay_ahead_is_refused_and_stores_nothing(
    sim: Runtime, options: dict[str, Any], many: bool
) -> None:
    pool = sim.define("p", execute=lambda ctx: None)

    def enqueue() -> Any:
        return pool.enqueue_many(["a", "b"], **options) if many else pool.enqueue("a", **options)

    with pytest.raises(ScheduleError) as caught:
        enqueue()
    _assert_too_far(caught.value, options)
    status = pool.status()
    assert (status.enqueued, status.pending, status.scheduled) == (0, 0, 0)
    with sim._store.read() as txn:
        assert check_store(txn).records == 2  # the format, the pool: no event, no meta


@pytest.mark.parametrize("options", TOO_FAR, ids=repr)
def test_a_follow_up_more_than_max_delay_ahead_is_refused_in_the_handler(
    sim: Runtime, options: dict[str, Any]
) -> None:
    caught: list[ScheduleError] = []

    def handler(ctx: EventContext) -> None:
        if ctx.event == "go":
            try:
                ctx.enqueue("child", **options)
            except ScheduleError as exc:
                caught.append(exc)

    pool = sim.define("p", execute=handler)
    pool.enqueue("go")
    assert pool.join(timeout=WAIT)
    assert len(caught) == 1
    _assert_too_far(caught[0], options)
    status = pool.status()
    assert (status.enqueued, status.succeeded, status.scheduled) == (1, 1, 0)


def test_a_follow_up_not_before_counts_from_the_clock_at_the_call(store_path: Path) -> None:
    """Under a clock far from 0, a not_before within a year of now is taken, and one
    more than a year after it refused, wherever 0 is."""
    start = 1e9
    caught: list[ScheduleError] = []

    def handler(ctx: EventContext) -> None:
        if ctx.event == "go":
            ctx.enqueue("at the limit", not_before=start + MAX_DELAY)
            try:
                ctx.enqueue("past it", not_before=start + MAX_DELAY + 1)
            except ScheduleError as exc:
                caught.append(exc)

    with Runtime.simulated(store_path, start=start) as runtime:
        pool = runtime.define("p", execute=handler)
        pool.enqueue("go")
        assert isinstance(runtime.clock, SimulatedClock)
        runtime.clock.advance(0)
        assert [exc.argument for exc in caught] == ["not_before"]
        assert pool.status().scheduled == 1
        assert pool.status().instance(0).next_alarm_at == start + MAX_DELAY


def test_a_due_time_max_delay_ahead_is_accepted(store_path: Path) -> None:
    start = 100.0
    with Runtime.simulated(store_path, start=start) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        pool.enqueue("a", delay=MAX_DELAY)
        pool.enqueue("b", delay=timedelta(days=365))
        pool.enqueue_many(["c"], not_before=start + MAX_DELAY)
        status = pool.status()
        assert (status.enqueued, status.scheduled) == (3, 3)
        assert status.instance(0).next_alarm_at == start + MAX_DELAY


@pytest.mark.threaded
def test_a_producer_refuses_a_due_time_more_than_max_delay_ahead(store_path: Path) -> None:
    with Runtime(store_path) as runtime:
        runtime.define("p", execute=lambda ctx: None)
    with dopool.connect(store_path) as connection:
        producer = connection.pool("p")
        too_far: list[dict[str, Any]] = [
            {"delay": 1e300},
            {"delay": MAX_DELAY + 1},
            {"not_before": time.time() + MAX_DELAY + 3600},
            {"not_before": 1e300},
        ]
        for options in too_far:
            with pytest.raises(ScheduleError) as caught:
                producer.enqueue("a", **options)
            _assert_too_far(caught.value, options)
            with pytest.raises(ScheduleError) as caught:
                producer.enqueue_many(["a", "b"], **options)
            _assert_too_far(caught.value, options)
        assert producer.status().enqueued == 0
        producer.enqueue("at the limit", delay=MAX_DELAY)
        assert (producer.status().enqueued, producer.status().scheduled) == (1, 1)


# -- the real clock --------------------------------------------------------------


class _Target:
    """An alarm slot that records when it fires."""

    def __init__(self, pool: str) -> None:
        self.order = (pool, 0)
        self.fired = threading.Event()

    def fire_alarm(self) -> None:
        self.fired.set()


@pytest.mark.threaded
@pytest.mark.parametrize(
    "far",
    [1e15, math.inf, time.time() + threading.TIMEOUT_MAX * 2],
    ids=["1e15", "inf", "past TIMEOUT_MAX"],
)
def test_a_far_alarm_does_not_stop_the_real_clock(far: float) -> None:
    clock = RealClock()
    try:
        a, b = _Target("a"), _Target("b")
        clock.set_alarm(a, far)
        clock.set_alarm(b, time.time() + 0.05)
        assert b.fired.wait(WAIT)
        clock.set_alarm(b, time.time() + 0.05)  # and again: the thread is still alive
        b.fired.clear()
        assert b.fired.wait(WAIT)
        assert not a.fired.is_set()
    finally:
        clock.close()


@pytest.mark.threaded
def test_a_retry_after_in_milliseconds_leaves_other_pools_retries_alone(tmp_path: Path) -> None:
    """``RetryAfter(1.7e12)`` (a time in ms passed as seconds) waits a year, nothing worse."""

    def far(ctx: EventContext) -> None:
        raise RetryAfter(1.7e12)

    def near(ctx: EventContext) -> None:
        if ctx.attempt == 1:
            raise RetryAfter(0.02)

    policy = RetryPolicy(max_attempts=2, initial_delay=0.01, jitter=0)
    with Runtime(tmp_path / "store") as runtime:
        slow = runtime.define("slow", execute=far, retry=policy)
        fast = runtime.define("fast", execute=near, retry=policy)
        before = time.time()
        slow.enqueue("x")
        assert not slow.join(timeout=0.2)  # its first attempt ran; the retry waits a year
        instance = slow.status().instance(0)
        assert instance.state == "backoff"
        assert instance.next_alarm_at is not None
        assert before + MAX_DELAY <= instance.next_alarm_at <= time.time() + MAX_DELAY
        fast.enqueue("y")
        assert fast.join(timeout=WAIT)
        assert fast.status().succeeded == 1


@pytest.mark.threaded
def test_a_far_alarm_in_an_old_store_leaves_the_real_clock_working(tmp_path: Path) -> None:
    """A store written before the limit may hold any retry time; reopening it is safe."""
    path = tmp_path / "store"

    def fail_once(ctx: EventContext) -> None:
        if ctx.attempt == 1:
            raise RetryAfter(10)

    def fail_briefly(ctx: EventContext) -> None:
        if ctx.attempt == 1:
            raise RetryAfter(0.02)

    policy = RetryPolicy(max_attempts=2, initial_delay=0.01, jitter=0)
    with Runtime.simulated(path, start=1e15) as runtime:  # the retry is stored at 1e15 + 10
        pool = runtime.define("old", execute=fail_once, retry=policy)
        pool.enqueue("x")
        assert isinstance(runtime.clock, SimulatedClock)
        runtime.clock.advance(0)
        assert pool.status().instance(0).next_alarm_at == 1e15 + 10
    with Runtime(path) as runtime:
        old = runtime.define("old", execute=fail_once, retry=policy)
        fresh = runtime.define("fresh", execute=fail_briefly, retry=policy)
        fresh.enqueue("y")
        assert fresh.join(timeout=WAIT)
        assert fresh.status().succeeded == 1
        assert old.status().instance(0).state == "backoff"


@pytest.mark.parametrize("field", ["initial_delay", "max_delay"])
def test_a_scenario_delay_past_a_year_is_a_usage_error_naming_its_field(
    tmp_path: Path, field: str
) -> None:
    """The engine's bound, checked with the scenario's other fields: exit 2, not 1."""
    scenario = tmp_path / "s.toml"
    delays = {"initial_delay": 1.0, "max_delay": 60.0} | {field: MAX_DELAY * 2}
    scenario.write_text(
        'name = "s"\n[arrivals]\nrate = 1.0\ntotal = 5\n[retry]\n'
        + "".join(f"{name} = {value!r}\n" for name, value in delays.items()),
        encoding="utf-8",
    )
    result = invoke("simulate", "-s", str(scenario), "-q")
    assert_one_line_error(result, 2, f"retry.{field}", "3.1536e+07")
