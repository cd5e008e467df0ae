"""Delayed events under the real clock: none runs before its due time, and how late they run.

The clock's scheduler thread fires an alarm at or after its time; nothing here asserts
how soon after. ``test_lateness_under_light_load`` prints what it measured (run it with
``-s`` to see it): the delay between each event's due time and its handler's start.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dopool import EventContext, RealClock, Runtime, ScheduleError

pytestmark = pytest.mark.threaded

EVENTS = 50
DELAYS = (0.05, 0.2)  # seconds, drawn uniformly for each event


def test_a_delayed_event_never_runs_before_its_due_time(tmp_path: Path) -> None:
    started: dict[str, tuple[float, float]] = {}
    done = threading.Event()

    def handler(ctx: EventContext) -> None:
        started[ctx.event] = (ctx.started_at, time.time())
        if len(started) == 4:
            done.set()

    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=handler)
        before = time.time()
        pool.enqueue("delay", delay=0.15)
        pool.enqueue("timedelta", delay=timedelta(milliseconds=100))
        at = datetime.now(UTC) + timedelta(milliseconds=120)
        pool.enqueue("datetime", not_before=at)
        pool.enqueue("now")
        assert pool.status().scheduled == 3
        assert done.wait(timeout=10)
        assert pool.join(timeout=10)
    due = {
        "delay": before + 0.15,
        "timedelta": before + 0.1,
        "datetime": at.timestamp(),
        "now": before,
    }
    for name, (started_at, entered) in started.items():
        assert started_at >= due[name], name
        assert entered >= started_at, name
    assert min(started, key=lambda name: started[name][0]) == "now"


def test_a_naive_datetime_is_refused_under_the_real_clock(tmp_path: Path) -> None:
    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        with pytest.raises(ScheduleError, match="naive datetime"):
            pool.enqueue("x", not_before=datetime.now() + timedelta(seconds=1))
        assert pool.status().enqueued == 0


class SteppingClock(RealClock):
    """A real clock whose time a test may set: as a wall clock that steps back (NTP)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None

    def now(self) -> float:
        return time.time() if self.at is None else self.at


def test_events_due_at_once_keep_their_order_when_the_clock_steps_back(tmp_path: Path) -> None:
    ran: list[str] = []
    clock = SteppingClock()
    with Runtime(tmp_path / "store", clock=clock) as runtime:
        pool = runtime.define("p", execute=lambda ctx: ran.append(ctx.event))
        pool.pause()
        clock.at = time.time() + 3600.0
        first = pool.enqueue("first")
        clock.at = time.time() - 3600.0  # two hours back
        second = pool.enqueue("second")
        assert (first.position, second.position) == (0, 1)
        clock.at = None
        pool.resume()
        assert pool.join(timeout=10)
    assert ran == ["first", "second"]


def test_lateness_under_light_load(tmp_path: Path) -> None:
    """50 events, 50-200 ms ahead, over two instances: none early; lateness printed."""
    draws = random.Random(16)
    entered: dict[int, float] = {}
    done = threading.Event()

    def handler(ctx: EventContext) -> None:
        entered[ctx.event["n"]] = time.time()
        if len(entered) == EVENTS:
            done.set()

    due: dict[int, float] = {}
    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=handler, concurrency=2)
        for n in range(EVENTS):
            due[n] = time.time() + draws.uniform(*DELAYS)
            pool.enqueue({"n": n}, not_before=due[n])
        assert done.wait(timeout=30)
        assert pool.join(timeout=10)
    late = sorted((entered[n] - due[n]) * 1000 for n in range(EVENTS))
    assert late[0] >= 0, "an event ran before its due time"
    p99 = late[min(len(late) - 1, round(0.99 * (len(late) - 1)))]
    print(
        f"\nlateness of {EVENTS} delayed events (ms): min {late[0]:.2f}, "
        f"p50 {statistics.median(late):.2f}, p99 {p99:.2f}, max {late[-1]:.2f}"
    )
