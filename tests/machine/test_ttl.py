"""Time to live: an event not started within its ``ttl`` of its enqueue is dead-lettered as
expired instead of run (docs/api.md, "enqueue"; docs/guarantees.md, "No loss")."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from activation import activate
from cli_support import invoke
from dopool import (
    DeadLetter,
    EventContext,
    RetryPolicy,
    Runtime,
    ScheduleError,
    SimulatedClock,
    WorkerPool,
)
from dopool._ops.check import check_store


def clock_of(runtime: Runtime) -> SimulatedClock:
    clock = runtime.clock
    assert isinstance(clock, SimulatedClock)
    return clock


def define(runtime: Runtime, **options: Any) -> tuple[WorkerPool, list[Any], list[DeadLetter]]:
    ran: list[Any] = []
    dead: list[DeadLetter] = []
    pool = runtime.define(
        "p", execute=lambda ctx: ran.append(ctx.event), on_dead_letter=dead.append, **options
    )
    return pool, ran, dead


def test_an_event_not_started_within_its_ttl_is_dead_lettered_as_expired(sim: Runtime) -> None:
    pool, ran, dead = define(sim)
    clock = clock_of(sim)
    pool.pause()
    late = pool.enqueue("late", ttl=5)
    fresh = pool.enqueue("fresh")
    clock.advance(6.0)
    assert pool.status().pending == 2  # expiry is found when the instance would start it
    info = pool.event(late.event_id)
    assert info is not None
    assert info.state == "pending"
    pool.resume()
    assert pool.join(timeout=10)
    assert ran == ["fresh"]  # never run
    [letter] = dead
    assert (letter.sequence, letter.attempts, letter.failed_at) == (late.sequence, 0, 6.0)
    assert letter.error.startswith("expired: not started within its ttl of 5 s")
    status = pool.status()
    assert (status.dead_lettered, status.expired, status.succeeded) == (1, 1, 1)
    info = pool.event(late.event_id)  # held as a dead letter
    assert info is not None
    assert info.state == "expired"
    assert pool.event(fresh.event_id) is None
    with sim._store.read() as txn:
        assert check_store(txn).ok


def test_an_event_started_in_time_runs_and_its_retries_ignore_the_ttl(sim: Runtime) -> None:
    attempts: list[int] = []

    def flaky(ctx: EventContext) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ValueError("once")

    retry = RetryPolicy(max_attempts=2, initial_delay=30.0, jitter=0.0)
    pool = sim.define("p", execute=flaky, retry=retry, keep_finished=60)
    result = pool.enqueue("x", ttl=timedelta(seconds=5))
    assert pool.join(timeout=10)
    assert attempts == [1, 2]  # the retry at 30 s runs though the ttl ended at 5 s
    info = pool.event(result.event_id)
    assert info is not None
    assert (info.state, info.finished_at) == ("succeeded", 30.0)
    assert pool.status().expired == 0


def test_a_batch_shares_its_ttl_and_expired_events_free_the_queue(sim: Runtime) -> None:
    pool, ran, dead = define(sim, keep_finished=60)
    clock = clock_of(sim)
    pool.pause()
    old = pool.enqueue_many(["a", "b"], ttl=1)
    pool.enqueue("c", priority=-1)
    clock.advance(1.0)  # expires at 1.0: not started by then
    pool.resume()
    assert pool.join(timeout=10)
    assert ran == ["c"]
    assert [d.sequence for d in dead] == [r.sequence for r in old]
    assert [pool.event(r.event_id).state for r in old] == ["expired"] * 2  # type: ignore[union-attr]


def test_a_delayed_event_has_a_ttl_past_its_delay(sim: Runtime) -> None:
    pool, ran, _ = define(sim)
    clock = clock_of(sim)
    result = pool.enqueue("d", delay=10, ttl=15)  # due at 10, expires at 15
    assert pool.join(timeout=10)
    assert (ran, clock.now()) == (["d"], 10.0)
    assert pool.event(result.event_id) is None
    pool.pause()
    pool.enqueue("e", delay=10, ttl=15)
    clock.advance(20.0)
    pool.resume()
    assert pool.join(timeout=10)
    assert ran == ["d"]
    assert pool.status().expired == 1


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"ttl": 0}, "a ttl is seconds > 0"),
        ({"ttl": -1.0}, "a ttl is seconds > 0"),
        ({"ttl": float("inf")}, "finite"),
        ({"ttl": "5"}, "seconds"),
        ({"ttl": 5, "delay": 5}, "would end before the event is due"),
        ({"ttl": 5, "not_before": 6.0}, "would end before the event is due"),
    ],
)
def test_a_bad_ttl_is_refused_and_nothing_is_stored(
    sim: Runtime, options: dict[str, Any], reason: str
) -> None:
    pool, _, _ = define(sim)
    for call in (lambda: pool.enqueue("x", **options), lambda: pool.enqueue_many(["x"], **options)):
        with pytest.raises(ScheduleError, match=reason) as caught:
            call()
        assert caught.value.argument == "ttl"
    assert pool.status().enqueued == 0


@pytest.mark.threaded
def test_a_ttl_expires_in_real_time(store_path: Path) -> None:
    release = threading.Event()
    ran: list[object] = []
    expired: list[float] = []  # a time past which "short" has expired

    def handle(ctx: EventContext) -> None:
        if ctx.event == "blocker":  # holds the instance until the second's ttl has passed
            while not expired or runtime.clock.now() <= expired[0]:
                release.wait(0.01)
        ran.append(ctx.event)

    with Runtime(store_path) as runtime:
        pool = runtime.define("p", execute=handle)
        activate(pool)  # running: the caller stores "short" while "blocker" starts
        pool.enqueue("blocker")
        pool.enqueue("short", ttl=0.02)
        expired.append(runtime.clock.now() + 0.02)  # stored before now: expired by then
        assert pool.join(timeout=10)
        assert ran == ["blocker"]
        assert pool.status().expired == 1


def test_dopool_status_counts_cancelled_and_expired(store_path: Path) -> None:
    with Runtime.simulated(store_path) as runtime:
        pool, _, _ = define(runtime)
        pool.pause()
        pool.enqueue("late", ttl=1)
        pool.cancel(pool.enqueue("cancelled").event_id)
        clock_of(runtime).advance(2.0)
        pool.resume()
        assert pool.join(timeout=10)
    result = invoke("status", str(store_path))
    assert result.exit_code == 0, result.output
    assert "1 dead-lettered (1 expired) · 0 drained · 1 cancelled" in result.stdout
    document = json.loads(invoke("status", str(store_path), "--json").stdout)
    (status,) = document["pools"]
    assert (status["cancelled"], status["expired"], status["dead_lettered"]) == (1, 1, 1)
    assert invoke("check", str(store_path)).exit_code == 0
