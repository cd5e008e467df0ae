"""Delayed follow-ups: ``ctx.enqueue(..., delay=, not_before=)``. A delay counts from the
commit of the handler's success; the due time travels with the follow-up, through the
outbox, a crash and a reopened store, and an event delivered after it is due at once."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dopool import (
    EventContext,
    Runtime,
    ScheduleError,
    SimulatedClock,
    WorkerPool,
)
from dopool._errors import MAX_DELAY
from dopool._store.layout import Namespace, OutboxRecord

Seen = list[tuple[float, Any, int]]


def clock(runtime: Runtime) -> SimulatedClock:
    found = runtime.clock
    assert isinstance(found, SimulatedClock)
    return found


def keys_to(pool: WorkerPool, runtime: Runtime) -> dict[int, str]:
    """A partition key routed to each instance of ``pool``."""
    router = runtime._pools[pool.name].router
    found: dict[int, str] = {}
    for n in range(200):
        found.setdefault(router.choose(f"k{n}"), f"k{n}")
    return found


def test_a_delay_counts_from_the_commit_of_the_success(sim: Runtime) -> None:
    seen: Seen = []

    def handler(ctx: EventContext) -> None:
        seen.append((ctx.started_at, ctx.event, ctx.instance_index))
        if ctx.event == "parent":
            ctx.enqueue("later", delay=5.0, partition_key=key[0])  # made at 2
            ctx.enqueue("away", delay=5.0, partition_key=key[1])
            ctx.enqueue("at", not_before=100.0, partition_key=key[1])
            ctx.enqueue("now", delay=0.0, partition_key=key[1])
            ctx.sleep(3.0)  # the success commits at 5

    pool = sim.define("p", execute=handler, concurrency=2)
    key = keys_to(pool, sim)
    pool.enqueue("parent", delay=2.0, partition_key=key[0])
    assert pool.join(timeout=10)
    assert sorted(seen) == [
        (2.0, "parent", 0),
        (5.0, "now", 1),
        (10.0, "away", 1),
        (10.0, "later", 0),
        (100.0, "at", 1),
    ]


def test_a_delayed_follow_up_into_another_pool_keeps_its_due_time(sim: Runtime) -> None:
    seen: Seen = []
    other = sim.define(
        "other",
        execute=lambda ctx: seen.append((ctx.started_at, ctx.event, ctx.instance_index)),
        concurrency=3,
    )

    def handler(ctx: EventContext) -> None:
        for n in range(3):
            ctx.enqueue(n, delay=7.5, partition_key=f"k{n}", pool=other)

    pool = sim.define("p", execute=handler)
    pool.enqueue("go")
    assert pool.join(timeout=10)
    assert other.status().scheduled == 3
    assert other.join(timeout=10)
    assert sorted(at for at, _, _ in seen) == [7.5, 7.5, 7.5]


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"delay": -1.0}, "delay"),
        ({"delay": float("nan")}, "delay"),
        ({"delay": "5"}, "delay"),
        ({"not_before": "soon"}, "not_before"),
        ({"delay": 1.0, "not_before": 2.0}, "not_before"),
    ],
)
def test_a_bad_delay_is_refused_in_the_handler_as_an_enqueue_refuses_it(
    sim: Runtime, options: dict[str, Any], argument: str
) -> None:
    caught: list[ScheduleError] = []

    def handler(ctx: EventContext) -> None:
        try:
            ctx.enqueue("child", **options)
        except ScheduleError as exc:
            caught.append(exc)

    pool = sim.define("p", execute=handler)
    pool.enqueue("go")
    assert pool.join(timeout=10)
    assert [exc.argument for exc in caught] == [argument]
    assert pool.status().enqueued == 1  # the refused follow-up stored nothing


def test_a_failed_attempt_discards_its_delayed_follow_ups(sim: Runtime) -> None:
    from dopool import RetryPolicy

    seen: list[Any] = []

    def handler(ctx: EventContext) -> None:
        seen.append((ctx.event, ctx.attempt))
        if ctx.event == "parent":
            ctx.enqueue("child", delay=1.0)
            if ctx.attempt == 1:
                raise RuntimeError("first try fails")

    pool = sim.define("p", execute=handler, retry=RetryPolicy(max_attempts=2, jitter=0.0))
    pool.enqueue("parent")
    assert pool.join(timeout=10)
    assert seen == [("parent", 1), ("parent", 2), ("child", 1)]


@pytest.mark.parametrize(("reopen_at", "expected"), [(20.0, 52.0), (80.0, 80.0)])
def test_a_crash_between_the_commit_and_the_delivery_keeps_the_due_time(
    tmp_path: Path, reopen_at: float, expected: float
) -> None:
    """The success commits with the follow-up in the outbox; the runtime stops before it is
    delivered. Reopened before its due time, it runs at its due time; the store reopened
    after, it runs at once; either way exactly once."""
    path = tmp_path / "store"
    seen: Seen = []
    key: dict[int, str] = {}

    def handler(ctx: EventContext) -> None:
        seen.append((ctx.started_at, ctx.event, ctx.instance_index))
        if ctx.event == "parent":
            ctx.enqueue("child", delay=50.0, partition_key=key[1])

    with Runtime(path, clock=SimulatedClock(0.0)) as runtime:
        pool = runtime.define("p", execute=handler, concurrency=2)
        key.update(keys_to(pool, runtime))
        pool.enqueue("parent", delay=2.0, partition_key=key[0])
        while not seen:  # the parent runs; its outcome commits at 2, nothing after
            assert clock(runtime).step()
        with runtime._store.read() as txn:
            (entry,) = [r for _, r in Namespace("p", 0).iter_outbox(txn)]
    assert isinstance(entry, OutboxRecord)
    assert entry.due == 52.0
    with Runtime(path, clock=SimulatedClock(reopen_at)) as runtime:
        pool = runtime.define("p", execute=handler, concurrency=2)
        assert pool.join(timeout=10)
    assert seen == [(2.0, "parent", 0), (expected, "child", 1)]


def test_killing_the_target_before_the_delivery_lands_keeps_the_due_time(sim: Runtime) -> None:
    seen: Seen = []

    def handler(ctx: EventContext) -> None:
        seen.append((ctx.started_at, ctx.event, ctx.instance_index))
        if ctx.event == "parent":
            ctx.enqueue("child", delay=9.0, partition_key=key[1])
            sim.kill("p", 1)  # crashes at its next fault point: the delivery's receipt

    pool = sim.define("p", execute=handler, concurrency=2)
    key = keys_to(pool, sim)
    pool.enqueue("parent", partition_key=key[0])
    assert pool.join(timeout=10)
    assert seen == [(0.0, "parent", 0), (9.0, "child", 1)]
    assert pool.status().instance(1).restarts == 1


@pytest.mark.threaded
def test_a_delayed_follow_up_never_runs_before_its_commit_plus_delay(tmp_path: Path) -> None:
    returned: list[float] = []
    started: list[float] = []
    done = threading.Event()

    def handler(ctx: EventContext) -> None:
        if ctx.event == "parent":
            ctx.enqueue("child", delay=0.2)
            ctx.enqueue("elsewhere", delay=0.2, partition_key="k-other")
            returned.append(time.time())  # the commit comes after this
        else:
            started.append(ctx.started_at)
            if len(started) == 2:
                done.set()

    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=handler, concurrency=2)
        pool.enqueue("parent")
        assert done.wait(timeout=10)
        assert pool.join(timeout=10)
    assert all(at >= returned[0] + 0.2 for at in started), (returned, started)


def test_an_int_given_to_run_until_keeps_virtual_time_a_float(sim: Runtime) -> None:
    """``run_until(100)`` once left the clock at the int 100, and a follow-up parked in the
    outbox then was stored with an int ``enqueued_at``: a damaged record, dead-lettered
    when delivered. The clock keeps its time a float."""
    seen: Seen = []

    def handler(ctx: EventContext) -> None:
        seen.append((ctx.enqueued_at, ctx.event, ctx.instance_index))
        if ctx.event == "parent":
            ctx.enqueue("child", partition_key=key[1])

    pool = sim.define("p", execute=handler, concurrency=2)
    key = keys_to(pool, sim)
    clock(sim).run_until(100)
    assert type(clock(sim).now()) is float
    pool.enqueue("parent", partition_key=key[0])
    assert pool.join(timeout=10)
    assert seen == [(100.0, "parent", 0), (100.0, "child", 1)]
    assert pool.status().dead_lettered == 0


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
def test_a_delay_past_the_largest_float_is_due_at_it(tmp_path: Path, backend: str) -> None:
    """A clock near the largest float plus a long delay made an infinite due time at the
    commit, stored in the meta record's alarm: the pool was refused for good. A delay is
    at most MAX_DELAY now; from a clock at the largest float it is due at that float."""
    runtime = Runtime.simulated(tmp_path / "store", start=sys.float_info.max, backend=backend)
    with runtime:
        started: list[float] = []

        def handler(ctx: EventContext) -> None:
            started.append(ctx.started_at)
            if ctx.event == "go":
                ctx.enqueue("later", delay=MAX_DELAY)

        pool = runtime.define("p", execute=handler)
        pool.enqueue("go")
        assert pool.join(timeout=10)
        assert pool.status().succeeded == 2
        assert started == [sys.float_info.max, sys.float_info.max]
