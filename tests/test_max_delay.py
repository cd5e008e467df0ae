"""The longest retry delay: refused in a policy, clamped in RetryAfter, survived by the clock.

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

from cli_support import assert_one_line_error, invoke
from dopool import (
    ConfigurationError,
    EventContext,
    RealClock,
    RetryAfter,
    RetryPolicy,
    Runtime,
    SimulatedClock,
)
from dopool._errors import MAX_DELAY

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
        instance = slow.status().instances[0]
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
        assert pool.status().instances[0].next_alarm_at == 1e15 + 10
    with Runtime(path) as runtime:
        old = runtime.define("old", execute=fail_once, retry=policy)
        fresh = runtime.define("fresh", execute=fail_briefly, retry=policy)
        fresh.enqueue("y")
        assert fresh.join(timeout=WAIT)
        assert fresh.status().succeeded == 1
        assert old.status().instances[0].state == "backoff"


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
