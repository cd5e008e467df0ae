"""Delayed events through the public API, under a SimulatedClock: the arguments, exact due
times, order, and what drain, pause, a crash and a reopen do to them (docs/api.md,
"enqueue"; docs/guarantees.md, "Order and priority")."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dopool import (
    EventContext,
    EventValidationError,
    RetryAfter,
    RetryPolicy,
    Runtime,
    ScheduleError,
    SimulatedClock,
    WorkerPool,
)
from dopool._ops.check import check_store

API = Path(__file__).parents[2] / "docs" / "api.md"


class Log:
    """A handler that records (event, started_at), and the clock's time when it ran."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.ran: list[tuple[Any, float]] = []

    def __call__(self, ctx: EventContext) -> None:
        assert ctx.started_at == self.clock.now()
        self.ran.append((ctx.event, ctx.started_at))


def define(runtime: Runtime, **options: Any) -> tuple[WorkerPool, Log]:
    log = Log(runtime.clock)
    return runtime.define("p", execute=log, **options), log


def clock_of(runtime: Runtime) -> SimulatedClock:
    clock = runtime.clock
    assert isinstance(clock, SimulatedClock)
    return clock


def checks_out(runtime: Runtime) -> None:
    with runtime._store.read() as txn:
        report = check_store(txn)
    assert report.ok, report.problems


# -- the arguments ------------------------------------------------------------------------------

BAD = [
    ({"delay": -1}, "delay", "seconds >= 0"),
    ({"delay": -0.001}, "delay", "seconds >= 0"),
    ({"delay": timedelta(seconds=-1)}, "delay", "seconds >= 0"),
    ({"delay": math.nan}, "delay", "not a finite time"),
    ({"delay": math.inf}, "delay", "not a finite time"),
    ({"delay": 1e308 * 10}, "delay", "not a finite time"),
    ({"delay": "5"}, "delay", "not seconds or a timedelta"),
    ({"delay": True}, "delay", "not seconds or a timedelta"),
    ({"delay": 10**400}, "delay", "too large"),
    ({"not_before": math.nan}, "not_before", "not a finite time"),
    ({"not_before": -math.inf}, "not_before", "not a finite time"),
    ({"not_before": "10"}, "not_before", "not a clock time or a datetime"),
    ({"not_before": datetime(2030, 1, 1, tzinfo=UTC)}, "not_before", "simulated"),
    ({"delay": 1, "not_before": 5.0}, "not_before", "not both"),
]


@pytest.mark.parametrize(("kwargs", "argument", "reason"), BAD, ids=repr)
@pytest.mark.parametrize("many", [False, True])
def test_a_bad_delay_or_not_before_is_refused_and_stores_nothing(
    sim: Runtime, kwargs: dict[str, Any], argument: str, reason: str, many: bool
) -> None:
    pool, _ = define(sim)

    def enqueue() -> Any:
        if many:
            return pool.enqueue_many(["a", "b"], **kwargs)
        return pool.enqueue("a", **kwargs)

    with pytest.raises(ScheduleError) as caught:
        enqueue()
    error = caught.value
    assert isinstance(error, EventValidationError)
    assert (error.argument, error.value, error.position) == (
        argument,
        kwargs[argument],
        None,
    )
    assert reason in error.reason
    assert str(error).startswith(f"{argument}={kwargs[argument]!r} refused: ")
    status = pool.status()
    assert (status.enqueued, status.pending, status.scheduled) == (0, 0, 0)
    with sim._store.read() as txn:
        assert check_store(txn).records == 2  # the format, the pool: no event, no meta


def test_a_bad_event_with_a_good_delay_stores_nothing(sim: Runtime) -> None:
    pool, _ = define(sim)
    with pytest.raises(EventValidationError):
        pool.enqueue_many(["ok", object()], delay=5)
    assert pool.status().enqueued == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"delay": 0}, {"delay": 0.0}, {"delay": timedelta(0)}, {"not_before": 3.0}, {}],
    ids=repr,
)
def test_a_delay_of_zero_or_a_past_not_before_is_an_ordinary_event(
    store_path: Path, kwargs: dict[str, Any]
) -> None:
    with Runtime.simulated(store_path, start=5.0) as runtime:
        pool, log = define(runtime)
        result = pool.enqueue("x", **kwargs)
        assert (result.position, pool.status().scheduled) == (0, 0)
        assert pool.status().instance(0).next_alarm_at == 5.0
        clock_of(runtime).advance(0)
        assert log.ran == [("x", 5.0)]


# -- due times, exactly ---------------------------------------------------------------------------


def test_a_delayed_event_starts_exactly_at_its_due_time_and_not_before(sim: Runtime) -> None:
    pool, log = define(sim)
    result = pool.enqueue("later", delay=2.5)
    assert (result.sequence, result.position, result.event_id) == (0, 0, "p:0:0")
    assert result.duplicate is False
    status = pool.status()
    assert (status.pending, status.scheduled) == (1, 1)
    assert status.instance(0).next_alarm_at == 2.5
    clock_of(sim).run_until(math.nextafter(2.5, 0.0))
    assert log.ran == []
    clock_of(sim).run_until(2.5)
    assert log.ran == [("later", 2.5)]
    assert (pool.status().pending, pool.status().scheduled) == (0, 0)
    checks_out(sim)


def test_not_before_and_timedelta_name_the_same_due_times(sim: Runtime) -> None:
    pool, log = define(sim)
    pool.enqueue("b", delay=timedelta(seconds=4))
    pool.enqueue("a", not_before=3.0)
    pool.enqueue_many(["c", "d"], delay=6)
    assert clock_of(sim).next_time() == 3.0
    assert pool.join(timeout=10)
    assert log.ran == [("a", 3.0), ("b", 4.0), ("c", 6.0), ("d", 6.0)]


def test_a_scheduled_event_does_not_hold_up_the_due_events(sim: Runtime) -> None:
    pool, log = define(sim)
    pool.enqueue("later", delay=10, priority=9)
    pool.enqueue_many(["a", "b"])
    clock_of(sim).advance(1)
    assert log.ran == [("a", 0.0), ("b", 0.0)]
    assert pool.status().instance(0).next_alarm_at == 10.0
    assert pool.join(timeout=10)
    assert log.ran[-1] == ("later", 10.0)


def test_due_events_run_by_priority_then_due_time_then_sequence(sim: Runtime) -> None:
    """The instance is paused while they fall due: then one look orders them all."""
    pool, log = define(sim)
    pool.pause()
    pool.enqueue("p0-due5-seq0", delay=5)
    pool.enqueue("p1-due7", delay=7, priority=1)
    pool.enqueue("p0-due5-seq2", delay=5)
    pool.enqueue("p0-due3", delay=3)
    pool.enqueue("p0-due0")
    pool.enqueue("p-1-due0", priority=-1)
    clock_of(sim).advance(8)
    pool.enqueue("p0-due8")
    assert pool.status().scheduled == 4  # a paused instance moved none of them
    pool.resume()
    assert pool.join(timeout=10)
    assert [event for event, _ in log.ran] == [
        "p1-due7",
        "p0-due0",
        "p0-due3",
        "p0-due5-seq0",
        "p0-due5-seq2",
        "p0-due8",
        "p-1-due0",
    ]
    assert {started for _, started in log.ran} == {8.0}


def test_a_delayed_event_waits_behind_a_started_event_in_backoff(sim: Runtime) -> None:
    """Head-of-line blocking holds for scheduled events too: once due they wait for it."""

    def flaky(ctx: EventContext) -> None:
        log(ctx)
        if ctx.event == "flaky" and ctx.attempt == 1:
            raise RetryAfter(10)

    log = Log(sim.clock)
    pool = sim.define("p", execute=flaky, retry=RetryPolicy(max_attempts=2))
    pool.enqueue("flaky")
    pool.enqueue("soon", delay=3)
    clock_of(sim).advance(0)
    instance = pool.status().instance(0)
    assert (instance.state, instance.next_alarm_at) == ("backoff", 3.0)  # the earliest work
    clock_of(sim).advance(3)
    instance = pool.status().instance(0)
    assert (instance.scheduled, instance.next_alarm_at) == (0, 10.0)  # moved, not started
    assert pool.join(timeout=10)
    assert log.ran == [("flaky", 0.0), ("flaky", 10.0), ("soon", 10.0)]


# -- drain, pause, crashes, reopen ---------------------------------------------------------------


def test_drain_removes_scheduled_events_and_the_books_balance(sim: Runtime) -> None:
    pool, log = define(sim, concurrency=2)
    pool.enqueue_many(["a", "b"], delay=5)
    pool.enqueue_many(["c", "d"])
    assert pool.drain() == 4
    status = pool.status()
    assert (status.pending, status.scheduled, status.drained, status.enqueued) == (0, 0, 4, 4)
    assert [i.next_alarm_at for i in status.instances] == [None, None]
    clock_of(sim).advance(10)
    assert log.ran == []
    checks_out(sim)


def test_a_paused_instance_runs_nothing_and_its_due_events_run_when_resumed(
    sim: Runtime,
) -> None:
    pool, log = define(sim)
    pool.enqueue("x", delay=2)
    pool.pause()
    assert pool.status().instance(0).next_alarm_at is None
    clock_of(sim).advance(5)
    assert log.ran == []
    assert pool.status().scheduled == 1
    pool.resume()
    assert pool.status().instance(0).next_alarm_at == 2.0  # due: fires when driven
    clock_of(sim).advance(0)
    assert log.ran == [("x", 5.0)]
    checks_out(sim)


def test_a_crash_loses_no_scheduled_event_and_runs_none_early(sim: Runtime) -> None:
    pool, log = define(sim, concurrency=2)
    pool.enqueue_many(["a", "b", "c"], delay=4, partition_key="k")
    index = pool.enqueue("probe", partition_key="k").instance_index
    sim.kill("p", index)
    status = pool.status().instance(index)
    assert (status.restarts, status.pending, status.scheduled) == (1, 4, 3)
    clock_of(sim).run_until(3.9)
    assert log.ran == [("probe", 0.0)]
    sim.kill("p", index)
    assert pool.join(timeout=10)
    assert log.ran == [("probe", 0.0), ("a", 4.0), ("b", 4.0), ("c", 4.0)]
    checks_out(sim)


@pytest.mark.parametrize("reopen_at", [2.0, 9.0])
def test_a_reopened_store_keeps_its_scheduled_events(store_path: Path, reopen_at: float) -> None:
    clock = SimulatedClock()
    with Runtime(store_path, clock=clock) as runtime:
        pool, _ = define(runtime)
        pool.enqueue("later", delay=5)
        pool.enqueue("sooner", delay=3, priority=-1)
    clock.advance(reopen_at)  # nothing runs: no runtime
    with Runtime(store_path, clock=clock) as runtime:
        pool, log = define(runtime)
        assert (pool.status().pending, pool.status().scheduled) == (2, 2)
        assert pool.status().instance(0).next_alarm_at == 3.0
        assert pool.join(timeout=10)
        if reopen_at < 3.0:
            assert log.ran == [("sooner", 3.0), ("later", 5.0)]
        else:  # both due by the time it looks: priority first
            assert log.ran == [("later", reopen_at), ("sooner", reopen_at)]
        checks_out(runtime)


def test_the_alarm_slot_points_at_the_earliest_due_work(sim: Runtime) -> None:
    pool, _ = define(sim, concurrency=1)

    def alarm() -> float | None:
        return pool.status().instance(0).next_alarm_at

    pool.enqueue("x", delay=8)
    assert alarm() == 8.0
    pool.enqueue("y", delay=6)
    assert alarm() == 6.0
    pool.enqueue("z", delay=9)
    assert alarm() == 6.0
    clock_of(sim).advance(6)
    assert alarm() == 8.0
    pool.enqueue("now")
    assert alarm() == 6.0  # due now (the clock stands at 6)
    clock_of(sim).advance(0)
    assert alarm() == 8.0
    assert pool.join(timeout=10)
    assert alarm() is None


def test_max_queue_depth_counts_scheduled_events(sim: Runtime) -> None:
    pool, _ = define(sim, max_queue_depth=2)
    pool.enqueue("a", delay=9)
    pool.enqueue("b")
    with pytest.raises(Exception, match="full"):
        pool.enqueue("c", delay=1)
    assert pool.status().enqueued == 2


def test_enqueue_many_results_name_each_event(sim: Runtime) -> None:
    pool, _ = define(sim, concurrency=2)
    results = pool.enqueue_many(["a", "b", "c"], delay=1)
    assert [r.event_id for r in results] == ["p:0:0", "p:1:0", "p:0:1"]
    assert [r.position for r in results] == [0, 0, 1]
    assert len({r.event_id for r in results}) == 3
    assert not any(r.duplicate for r in results)
    assert pool.status().scheduled == 3


def test_the_api_reference_example_of_a_delayed_event_runs() -> None:
    text = API.read_text(encoding="utf-8")
    marker = "A delayed event under a `SimulatedClock` (this example runs in the tests):"
    block = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", text, re.DOTALL)
    assert block is not None
    exec(compile(block.group(1), str(API), "exec"), {})  # its asserts are the test
