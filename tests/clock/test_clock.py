"""Clocks without a runtime: fake alarm targets record when and where they fire."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dopool import RealClock, Runtime, SimulatedClock
from dopool._clock.clocks import Clock
from dopool._clock.quiescence import Activity

WAIT = 10.0  # wall seconds: a generous bound that only a broken clock reaches


class FakeTarget:
    """An alarm target that records ``(now, pool, index)`` each time it fires."""

    def __init__(
        self,
        clock: Clock,
        fired: list[tuple[float, str, int]],
        index: int,
        pool: str = "p",
        on_fire: Callable[[FakeTarget], None] | None = None,
    ) -> None:
        self.clock = clock
        self.fired = fired
        self.order = (pool, index)
        self.on_fire = on_fire
        self.threads: list[threading.Thread] = []

    def fire_alarm(self) -> None:
        self.fired.append((self.clock.now(), *self.order))
        self.threads.append(threading.current_thread())
        if self.on_fire is not None:
            self.on_fire(self)


# -- SimulatedClock ----------------------------------------------------------------


@pytest.fixture
def clock() -> Iterator[SimulatedClock]:
    clock = SimulatedClock()
    yield clock
    clock.close()


@pytest.fixture
def fired() -> list[tuple[float, str, int]]:
    return []


def test_starts_at_the_given_time() -> None:
    assert SimulatedClock().now() == 0.0
    assert SimulatedClock(start=100.5).now() == 100.5
    with pytest.raises(ValueError, match="finite"):
        SimulatedClock(start=math.nan)


def test_nothing_fires_until_driven(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    target = FakeTarget(clock, fired, 0)
    clock.set_alarm(target, 0.0)  # due now
    clock.set_alarm(FakeTarget(clock, fired, 1), -5.0)  # overdue
    assert fired == []
    assert clock.now() == 0.0
    assert clock.next_time() == 0.0
    clock.advance(0)
    assert fired == [(0.0, "p", 0), (0.0, "p", 1)]
    assert not clock.pending()


def test_fires_on_the_driving_thread(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    target = FakeTarget(clock, fired, 0)
    clock.set_alarm(target, 1.0)
    clock.run_until_idle()
    assert target.threads == [threading.current_thread()]


def test_fires_in_order_of_time_then_pool_then_index(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    for pool, index, at in [
        ("b", 0, 5.0),
        ("a", 2, 5.0),
        ("a", 1, 5.0),
        ("z", 9, 3.0),
        ("a", 0, 7.0),
    ]:
        clock.set_alarm(FakeTarget(clock, fired, index, pool), at)
    clock.run_until_idle()
    assert fired == [(3.0, "z", 9), (5.0, "a", 1), (5.0, "a", 2), (5.0, "b", 0), (7.0, "a", 0)]


def test_set_alarm_replaces_the_previous_time(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    target = FakeTarget(clock, fired, 0)
    clock.set_alarm(target, 5.0)
    clock.set_alarm(target, 8.0)
    assert clock.next_time() == 8.0
    clock.set_alarm(target, 2.0)  # earlier also replaces
    clock.run_until_idle()
    assert fired == [(2.0, "p", 0)]


def test_set_alarm_none_clears_it(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    target = FakeTarget(clock, fired, 0)
    clock.set_alarm(target, 5.0)
    clock.set_alarm(target, None)
    assert clock.next_time() is None
    clock.advance(100)
    assert fired == []
    assert clock.now() == 100.0


def test_each_target_has_its_own_slot(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    first, second = FakeTarget(clock, fired, 0), FakeTarget(clock, fired, 1)
    clock.set_alarm(first, 4.0)
    clock.set_alarm(second, 4.0)
    clock.set_alarm(first, None)
    clock.run_until_idle()
    assert fired == [(4.0, "p", 1)]


def test_advance_fires_what_is_due_and_stands_at_the_target(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    clock.set_alarm(FakeTarget(clock, fired, 0), 3.0)
    clock.set_alarm(FakeTarget(clock, fired, 1), 10.0)
    clock.set_alarm(FakeTarget(clock, fired, 2), 10.5)
    clock.advance(10)
    assert fired == [(3.0, "p", 0), (10.0, "p", 1)]
    assert clock.now() == 10.0
    clock.advance(0.25)
    assert clock.now() == 10.25
    assert len(fired) == 2
    clock.advance(0.25)
    assert fired[-1] == (10.5, "p", 2)
    assert clock.now() == 10.5


def test_advance_follows_alarms_set_while_firing(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    def rearm(target: FakeTarget) -> None:
        clock.set_alarm(target, clock.now() + 1.0)

    clock.set_alarm(FakeTarget(clock, fired, 0, on_fire=rearm), 1.0)
    clock.advance(3.5)
    assert [at for at, _, _ in fired] == [1.0, 2.0, 3.0]
    assert clock.now() == 3.5
    assert clock.next_time() == 4.0


def test_advance_rejects_a_negative_time(clock: SimulatedClock) -> None:
    with pytest.raises(ValueError, match="negative"):
        clock.advance(-1)
    assert clock.now() == 0.0


def test_run_until_takes_an_absolute_time(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    clock.advance(5)
    clock.set_alarm(FakeTarget(clock, fired, 0), 7.0)
    clock.set_alarm(FakeTarget(clock, fired, 1), 12.0)
    clock.run_until(8.0)
    assert fired == [(7.0, "p", 0)]
    assert clock.now() == 8.0
    clock.run_until(2.0)  # in the past: time never goes back
    assert clock.now() == 8.0


def test_run_until_idle_stops_at_the_last_fired_time(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    clock.set_alarm(FakeTarget(clock, fired, 0), 2.0)
    clock.set_alarm(FakeTarget(clock, fired, 1), 30.0)
    clock.run_until_idle()
    assert fired == [(2.0, "p", 0), (30.0, "p", 1)]
    assert clock.now() == 30.0
    clock.run_until_idle()  # nothing left: time stays
    assert clock.now() == 30.0


def test_run_until_idle_respects_max_time(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    clock.set_alarm(FakeTarget(clock, fired, 0), 2.0)
    clock.set_alarm(FakeTarget(clock, fired, 1), 4.0)
    clock.set_alarm(FakeTarget(clock, fired, 2), 9.0)
    clock.run_until_idle(max_time=4.0)
    assert fired == [(2.0, "p", 0), (4.0, "p", 1)]
    assert clock.now() == 4.0
    clock.run_until_idle(max_time=8.0)
    assert len(fired) == 2
    assert clock.now() == 4.0  # nothing fired, so it does not jump to max_time
    assert clock.next_time() == 9.0


def test_alarms_in_the_past_fire_at_the_current_time(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    clock.advance(10)
    clock.set_alarm(FakeTarget(clock, fired, 1), 3.0)
    clock.set_alarm(FakeTarget(clock, fired, 0), 10.0)
    clock.run_until_idle()
    assert fired == [(10.0, "p", 0), (10.0, "p", 1)]
    assert clock.now() == 10.0


def test_deliver_runs_only_when_driven(clock: SimulatedClock) -> None:
    ran: list[tuple[float, str]] = []
    clock.advance(1)
    clock.deliver(("q", 1), lambda: ran.append((clock.now(), "q1")))
    clock.deliver(("p", 0), lambda: ran.append((clock.now(), "p0")))
    clock.deliver(("q", 1), lambda: ran.append((clock.now(), "q1 again")))
    assert ran == []
    assert clock.pending()
    clock.advance(0)
    assert ran == [(1.0, "p0"), (1.0, "q1"), (1.0, "q1 again")]


def test_deliveries_and_alarms_share_one_order(
    clock: SimulatedClock, fired: list[tuple[float, str, int]]
) -> None:
    clock.set_alarm(FakeTarget(clock, fired, 2), 0.0)
    clock.deliver(("p", 1), lambda: fired.append((clock.now(), "delivery", 1)))
    clock.set_alarm(FakeTarget(clock, fired, 0), 0.0)
    clock.run_until_idle()
    assert fired == [(0.0, "p", 0), (0.0, "delivery", 1), (0.0, "p", 2)]


def test_sleep_blocks_a_handler_until_virtual_time_reaches_it() -> None:
    """On a handler's own thread (tests/clock/test_green.py: the same on one thread)."""
    clock = SimulatedClock(backend="threads")
    woke: list[float] = []
    clock.advance(1)
    clock.activity.sent("worker")

    def handler() -> None:
        try:
            clock.sleep(5, "worker")
            woke.append(clock.now())
        finally:
            clock.activity.done("worker")

    thread = threading.Thread(target=handler)
    thread.start()
    # The driver waits for the handler to fall asleep, then jumps to its wake-up and
    # waits again until the handler has finished.
    clock.step(deadline=time.monotonic() + WAIT)
    thread.join(WAIT)
    assert not thread.is_alive()
    assert woke == [6.0]
    assert clock.now() == 6.0


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
def test_a_call_at_callback_may_not_drive_the_clock(backend: str) -> None:
    """It runs on the driving thread: under threads, driving again waited for itself."""
    clock = SimulatedClock(backend=backend)
    caught: list[BaseException] = []

    def drive_again() -> None:
        try:
            clock.advance(1)
        except RuntimeError as exc:
            caught.append(exc)

    clock.call_at(1, drive_again)
    clock.call_at(2, drive_again)
    clock.run_until(5)
    assert [str(exc).split(":")[0] for exc in caught] == [
        "the simulated clock cannot be driven from a handler, hook, subscriber or call_at callback"
    ] * 2
    assert clock.now() == 5.0
    clock.close()


def test_a_clock_never_moves_to_a_time_that_is_not_finite(clock: SimulatedClock) -> None:
    """run_until(inf) left the clock at infinity, and the next write stored it: the
    instance's meta record then failed its checks, and the pool was refused for good."""
    drives: list[Callable[[], None]] = [
        lambda: clock.run_until(math.inf),
        lambda: clock.advance(math.inf),
        lambda: clock.run_until(math.nan),
        lambda: clock.advance(math.nan),
        lambda: clock.run_until_idle(max_time=math.nan),
    ]
    for drive in drives:
        with pytest.raises(ValueError, match=r"cannot run until|max_time is NaN"):
            drive()
    assert clock.now() == 0.0
    clock.run_until_idle(max_time=math.inf)  # no limit: as None


def test_a_pool_survives_an_attempt_to_run_its_clock_to_infinity(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        with pytest.raises(ValueError, match="cannot run until inf"):
            runtime.clock.advance(math.inf)  # type: ignore[attr-defined]
        pool.enqueue("x")
        assert pool.join(timeout=WAIT)
        assert pool.status().succeeded == 1


def test_step_times_out_while_an_actor_stays_busy(clock: SimulatedClock) -> None:
    clock.activity.sent("stuck")
    with pytest.raises(TimeoutError):
        clock.step(deadline=time.monotonic() + 0.05)
    clock.activity.done("stuck")
    assert clock.step() is False


# -- Activity --------------------------------------------------------------------


def test_activity_is_quiet_when_nothing_was_sent() -> None:
    activity = Activity()
    assert activity.wait_quiet(0)
    assert not activity.busy({"a"})


def test_activity_counts_messages_per_actor() -> None:
    activity = Activity()
    activity.sent("a")
    activity.sent("a")
    activity.sent("b")
    assert activity.busy({"a"})
    assert not activity.busy({"c"})
    assert not activity.wait_quiet(0.01)
    activity.done("a")
    activity.done("b")
    assert activity.busy({"a", "b"})
    assert not activity.busy({"b"})
    assert not activity.wait_quiet(0.01)
    activity.done("a")
    assert activity.wait_quiet(0)
    assert not activity.busy({"a", "b"})


def test_activity_answers_alike_whichever_side_it_looks_through() -> None:
    """Many keys and few busy actors, or few keys and many busy actors: the same answer."""
    activity = Activity()
    for key in ("a", "b", "c"):
        activity.sent(key)
    many = {f"k{i}" for i in range(100)}
    assert not activity.busy(many)  # looks through the 3 busy actors
    assert activity.busy(many | {"b"})
    assert activity.busy({"c"})  # looks through the 1 key
    assert not activity.busy({"z"})
    assert not activity.busy(set())


def test_activity_counts_several_messages_finished_at_once() -> None:
    activity = Activity()
    for _ in range(3):
        activity.sent("a")
    generation = activity.generation
    activity.done("a", 2)  # an actor taking two waiting messages into the one in hand
    assert activity.busy({"a"})
    assert activity.generation == generation
    activity.done("a")
    assert not activity.busy({"a"})
    assert activity.wait_quiet(0)
    assert activity.generation == generation + 1


def test_a_sleeping_actor_is_busy_but_not_active() -> None:
    activity = Activity()
    activity.sent("a")
    activity.sleep_begin("a")
    assert activity.wait_quiet(0)
    assert activity.busy({"a"})
    activity.sent("a")  # a message queued behind the sleeper keeps it inactive
    assert activity.wait_quiet(0)
    activity.sleep_end("a")
    assert not activity.wait_quiet(0.01)
    activity.done("a")
    activity.done("a")
    assert activity.wait_quiet(0)


def test_an_actor_going_idle_bumps_the_generation_and_wakes_waiters() -> None:
    activity = Activity()
    activity.sent("a")
    activity.sent("a")
    generation = activity.generation
    activity.done("a")  # "a" is still busy: nothing a waiter looks for has changed
    assert activity.generation == generation
    assert not activity.wait_change(generation, 0.01)
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(activity.wait_quiet(WAIT)))
    waiter.start()
    activity.done("a")
    waiter.join(WAIT)
    assert results == [True]
    assert activity.generation == generation + 1
    assert activity.wait_change(generation, 0)


# -- RealClock -------------------------------------------------------------------


class EventTarget(FakeTarget):
    """A fake target that also sets a ``threading.Event`` when it fires."""

    def __init__(self, clock: Clock, fired: list[tuple[float, str, int]], index: int) -> None:
        super().__init__(clock, fired, index)
        self.event = threading.Event()

    def fire_alarm(self) -> None:
        super().fire_alarm()
        self.event.set()


@pytest.fixture
def real() -> Iterator[RealClock]:
    clock = RealClock()
    yield clock
    clock.close()


def test_real_clock_reads_wall_time(real: RealClock) -> None:
    before = time.time()
    now = real.now()
    assert before <= now <= time.time()


def test_real_alarm_fires_on_the_scheduler_thread(
    real: RealClock, fired: list[tuple[float, str, int]]
) -> None:
    target = EventTarget(real, fired, 0)
    at = real.now() + 0.05
    real.set_alarm(target, at)
    assert fired == []
    assert target.event.wait(WAIT)
    assert len(fired) == 1
    assert fired[0][0] >= at
    assert target.threads[0] is not threading.current_thread()
    assert target.threads[0].name == "dopool-clock"


def test_real_alarm_already_due_fires_at_once_in_the_callers_thread(
    real: RealClock, fired: list[tuple[float, str, int]]
) -> None:
    target = EventTarget(real, fired, 0)
    real.set_alarm(target, real.now() - 1.0)
    assert len(fired) == 1  # before set_alarm returned
    assert target.threads == [threading.current_thread()]


def test_real_alarm_replaced_fires_once_at_the_new_time(
    real: RealClock, fired: list[tuple[float, str, int]]
) -> None:
    target, sentinel = EventTarget(real, fired, 0), EventTarget(real, fired, 1)
    start = real.now()
    real.set_alarm(target, start + 0.05)
    real.set_alarm(target, start + 0.15)
    real.set_alarm(sentinel, start + 0.3)
    assert sentinel.event.wait(WAIT)
    assert [index for _, _, index in fired] == [0, 1]
    assert fired[0][0] >= start + 0.15


def test_real_alarm_cleared_never_fires(
    real: RealClock, fired: list[tuple[float, str, int]]
) -> None:
    target, sentinel = EventTarget(real, fired, 0), EventTarget(real, fired, 1)
    start = real.now()
    real.set_alarm(target, start + 0.05)
    real.set_alarm(target, None)
    real.set_alarm(sentinel, start + 0.15)
    assert sentinel.event.wait(WAIT)
    assert [index for _, _, index in fired] == [1]


def test_real_alarms_fire_in_time_order(
    real: RealClock, fired: list[tuple[float, str, int]]
) -> None:
    start = real.now()
    targets = [EventTarget(real, fired, index) for index in range(3)]
    for target, delay in zip(targets, [0.3, 0.1, 0.2], strict=True):
        real.set_alarm(target, start + delay)
    assert targets[0].event.wait(WAIT)
    assert [index for _, _, index in fired] == [1, 2, 0]


def test_real_clock_close_stops_the_scheduler_thread(
    fired: list[tuple[float, str, int]],
) -> None:
    clock = RealClock()
    target = EventTarget(clock, fired, 0)
    clock.set_alarm(target, clock.now() + 0.01)
    assert target.event.wait(WAIT)
    thread = target.threads[0]
    clock.close()
    assert not thread.is_alive()
    RealClock().close()  # a clock that never started its thread closes too
