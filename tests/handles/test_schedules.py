"""Recurring schedules under a SimulatedClock: when they fire, what a fire enqueues, how
definitions are kept, replaced and removed, and what reads and idleness make of them."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dopool import (
    ConfigurationError,
    EventContext,
    EventTooLargeError,
    EventValidationError,
    Runtime,
    ScheduleDefinitionError,
    ScheduleInfo,
    SimulatedClock,
    WorkerPool,
)
from dopool._machine.recurring import cron_after, following
from dopool._ops.check import check_store
from dopool._store.environment import Store
from dopool._store.layout import Namespace, ScheduleBook

Seen = list[tuple[float, Any, int]]


def clock(runtime: Runtime) -> SimulatedClock:
    found = runtime.clock
    assert isinstance(found, SimulatedClock)
    return found


def recorder(runtime: Runtime, seen: Seen) -> Any:
    clock = runtime.clock

    def handler(ctx: EventContext) -> None:
        seen.append((clock.now(), ctx.event, ctx.instance_index))

    return handler


def define(runtime: Runtime, seen: Seen, **options: Any) -> WorkerPool:
    return runtime.define("p", execute=recorder(runtime, seen), **options)


def times(seen: Seen, event: Any) -> list[float]:
    return [at for at, value, _ in seen if value == event]


# -- when they fire ------------------------------------------------------------------


def test_every_fires_at_exact_virtual_times_without_drift(sim: Runtime) -> None:
    seen: Seen = []
    pool = define(sim, seen, concurrency=2)
    clock(sim).run_until(3.5)
    info = pool.schedule("tick", {"n": 1}, every=2.5)
    assert info.next_at == 6.0  # now + every
    clock(sim).run_until(20.0)
    assert times(seen, {"n": 1}) == [6.0, 8.5, 11.0, 13.5, 16.0, 18.5]
    (info,) = pool.schedules()
    assert (info.fired, info.coalesced, info.last_fired_at, info.next_at) == (6, 0, 18.5, 21.0)


def test_a_fire_is_measured_from_the_fire_time_not_from_when_its_occurrence_ran(
    sim: Runtime,
) -> None:
    """A handler that takes longer than half the period delays its occurrence's start,
    never the next fire time."""
    seen: Seen = []

    def slow(ctx: EventContext) -> None:
        seen.append((sim.clock.now(), ctx.event, ctx.instance_index))
        ctx.sleep(3.0)

    pool = sim.define("p", execute=slow, concurrency=2)
    pool.schedule("tick", "t", every=4.0, partition_key="k")
    clock(sim).run_until(16.0)
    assert times(seen, "t") == [4.0, 8.0, 12.0, 16.0]


def test_cron_fires_at_each_utc_time_after_the_definition(tmp_path: Path) -> None:
    """Virtual time 0 is 1970-01-01T00:00Z: "*/15 * * * *" fires at 900, 1800, ... s."""
    with Runtime.simulated(tmp_path / "s", start=100.0) as runtime:
        seen: Seen = []
        pool = define(runtime, seen)
        assert pool.schedule("q", "q", cron="*/15 * * * *").next_at == 900.0
        assert pool.schedule("h", "h", cron="0 * * * *").next_at == 3600.0
        clock(runtime).run_until(3600.0)
        assert times(seen, "q") == [900.0, 1800.0, 2700.0, 3600.0]
        assert times(seen, "h") == [3600.0]


def test_cron_times_are_utc_days_and_weekdays() -> None:
    day = 86400.0
    # 1970-01-01 was a Thursday; the first Monday 03:00 UTC is 1970-01-05T03:00Z.
    assert cron_after("0 3 * * 1", 0.0) == 4 * day + 3 * 3600
    assert cron_after("30 12 2 * *", 0.0) == day + 12.5 * 3600
    assert cron_after("0 0 * * *", 1e300) is None  # past the calendar: it never fires


def test_missed_fires_coalesce_into_one_occurrence_after_a_pause(sim: Runtime) -> None:
    seen: Seen = []
    pool = define(sim, seen, concurrency=3)
    pool.schedule("tick", "t", every=10.0)
    clock(sim).run_until(25.0)
    assert times(seen, "t") == [10.0, 20.0]
    pool.pause()
    clock(sim).run_until(75.0)  # fire times 30..70 pass while instance 0 is paused
    assert times(seen, "t") == [10.0, 20.0]
    assert pool.schedules()[0].next_at == 30.0
    pool.resume()
    clock(sim).run_until(85.0)
    assert times(seen, "t") == [10.0, 20.0, 75.0, 80.0]  # 75: one for 30..70
    (info,) = pool.schedules()
    assert (info.fired, info.coalesced, info.next_at) == (4, 4, 90.0)


def test_pausing_instance_0_alone_pauses_the_schedules(sim: Runtime) -> None:
    seen: Seen = []
    pool = define(sim, seen, concurrency=2)
    pool.schedule("tick", "t", every=10.0)
    pool.pause(0)
    clock(sim).run_until(35.0)
    assert seen == []
    pool.resume(0)
    clock(sim).run_until(35.0)
    assert times(seen, "t") == [35.0]
    assert pool.schedules()[0].coalesced == 2


def test_a_busy_instance_0_fires_once_its_handler_returns_coalescing(sim: Runtime) -> None:
    seen: Seen = []

    def handler(ctx: EventContext) -> None:
        seen.append((sim.clock.now(), ctx.event, ctx.instance_index))
        if ctx.event == "long":
            ctx.sleep(35.0)

    pool = sim.define("p", execute=handler)
    pool.schedule("tick", "t", every=10.0)
    pool.enqueue("long", delay=5.0)
    clock(sim).run_until(60.0)
    # The occurrence of 10..40 is enqueued at 40, when the handler's outcome commits.
    assert times(seen, "t") == [40.0, 50.0, 60.0]
    assert pool.schedules()[0].coalesced == 3


def test_following_counts_the_fire_times_that_passed() -> None:
    from dopool._store.layout import ScheduleRecord

    record = ScheduleRecord("x", b"\xc0", 0.1, None, None, 0, 0.3)
    nxt, passed = following(record, 0.3)
    assert nxt == pytest.approx(0.4)
    assert passed == 1
    nxt, passed = following(record, 1.0)
    assert nxt is not None
    assert nxt > 1.0
    assert passed == 8
    # Where every is below the clock's resolution (here 2 s), the next fire is still after
    # now (a loop adding every to a time that does not move would never end).
    huge = ScheduleRecord("h", b"\xc0", 0.001, None, None, 0, 2.0**53)
    nxt, passed = following(huge, 2.0**53)
    assert nxt is not None
    assert nxt > 2.0**53
    assert passed >= 1
    cron = ScheduleRecord("c", b"\xc0", None, "* * * * *", None, 0, 60.0)
    assert following(cron, 60.0) == (120.0, 1)
    assert following(cron, 600.5) == (660.0, 10)


# -- what a fire enqueues --------------------------------------------------------------


def test_occurrences_route_by_the_schedule_name_or_its_partition_key(sim: Runtime) -> None:
    seen: Seen = []
    pool = define(sim, seen, concurrency=4)
    router = sim._pools["p"].router
    pool.schedule("alpha", "a", every=5.0)
    pool.schedule("beta", "b", every=5.0, partition_key="shard-7")
    clock(sim).run_until(20.0)
    assert {index for _, event, index in seen if event == "a"} == {router.choose("alpha")}
    assert {index for _, event, index in seen if event == "b"} == {router.choose("shard-7")}
    assert len(times(seen, "a")) == len(times(seen, "b")) == 4


def test_one_schedules_occurrences_run_in_order_never_two_at_once(sim: Runtime) -> None:
    running: list[int] = []
    order: list[int] = []
    overlaps: list[int] = []

    def handler(ctx: EventContext) -> None:
        if running:
            overlaps.append(ctx.sequence)
        running.append(ctx.sequence)
        order.append(ctx.sequence)
        ctx.sleep(7.0)  # longer than the period: occurrences queue up behind it
        running.pop()

    pool = sim.define("p", execute=handler, concurrency=3)
    pool.schedule("slow", {"x": 1}, every=5.0)
    clock(sim).run_until(100.0)
    assert overlaps == []
    assert order == sorted(order)
    assert len(order) >= 10


def test_priority_applies_to_each_occurrence(sim: Runtime) -> None:
    seen: Seen = []
    pool = define(sim, seen)
    pool.pause()
    pool.enqueue("low")
    pool.schedule("urgent", "high", every=1.0, priority=5)
    pool.resume()  # resume at 0: the schedule is not due until 1
    pool.pause()
    clock(sim).run_until(1.0)
    pool.resume()
    clock(sim).run_until(1.0)
    assert [event for _, event, _ in seen][:2] == ["high", "low"]


def test_join_and_run_until_idle_do_not_wait_for_future_fires(sim: Runtime) -> None:
    seen: Seen = []
    pool = define(sim, seen, concurrency=2)
    pool.schedule("tick", "t", every=10.0)
    pool.enqueue("work", delay=25.0)
    assert pool.join(timeout=10)  # runs the delayed event, and the fires before it
    assert sim.clock.now() == 25.0
    assert times(seen, "t") == [10.0, 20.0]
    clock(sim).run_until_idle(max_time=1000.0)  # nothing but fires left: returns at once
    assert sim.clock.now() == 25.0
    clock(sim).run_until_idle()  # (bounded first: a bug here fails the test, not hangs it)
    assert sim.clock.now() == 25.0
    clock(sim).advance(10.0)
    assert times(seen, "t") == [10.0, 20.0, 30.0]


# -- definitions -----------------------------------------------------------------------


def test_an_identical_definition_keeps_its_next_fire_time(sim: Runtime) -> None:
    seen: Seen = []
    pool = define(sim, seen)
    pool.schedule("tick", {"k": [1, 2]}, every=timedelta(seconds=10))
    clock(sim).run_until(15.0)
    again = pool.schedule("tick", {"k": [1, 2]}, every=10.0)
    assert (again.next_at, again.fired) == (20.0, 1)
    clock(sim).run_until(30.0)
    assert times(seen, {"k": [1, 2]}) == [10.0, 20.0, 30.0]


def test_a_different_definition_replaces_the_schedule_from_now(sim: Runtime) -> None:
    seen: Seen = []
    pool = define(sim, seen)
    pool.schedule("tick", "old", every=10.0)
    clock(sim).run_until(15.0)
    replaced = pool.schedule("tick", "new", every=10.0)
    assert (replaced.next_at, replaced.fired, replaced.event) == (25.0, 0, "new")
    again = pool.schedule("tick", "new", every=10.0, priority=1)  # priority differs too
    assert again.next_at == 25.0
    clock(sim).run_until(35.0)
    assert times(seen, "old") == [10.0]
    assert times(seen, "new") == [25.0, 35.0]
    assert len(pool.schedules()) == 1
    assert pool.status().schedules == 1


def test_unschedule_removes_it_and_says_whether_it_existed(sim: Runtime) -> None:
    seen: Seen = []
    pool = define(sim, seen, concurrency=2)
    pool.schedule("b", "b", every=10.0)
    pool.schedule("a", "a", cron="* * * * *")
    assert [info.name for info in pool.schedules()] == ["a", "b"]
    assert pool.status().schedules == 2
    assert pool.unschedule("b") is True
    assert pool.unschedule("b") is False
    assert pool.unschedule("never") is False
    clock(sim).run_until(60.0)
    assert times(seen, "b") == []
    assert times(seen, "a") == [60.0]
    assert [info.name for info in pool.schedules()] == ["a"]
    assert pool.unschedule("a") is True
    clock(sim).run_until(300.0)
    assert times(seen, "a") == [60.0]
    assert pool.schedules() == []
    assert pool.status().schedules == 0


def test_schedules_are_stored_in_instance_0_and_check_out(sim: Runtime, store_path: Path) -> None:
    seen: Seen = []
    pool = define(sim, seen, concurrency=3)
    long = "ü" * 200  # 400 bytes: named by its digest in its keys
    pool.schedule(long, "x", every=7.0)
    pool.schedule("short", "y", every=11.0)
    clock(sim).run_until(30.0)
    with sim._store.read() as txn:
        meta = Namespace("p", 0).load_meta(txn)
        assert (meta.schedules, meta.next_fire) == (2, 33.0)
        assert [Namespace("p", i).load_meta(txn).schedules for i in (1, 2)] == [0, 0]
        assert ScheduleBook(Namespace("p", 0)).get(txn, long) is not None
        report = check_store(txn)
    assert report.ok, report.problems
    assert [info.name for info in pool.schedules()] == ["short", long]


def test_the_schema_applies_and_the_event_is_checked_as_an_enqueue(sim: Runtime) -> None:
    pool = sim.define("p", execute=lambda ctx: None, schema=lambda e: {"wrapped": e})
    assert pool.schedule("s", 1, every=1.0).event == {"wrapped": 1}
    with pytest.raises(EventValidationError):
        pool.schedule("s", object(), every=1.0)
    with pytest.raises(EventTooLargeError):
        pool.schedule("s", b"x" * 200_000, every=1.0)
    with pytest.raises(EventValidationError):
        pool.schedule("s", 1, every=1.0, partition_key=3)  # type: ignore[arg-type]
    assert [info.event for info in pool.schedules()] == [{"wrapped": 1}]


@pytest.mark.parametrize(
    ("name", "options", "argument"),
    [
        ("", {"every": 1.0}, "name"),
        ("x" * 201, {"every": 1.0}, "name"),
        ("tab\there", {"every": 1.0}, "name"),
        (7, {"every": 1.0}, "name"),
        ("s", {}, "every"),
        ("s", {"every": 1.0, "cron": "* * * * *"}, "every"),
        ("s", {"every": 0}, "every"),
        ("s", {"every": 0.0009}, "every"),  # below MIN_EVERY: a flood, not a schedule
        ("s", {"every": timedelta(microseconds=1)}, "every"),
        ("s", {"every": -1.0}, "every"),
        ("s", {"every": float("inf")}, "every"),
        ("s", {"every": True}, "every"),
        ("s", {"every": "5"}, "every"),
        ("s", {"cron": "* * * *"}, "cron"),
        ("s", {"cron": "* * * * * *"}, "cron"),
        ("s", {"cron": "61 * * * *"}, "cron"),
        ("s", {"cron": 5}, "cron"),
    ],
)
def test_a_bad_definition_is_refused_and_stores_nothing(
    sim: Runtime, name: Any, options: dict[str, Any], argument: str
) -> None:
    pool = sim.define("p", execute=lambda ctx: None)
    with pytest.raises(ScheduleDefinitionError) as caught:
        pool.schedule(name, "e", **options)
    assert isinstance(caught.value, ConfigurationError)
    assert (caught.value.schedule, caught.value.argument) == (name, argument)
    assert caught.value.reason in str(caught.value)
    assert pool.schedules() == []


def test_a_bad_cron_expression_is_named_with_cronsims_reason(sim: Runtime) -> None:
    pool = sim.define("p", execute=lambda ctx: None)
    with pytest.raises(ScheduleDefinitionError, match=r"'0 0 30 2 \*'.*Bad day-of-month"):
        pool.schedule("feb30", "e", cron="0 0 30 2 *")


def test_schedule_info_is_exported_frozen(sim: Runtime) -> None:
    pool = sim.define("p", execute=lambda ctx: None)
    info = pool.schedule("s", "e", every=1.0)
    assert isinstance(info, ScheduleInfo)
    with pytest.raises(AttributeError):
        info.name = "t"  # type: ignore[misc]


def test_a_handler_cannot_schedule_on_its_own_pool_but_may_on_another(sim: Runtime) -> None:
    errors: list[BaseException] = []
    other = sim.define("q", execute=lambda ctx: None, concurrency=2)

    def handler(ctx: EventContext) -> None:
        try:
            pool.schedule("self", "e", every=1.0)
        except ConfigurationError as exc:
            errors.append(exc)
        other.schedule("from-p", "e", every=1.0)

    pool = sim.define("p", execute=handler)
    pool.enqueue("go")
    assert pool.join(timeout=10)
    assert len(errors) == 1
    assert "wait on itself" in str(errors[0])
    assert [info.name for info in other.schedules()] == ["from-p"]


# -- across restarts -------------------------------------------------------------------


def test_a_reopened_store_keeps_its_schedules_and_coalesces_the_downtime(tmp_path: Path) -> None:
    path = tmp_path / "store"
    seen: Seen = []
    with Runtime(path, clock=SimulatedClock(0.0)) as runtime:
        pool = define(runtime, seen, concurrency=2)
        pool.schedule("tick", "t", every=10.0)
        clock(runtime).run_until(25.0)
    assert times(seen, "t") == [10.0, 20.0]
    with Runtime(path, clock=SimulatedClock(100.0)) as runtime:
        pool = define(runtime, seen, concurrency=2)
        assert pool.schedule("tick", "t", every=10.0).next_at == 30.0  # kept as it was
        clock(runtime).run_until(115.0)
        (info,) = pool.schedules()
    # One occurrence for 30..100, fired at the reopening's first alarm; then on time.
    assert times(seen, "t") == [10.0, 20.0, 100.0, 110.0]
    assert (info.fired, info.coalesced) == (4, 7)


def test_a_schedule_survives_a_change_of_concurrency(tmp_path: Path) -> None:
    path = tmp_path / "store"
    seen: Seen = []
    with Runtime(path, clock=SimulatedClock(0.0)) as runtime:
        define(runtime, seen, concurrency=4).schedule("tick", "t", every=10.0)
    with Runtime(path, clock=SimulatedClock(5.0)) as runtime:
        pool = define(runtime, seen, concurrency=1)
        clock(runtime).run_until(20.0)
        assert [info.name for info in pool.schedules()] == ["tick"]
    assert times(seen, "t") == [10.0, 20.0]


def test_the_store_checks_out_after_fires_and_removals(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Runtime(path, clock=SimulatedClock(0.0)) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None, concurrency=2)
        for n in range(5):
            pool.schedule(f"s{n}", n, every=float(n + 1))
        clock(runtime).run_until(12.0)
        pool.unschedule("s2")
        clock(runtime).run_until(20.0)
    store = Store(path)
    try:
        with store.read() as txn:
            report = check_store(txn)
    finally:
        store.close()
    assert report.ok, report.problems


def test_empty_is_not_said_when_a_fire_in_the_same_transaction_refills_the_queue(
    sim: Runtime,
) -> None:
    """The outcome at 12 leaves the queue empty, and the same transaction fires the
    schedule due since 10: no ``empty`` then, one once the occurrence ran."""
    empties: list[tuple[float, int]] = []
    seen: Seen = []

    def handler(ctx: EventContext) -> None:
        seen.append((sim.clock.now(), ctx.event, ctx.instance_index))
        if ctx.event == "long":
            ctx.sleep(7.0)

    pool = sim.define(
        "p",
        execute=handler,
        on_empty=lambda info: empties.append((sim.clock.now(), pool.status().pending)),
    )
    pool.schedule("tick", "t", every=10.0)
    pool.enqueue("long", delay=5.0)
    clock(sim).run_until(12.0)
    assert [event for _, event, _ in seen] == ["long", "t"]
    assert empties == [(12.0, 0)]  # after the occurrence, not after "long"


def test_run_until_idle_fires_what_is_due_now_and_stops_before_the_next(sim: Runtime) -> None:
    """After a resume, the fires missed are due now: run_until_idle fires them (time need
    not move), then stops short of the next one. (Found by the state machine.)"""
    seen: Seen = []
    pool = define(sim, seen)
    pool.schedule("a", "a", every=0.5)
    pool.pause()
    clock(sim).advance(0.5)
    pool.resume()
    clock(sim).run_until_idle()
    assert times(seen, "a") == [0.5]
    assert clock(sim).now() == 0.5
    assert pool.schedules()[0].next_at == 1.0


def test_a_schedule_at_times_where_every_is_below_the_clocks_resolution_still_moves() -> None:
    """At 2**53 s a float moves by 2 s: every=0.001 fires at each representable time, and
    the clock moves on (the next fire was computed by adding every to a time it did not
    change, for ever, inside instance 0's transaction)."""
    start = 2.0**53
    with Runtime.simulated(start=start) as runtime:
        fired: list[float] = []
        pool = runtime.define("p", execute=lambda ctx: fired.append(ctx.enqueued_at))
        assert pool.schedule("tick", "t", every=0.001).every == 0.001  # the shortest allowed
        clock(runtime).run_until(start + 10)
    assert fired
    assert fired == sorted(set(fired))  # one occurrence per fire time, each later


def test_a_schedule_whose_next_fire_is_past_the_largest_float_has_no_time_left(
    tmp_path: Path,
) -> None:
    """Near the largest float, every=1e308 made the next fire time infinity, stored in the
    schedule record and instance 0's alarm: the pool was refused for good."""
    with Runtime.simulated(tmp_path / "store", start=1e308) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        assert pool.schedule("never", "x", every=1e308).next_at is None  # no first fire
        assert pool.schedule("once", "x", every=5e307).next_at == 1.5e308
        clock(runtime).run_until(1.6e308)
        once = {info.name: info for info in pool.schedules()}["once"]
        assert (once.fired, once.next_at) == (1, None)  # 2e308 would be infinity
        assert pool.join(timeout=10)
        assert pool.status().succeeded == 1
    store = Store(tmp_path / "store")
    try:
        with store.read() as txn:
            report = check_store(txn)
    finally:
        store.close()
    assert report.ok, report.problems
