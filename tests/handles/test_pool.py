"""A pool's behaviour under a SimulatedClock: routing, order, outcomes, control, restarts.

Every test drives virtual time explicitly (``pool.join`` or the clock), so runs are
reproducible and nothing sleeps on the wall clock.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pykka
import pytest

import dopool._handles.runtime
from dopool import (
    ConfigurationError,
    DamagedRecordError,
    DeadLetter,
    EmptyInfo,
    EnqueueResult,
    EventContext,
    EventTooLargeError,
    EventValidationError,
    PermanentError,
    PoolClosedError,
    PoolEvent,
    PoolStatus,
    QueueFullError,
    RetryAfter,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    StoreLockedError,
    WorkerPool,
)
from dopool._cluster.routing import stable_hash
from dopool._engine.actor import running_instances
from dopool._store.layout import MAX_CONCURRENCY, pack, seal
from status_support import counters

MAX_EVENT_BYTES = 128 * 1024
MAX_PARTITION_KEY_BYTES = 2 * 1024


# -- helpers -------------------------------------------------------------------


def clock_of(runtime: Runtime) -> SimulatedClock:
    """The simulated clock of a runtime made by ``Runtime.simulated`` (the ``sim`` fixture)."""
    clock = runtime.clock
    assert isinstance(clock, SimulatedClock)
    return clock


@dataclass(frozen=True)
class Run:
    """One execution of a handler, as the handler saw it."""

    event: Any
    index: int
    sequence: int
    attempt: int
    is_retry: bool
    started_at: float
    partition_key: str | None


class Recorder:
    """A handler that records every execution, then runs an optional action."""

    def __init__(self, action: Callable[[EventContext], Any] | None = None) -> None:
        self.runs: list[Run] = []
        self._action = action

    def __call__(self, ctx: EventContext) -> None:
        self.runs.append(
            Run(
                ctx.event,
                ctx.instance_index,
                ctx.sequence,
                ctx.attempt,
                ctx.is_retry,
                ctx.started_at,
                ctx.partition_key,
            )
        )
        if self._action is not None:
            self._action(ctx)

    @property
    def events(self) -> list[Any]:
        return [run.event for run in self.runs]

    def of(self, event: Any) -> list[Run]:
        return [run for run in self.runs if run.event == event]


def noop(_ctx: EventContext) -> None:
    pass


def fail(ctx: EventContext) -> None:
    raise ValueError(f"boom {ctx.event}")


def fail_if_bad(ctx: EventContext) -> None:
    if ctx.event == "bad":
        fail(ctx)


def fail_first_attempt(ctx: EventContext) -> None:
    if ctx.attempt == 1:
        raise ValueError("first attempt fails")


def no_jitter(**options: Any) -> RetryPolicy:
    return RetryPolicy(jitter=0.0, **options)


def key_for(index: int, concurrency: int, prefix: str = "key") -> str:
    """A partition key that routes to ``index`` (``stable_hash(key) % N``, docs/guarantees.md)."""
    n = 0
    while stable_hash(f"{prefix}-{n}") % concurrency != index:
        n += 1
    return f"{prefix}-{n}"


def assert_counters_balance(status: PoolStatus) -> None:
    for instance in status.instances:
        assert instance.enqueued == (
            instance.succeeded + instance.dead_lettered + instance.drained + instance.pending
        ), instance
        assert instance.processed == instance.succeeded + instance.dead_lettered, instance
    assert status.processed == status.succeeded + status.dead_lettered


def reopen(old: Runtime, path: Path, **options: Any) -> Runtime:
    """Close ``old`` and open its store again on the same simulated clock (time continues)."""
    old.close()
    return Runtime(path, clock=old.clock, seed=0, **options)


# -- enqueue and routing -----------------------------------------------------------


def test_enqueue_returns_sequence_instance_and_position_round_robin(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop, concurrency=3)

    results = [pool.enqueue(n) for n in range(7)]

    assert results == [EnqueueResult(n // 3, n % 3, f"p:{n % 3}", n // 3) for n in range(7)]


def test_sequences_are_consecutive_per_instance_whatever_the_routing(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop, concurrency=3)

    results = [pool.enqueue(n) for n in range(4)]
    results += [pool.enqueue(n, partition_key=f"user-{n}") for n in range(10)]
    results += pool.enqueue_many(range(5))

    for index in range(3):
        sequences = [r.sequence for r in results if r.instance_index == index]
        assert sequences == list(range(len(sequences)))
    assert [s.enqueued for s in pool.status().instances] == [
        sum(r.instance_index == i for r in results) for i in range(3)
    ]


def test_same_partition_key_goes_to_the_same_instance_in_fifo_order(sim: Runtime) -> None:
    handler = Recorder()
    pool = sim.define("p", execute=handler, concurrency=4)
    keys = [f"user-{n}" for n in range(6)]

    results: dict[str, list[EnqueueResult]] = {key: [] for key in keys}
    for n in range(5):
        for key in keys:
            results[key].append(pool.enqueue({"key": key, "n": n}, partition_key=key))
    assert pool.join(timeout=10)

    for key in keys:
        assert {r.instance_index for r in results[key]} == {stable_hash(key) % 4}
        runs = [run for run in handler.runs if run.event["key"] == key]
        assert [run.event["n"] for run in runs] == [0, 1, 2, 3, 4]
        assert {run.partition_key for run in runs} == {key}


def test_partition_mapping_is_the_same_in_another_runtime(tmp_path: Path) -> None:
    keys = [f"order-{n}" for n in range(20)]
    placements = []
    for run in range(2):
        with Runtime.simulated(tmp_path / f"run-{run}") as runtime:
            pool = runtime.define("p", execute=noop, concurrency=5)
            placements.append([pool.enqueue(k, partition_key=k).instance_index for k in keys])
    assert placements[0] == placements[1]
    assert len(set(placements[0])) > 1  # the keys do spread over the instances


# -- priority --------------------------------------------------------------------


def test_higher_priority_runs_first_and_fifo_within_a_priority(sim: Runtime) -> None:
    handler = Recorder()
    pool = sim.define("p", execute=handler)

    enqueued = [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -3), ("f", 9)]
    positions = [pool.enqueue(name, priority=priority).position for name, priority in enqueued]
    assert pool.join(timeout=10)

    assert positions == [0, 0, 2, 1, 4, 0]
    assert handler.events == ["f", "b", "d", "a", "c", "e"]


def test_a_started_event_stays_current_through_its_backoff(sim: Runtime) -> None:
    handler = Recorder(lambda ctx: fail_first_attempt(ctx) if ctx.event == "low" else None)
    pool = sim.define("p", execute=handler, retry=no_jitter(max_attempts=2, initial_delay=10))

    assert pool.enqueue("low").position == 0
    clock_of(sim).advance(0)  # "low" starts at t=0, fails, and waits for t=10
    assert pool.status().instance(0).state == "backoff"

    # The started event of lower priority still runs first, so it counts in `position`.
    assert pool.enqueue("high", priority=5).position == 1
    assert pool.enqueue("high2", priority=5).position == 2
    assert pool.enqueue("low2").position == 3
    assert pool.join(timeout=10)

    assert [(run.event, run.attempt, run.started_at) for run in handler.runs] == [
        ("low", 1, 0.0),
        ("low", 2, 10.0),
        ("high", 1, 10.0),
        ("high2", 1, 10.0),
        ("low2", 1, 10.0),
    ]


# -- the simulated clock -----------------------------------------------------------


def test_nothing_runs_until_the_clock_is_driven(sim: Runtime) -> None:
    handler = Recorder()
    pool = sim.define("p", execute=handler)

    pool.enqueue("x")
    status = pool.status()

    assert handler.runs == []
    assert (status.pending, status.succeeded) == (1, 0)
    assert status.instance(0).state == "idle"
    assert status.instance(0).next_alarm_at == 0.0

    clock_of(sim).advance(0)  # the alarm was due at t=0 and fires only now
    assert handler.events == ["x"]
    assert pool.status().succeeded == 1


def test_join_timeout_is_wall_clock_under_the_simulated_clock(tmp_path: Path) -> None:
    """The handler blocks on a real event, so the clock has a thread per actor."""
    running, release = threading.Event(), threading.Event()

    def blocked(_ctx: EventContext) -> None:
        running.set()
        assert release.wait(10)  # blocks on a real event, not on virtual time

    with Runtime.simulated(tmp_path / "store", seed=0, backend="threads") as sim:
        pool = sim.define("p", execute=blocked)
        pool.enqueue("x")

        assert not pool.join(timeout=0.05)
        assert running.is_set()
        release.set()
        assert pool.join(timeout=10)
        assert pool.status().succeeded == 1


# -- handler outcomes --------------------------------------------------------------


def test_a_returning_handler_succeeds(sim: Runtime) -> None:
    handler = Recorder()
    pool = sim.define("p", execute=handler, retry=RetryPolicy())

    pool.enqueue({"n": 1})
    assert pool.join(timeout=10)

    [run] = handler.runs
    assert (run.event, run.attempt, run.is_retry, run.sequence) == ({"n": 1}, 1, False, 0)
    status = pool.status()
    assert (status.succeeded, status.processed, status.pending) == (1, 1, 0)
    assert status.dead_lettered == 0
    assert pool.dead_letters() == []


def test_retries_follow_the_policy_delays_exactly(sim: Runtime) -> None:
    handler = Recorder(fail)
    policy = no_jitter(max_attempts=5, initial_delay=1, multiplier=3, max_delay=5)
    pool = sim.define("p", execute=handler, retry=policy)

    pool.enqueue("x")
    assert pool.join(timeout=10)

    # Delays after attempts 1..4: min(1 * 3**(k-1), 5) = 1, 3, 5, 5.
    assert [run.started_at for run in handler.runs] == [0.0, 1.0, 4.0, 9.0, 14.0]
    assert [run.attempt for run in handler.runs] == [1, 2, 3, 4, 5]
    assert [run.is_retry for run in handler.runs] == [False, True, True, True, True]
    [dead] = pool.dead_letters()
    assert (dead.attempts, dead.failed_at) == (5, 14.0)


def test_retry_succeeds_on_a_later_attempt(sim: Runtime) -> None:
    handler = Recorder(fail_first_attempt)
    pool = sim.define("p", execute=handler, retry=no_jitter(initial_delay=2))

    pool.enqueue("x")
    assert pool.join(timeout=10)

    assert [(run.attempt, run.started_at) for run in handler.runs] == [(1, 0.0), (2, 2.0)]
    status = pool.status()
    assert (status.succeeded, status.dead_lettered) == (1, 0)


def _first_retry_delays(path: Path, seed: int) -> list[float]:
    """Delay between attempts 1 and 2 of five events, with 50 % jitter on 10 s."""
    handler = Recorder(fail_first_attempt)
    with Runtime.simulated(path, seed=seed) as runtime:
        policy = RetryPolicy(max_attempts=2, initial_delay=10, jitter=0.5)
        pool = runtime.define("p", execute=handler, retry=policy)
        pool.enqueue_many(range(5))
        assert pool.join(timeout=10)
    delays = []
    for n in range(5):
        first, second = handler.of(n)
        delays.append(second.started_at - first.started_at)
    return delays


def test_jitter_stays_within_bounds_and_follows_the_seed(tmp_path: Path) -> None:
    delays = _first_retry_delays(tmp_path / "a", seed=0)
    again = _first_retry_delays(tmp_path / "b", seed=0)
    other = _first_retry_delays(tmp_path / "c", seed=1)

    assert all(5.0 <= delay <= 15.0 for delay in delays + other)
    assert len(set(delays)) > 1  # actually jittered
    assert delays == again
    assert delays != other


def test_without_retry_policy_the_first_failure_dead_letters(sim: Runtime) -> None:
    handler = Recorder(fail)
    pool = sim.define("p", execute=handler, retry=None)

    pool.enqueue("x")
    assert pool.join(timeout=10)

    assert len(handler.runs) == 1
    [dead] = pool.dead_letters()
    assert dead.attempts == 1
    assert pool.status().dead_lettered == 1


def test_permanent_error_dead_letters_at_once(sim: Runtime) -> None:
    def reject(_ctx: EventContext) -> None:
        raise PermanentError("bad input")

    handler = Recorder(reject)
    pool = sim.define("p", execute=handler, retry=no_jitter(max_attempts=5))

    pool.enqueue("x")
    assert pool.join(timeout=10)

    assert len(handler.runs) == 1
    [dead] = pool.dead_letters()
    assert dead.attempts == 1
    assert "PermanentError" in dead.error
    assert "bad input" in dead.error


def test_retry_after_retries_exactly_then_dead_letters(sim: Runtime) -> None:
    def later(_ctx: EventContext) -> None:
        raise RetryAfter(7)

    handler = Recorder(later)
    # The policy's own delay and jitter must not apply to RetryAfter.
    policy = RetryPolicy(max_attempts=3, initial_delay=1, jitter=0.5)
    pool = sim.define("p", execute=handler, retry=policy)

    pool.enqueue("x")
    assert pool.join(timeout=10)

    assert [run.started_at for run in handler.runs] == [0.0, 7.0, 14.0]
    [dead] = pool.dead_letters()
    assert (dead.attempts, dead.failed_at) == (3, 14.0)


def test_retry_after_then_success(sim: Runtime) -> None:
    def later_once(ctx: EventContext) -> None:
        if ctx.attempt == 1:
            raise RetryAfter(7)

    handler = Recorder(later_once)
    pool = sim.define("p", execute=handler, retry=RetryPolicy(max_attempts=2, initial_delay=100))

    pool.enqueue("x")
    assert pool.join(timeout=10)

    assert [(run.attempt, run.is_retry, run.started_at) for run in handler.runs] == [
        (1, False, 0.0),
        (2, True, 7.0),
    ]
    assert pool.status().succeeded == 1


# -- dead letters --------------------------------------------------------------------


def test_dead_letter_fields(sim: Runtime) -> None:
    key = key_for(1, 2)
    policy = no_jitter(max_attempts=2, initial_delay=3)
    pool = sim.define("p", execute=fail, concurrency=2, retry=policy)

    clock_of(sim).advance(2)
    result = pool.enqueue({"n": 42, "pair": (1, 2)}, partition_key=key, priority=4)
    assert pool.join(timeout=10)

    [dead] = pool.dead_letters()
    assert isinstance(dead, DeadLetter)
    assert (dead.sequence, dead.instance_index) == (result.sequence, 1)
    assert dead.event == {"n": 42, "pair": [1, 2]}
    assert "ValueError" in dead.error
    assert "boom" in dead.error
    assert dead.attempts == 2
    assert (dead.enqueued_at, dead.failed_at) == (2.0, 5.0)
    assert dead.partition_key == key
    assert pool.dead_letters(0) == []
    assert pool.dead_letters(1) == [dead]


def test_on_dead_letter_runs_after_the_record_commits(sim: Runtime) -> None:
    pools: list[WorkerPool] = []
    seen: list[tuple[DeadLetter, list[DeadLetter], int]] = []

    def on_dead_letter(dead: DeadLetter) -> None:
        # Reading committed state is fine from a hook; messaging the instance is not.
        pool = pools[0]
        seen.append((dead, pool.dead_letters(), pool.status().dead_lettered))

    pools.append(sim.define("p", execute=fail, on_dead_letter=on_dead_letter))
    pools[0].enqueue("x")
    assert pools[0].join(timeout=10)

    [dead] = pools[0].dead_letters()
    assert seen == [(dead, [dead], 1)]


def test_a_raising_on_dead_letter_is_logged_and_the_queue_moves_on(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    def on_dead_letter(_dead: DeadLetter) -> None:
        raise RuntimeError("hook broke")

    handler = Recorder(fail_if_bad)
    pool = sim.define("p", execute=handler, on_dead_letter=on_dead_letter)

    with caplog.at_level(logging.ERROR, logger="dopool"):
        pool.enqueue("bad")
        pool.enqueue("good")
        assert pool.join(timeout=10)

    assert handler.events == ["bad", "good"]
    status = pool.status()
    assert (status.dead_lettered, status.succeeded) == (1, 1)
    [record] = [r for r in caplog.records if r.exc_info and "on_dead_letter" in r.getMessage()]
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)


def _pool_with_two_dead_letters(sim: Runtime) -> tuple[WorkerPool, Recorder]:
    """Two events dead-lettered, then a handler that succeeds from now on."""
    broken = {"now": True}
    handler = Recorder(lambda ctx: fail(ctx) if broken["now"] else None)
    pool = sim.define("p", execute=handler, retry=no_jitter(max_attempts=2))
    pool.enqueue("a", partition_key="ka", priority=3)
    pool.enqueue("b")
    assert pool.join(timeout=10)
    assert [d.event for d in pool.dead_letters()] == ["a", "b"]
    broken["now"] = False
    return pool, handler


def test_redrive_re_enqueues_every_dead_letter_as_a_new_event(sim: Runtime) -> None:
    pool, handler = _pool_with_two_dead_letters(sim)
    handler.runs.clear()

    assert pool.redrive() == 2
    assert pool.dead_letters() == []
    status = pool.status()
    assert (status.enqueued, status.pending, status.dead_lettered) == (4, 2, 2)
    assert pool.join(timeout=10)

    assert [(run.event, run.sequence, run.attempt) for run in handler.runs] == [
        ("a", 2, 1),
        ("b", 3, 1),
    ]
    assert handler.runs[0].partition_key == "ka"
    status = pool.status()
    assert (status.enqueued, status.succeeded, status.dead_lettered) == (4, 2, 2)
    assert_counters_balance(status)


def test_redrive_only_the_given_dead_letters(sim: Runtime) -> None:
    pool, handler = _pool_with_two_dead_letters(sim)
    handler.runs.clear()
    first, second = pool.dead_letters()

    assert pool.redrive([second]) == 1
    assert pool.dead_letters() == [first]
    assert pool.join(timeout=10)

    assert handler.events == ["b"]
    assert pool.status().enqueued == 3


def test_purge_dead_letters_changes_no_counter(sim: Runtime) -> None:
    pool, _ = _pool_with_two_dead_letters(sim)
    before = pool.status()

    assert pool.purge_dead_letters() == 2
    assert pool.dead_letters() == []
    after = pool.status()
    assert (before.dead_letters_held, after.dead_letters_held) == (2, 0)  # held, not counted
    assert counters(after) == counters(before)
    assert pool.purge_dead_letters() == 0
    assert pool.redrive() == 0


# -- pause and resume ---------------------------------------------------------------


def test_a_paused_pool_accepts_enqueues_and_processes_nothing(sim: Runtime) -> None:
    handler = Recorder()
    pool = sim.define("p", execute=handler, concurrency=2)

    pool.pause()
    pool.enqueue_many(range(4))

    assert not pool.join(timeout=10)
    assert handler.runs == []
    status = pool.status()
    assert status.pending == 4
    assert [s.state for s in status.instances] == ["paused", "paused"]
    assert [s.next_alarm_at for s in status.instances] == [None, None]

    pool.resume()
    assert pool.join(timeout=10)
    assert sorted(handler.events) == [0, 1, 2, 3]
    assert [s.state for s in pool.status().instances] == ["idle", "idle"]


def test_pause_and_resume_one_instance(sim: Runtime) -> None:
    handler = Recorder()
    pool = sim.define("p", execute=handler, concurrency=2)

    pool.pause(1)
    pool.enqueue_many(range(4))  # round-robin: 0, 2 on instance 0; 1, 3 on instance 1

    assert not pool.join(timeout=10)
    assert handler.events == [0, 2]
    assert [s.state for s in pool.status().instances] == ["idle", "paused"]

    pool.resume(1)
    assert pool.join(timeout=10)
    assert handler.events == [0, 2, 1, 3]


@pytest.mark.parametrize(
    ("resume_at", "retry_starts_at"),
    [(4.0, 10.0), (25.0, 25.0)],
    ids=["resume-before-retry-time", "resume-after-retry-time"],
)
def test_a_retry_in_backoff_waits_for_resume_and_keeps_its_backoff(
    sim: Runtime, resume_at: float, retry_starts_at: float
) -> None:
    handler = Recorder(fail_first_attempt)
    pool = sim.define("p", execute=handler, retry=no_jitter(initial_delay=10))

    pool.enqueue("x")
    clock_of(sim).advance(0)  # attempt 1 fails at t=0; the retry is due at t=10
    pool.pause()
    assert pool.status().instance(0).next_alarm_at is None
    clock_of(sim).run_until(resume_at)
    assert len(handler.runs) == 1

    pool.resume()
    assert pool.status().instance(0).state == "backoff"
    assert pool.join(timeout=10)

    assert [(run.attempt, run.started_at) for run in handler.runs] == [
        (1, 0.0),
        (2, retry_starts_at),
    ]


# -- drain -----------------------------------------------------------------------------


def test_drain_removes_pending_events_and_keeps_the_rest(sim: Runtime) -> None:
    empties: list[EmptyInfo] = []
    handler = Recorder(fail_if_bad)
    pool = sim.define("p", execute=handler, on_empty=empties.append)
    pool.enqueue("bad")
    assert pool.join(timeout=10)
    assert len(empties) == 1
    handler.runs.clear()

    pool.pause()
    pool.enqueue_many(["a", "b", "c"])
    assert pool.drain() == 3

    status = pool.status()
    [instance] = status.instances
    assert (instance.pending, instance.drained, instance.enqueued) == (0, 3, 4)
    assert (instance.dead_lettered, instance.succeeded) == (1, 0)
    assert instance.state == "paused"
    assert instance.next_alarm_at is None
    assert len(pool.dead_letters()) == 1
    assert len(empties) == 1  # drain does not call on_empty
    assert_counters_balance(status)

    pool.resume()
    assert pool.join(timeout=10)
    assert handler.runs == []


def test_drain_clears_a_retry_in_backoff(sim: Runtime) -> None:
    empties: list[EmptyInfo] = []
    handler = Recorder(fail_first_attempt)
    policy = no_jitter(initial_delay=10)
    pool = sim.define("p", execute=handler, retry=policy, on_empty=empties.append)

    pool.enqueue_many(["a", "b"])
    clock_of(sim).advance(0)
    assert pool.status().instance(0).state == "backoff"

    assert pool.drain() == 2
    [instance] = pool.status().instances
    assert instance.state == "idle"
    assert (instance.current_sequence, instance.attempt, instance.next_alarm_at) == (None, 0, None)
    assert pool.join(timeout=10)
    clock_of(sim).advance(100)

    assert [run.event for run in handler.runs] == ["a"]
    assert empties == []
    assert_counters_balance(pool.status())


def test_drain_one_instance(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop, concurrency=2)

    pool.enqueue_many(range(5))  # 3 on instance 0, 2 on instance 1

    assert pool.drain(1) == 2
    assert [s.pending for s in pool.status().instances] == [3, 0]
    assert pool.drain() == 3


# -- on_empty ------------------------------------------------------------------------


def test_on_empty_is_called_once_per_transition_to_empty(sim: Runtime) -> None:
    empties: list[EmptyInfo] = []
    pool = sim.define(
        "p",
        execute=fail_if_bad,
        on_empty=empties.append,
    )

    pool.enqueue_many(["a", "b", "c"])
    assert pool.join(timeout=10)
    assert empties == [EmptyInfo("p", 0, "p:0", 3)]

    clock_of(sim).advance(100)
    assert pool.join(timeout=10)
    assert len(empties) == 1

    pool.enqueue("bad")  # a dead letter empties the queue too
    assert pool.join(timeout=10)
    assert empties == [EmptyInfo("p", 0, "p:0", 3), EmptyInfo("p", 0, "p:0", 4)]


def test_on_empty_is_not_called_by_an_idle_alarm(sim: Runtime) -> None:
    empties: list[EmptyInfo] = []
    pool = sim.define("p", execute=noop, on_empty=empties.append)
    pool.enqueue("a")
    assert pool.join(timeout=10)

    # Alarm delivery is at-least-once: a redelivered alarm finds nothing to do.
    pool._instances.cells[0].mailbox.fire_alarm()
    assert pool.join(timeout=10)

    assert len(empties) == 1


def test_a_raising_on_empty_is_logged_and_ignored(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[EmptyInfo] = []

    def on_empty(info: EmptyInfo) -> None:
        calls.append(info)
        raise RuntimeError("hook broke")

    pool = sim.define("p", execute=noop, on_empty=on_empty)
    with caplog.at_level(logging.ERROR, logger="dopool"):
        pool.enqueue("a")
        assert pool.join(timeout=10)
        pool.enqueue("b")
        assert pool.join(timeout=10)

    assert [info.processed for info in calls] == [1, 2]
    assert pool.status().succeeded == 2
    assert any("on_empty" in r.getMessage() for r in caplog.records)


# -- status ----------------------------------------------------------------------------


def test_status_of_a_new_pool(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop, concurrency=2)

    status = pool.status()

    assert (status.name, status.concurrency) == ("p", 2)
    assert (status.enqueued, status.pending, status.processed) == (0, 0, 0)
    for index, instance in enumerate(status.instances):
        assert (instance.index, instance.instance_id) == (index, f"p:{index}")
        assert (instance.state, instance.current_sequence, instance.attempt) == ("idle", None, 0)
        assert (instance.next_alarm_at, instance.restarts) == (None, 0)


def test_status_counters_after_mixed_outcomes(sim: Runtime) -> None:
    k0, k1 = key_for(0, 2), key_for(1, 2)
    pool = sim.define("p", execute=fail_if_bad, concurrency=2)

    pool.enqueue_many(["ok", "ok", "bad"], partition_key=k0)
    pool.enqueue_many(["x", "y"], partition_key=k1)
    pool.drain(1)
    pool.pause(1)
    pool.enqueue("z", partition_key=k1)
    assert not pool.join(timeout=10)  # instance 1 is paused with one event

    status = pool.status()
    first, second = status.instances
    assert (first.enqueued, first.succeeded, first.dead_lettered, first.processed) == (3, 2, 1, 3)
    assert (first.pending, first.drained, first.state) == (0, 0, "idle")
    assert (second.enqueued, second.drained, second.pending, second.processed) == (3, 2, 1, 0)
    assert second.state == "paused"
    assert (status.enqueued, status.succeeded, status.dead_lettered) == (6, 2, 1)
    assert (status.drained, status.pending, status.processed) == (2, 1, 3)
    assert_counters_balance(status)


def test_status_shows_backoff_while_a_retry_waits(sim: Runtime) -> None:
    pool = sim.define("p", execute=fail, retry=no_jitter(initial_delay=10))

    pool.enqueue("x")
    clock_of(sim).advance(3)

    [instance] = pool.status().instances
    assert instance.state == "backoff"
    assert (instance.current_sequence, instance.attempt) == (0, 1)
    assert instance.next_alarm_at == 10.0
    assert instance.pending == 1


def test_status_shows_processing_from_inside_the_handler(sim: Runtime) -> None:
    pools: list[WorkerPool] = []
    seen: list[tuple[str, int | None, int, int]] = []

    def handler(ctx: EventContext) -> None:
        instance = pools[0].status().instance(ctx.instance_index)
        seen.append((instance.state, instance.current_sequence, instance.attempt, ctx.sequence))

    pools.append(sim.define("p", execute=handler, concurrency=2))
    pools[0].enqueue_many(["a", "b", "c"])
    assert pools[0].join(timeout=10)

    # (state, current_sequence, attempt) as committed, then the handler's own sequence
    expected = [("processing", 0, 1, 0), ("processing", 0, 1, 0), ("processing", 1, 1, 1)]
    assert sorted(seen) == expected


# -- follow-ups --------------------------------------------------------------------


def test_follow_ups_reach_this_and_other_instances(sim: Runtime) -> None:
    keys = [key_for(i, 3) for i in range(3)]

    def fan_out(ctx: EventContext) -> None:
        if ctx.event == "parent":
            for index, key in enumerate(keys):
                ctx.enqueue(f"child-{index}", partition_key=key)

    handler = Recorder(fan_out)
    pool = sim.define("p", execute=handler, concurrency=3)

    pool.enqueue("parent", partition_key=keys[0])
    assert pool.join(timeout=10)

    assert sorted((run.event, run.index) for run in handler.runs) == [
        ("child-0", 0),
        ("child-1", 1),
        ("child-2", 2),
        ("parent", 0),
    ]
    status = pool.status()
    assert [s.enqueued for s in status.instances] == [2, 1, 1]
    assert status.succeeded == 4
    assert_counters_balance(status)


def test_follow_ups_are_not_refused_by_max_queue_depth(sim: Runtime) -> None:
    k0, k1 = key_for(0, 2), key_for(1, 2)

    def fan_out(ctx: EventContext) -> None:
        if ctx.event == "parent":
            for n in range(3):
                ctx.enqueue(f"self-{n}", partition_key=k0)
                ctx.enqueue(f"other-{n}", partition_key=k1)

    handler = Recorder(fan_out)
    pool = sim.define("p", execute=handler, concurrency=2, max_queue_depth=1)
    pool.pause(1)
    pool.enqueue("filler", partition_key=k1)
    with pytest.raises(QueueFullError):
        pool.enqueue("refused", partition_key=k1)

    pool.enqueue("parent", partition_key=k0)
    assert not pool.join(timeout=10)  # instance 1 is paused

    assert handler.events == ["parent", "self-0", "self-1", "self-2"]
    assert [s.pending for s in pool.status().instances] == [0, 4]
    pool.resume(1)
    assert pool.join(timeout=10)
    assert handler.events[4:] == ["filler", "other-0", "other-1", "other-2"]


def test_follow_ups_of_a_failed_attempt_are_discarded(sim: Runtime) -> None:
    k0, k1 = key_for(0, 2), key_for(1, 2)

    def fan_out_then_fail_once(ctx: EventContext) -> None:
        if ctx.event == "parent":
            ctx.enqueue(f"self-from-attempt-{ctx.attempt}", partition_key=k0)
            ctx.enqueue(f"other-from-attempt-{ctx.attempt}", partition_key=k1)
            fail_first_attempt(ctx)

    handler = Recorder(fan_out_then_fail_once)
    pool = sim.define("p", execute=handler, concurrency=2, retry=no_jitter())

    pool.enqueue("parent", partition_key=k0)
    assert pool.join(timeout=10)

    children = sorted(event for event in handler.events if event != "parent")
    assert children == ["other-from-attempt-2", "self-from-attempt-2"]
    assert pool.status().enqueued == 3


def test_follow_ups_of_a_dead_lettered_event_are_discarded(sim: Runtime) -> None:
    def fan_out_then_reject(ctx: EventContext) -> None:
        ctx.enqueue("child")
        raise PermanentError("no")

    pool = sim.define("p", execute=fan_out_then_reject, concurrency=2)

    pool.enqueue("parent")
    assert pool.join(timeout=10)

    status = pool.status()
    assert (status.enqueued, status.dead_lettered, status.succeeded) == (1, 1, 0)


def test_join_waits_for_chains_of_follow_ups(sim: Runtime) -> None:
    def count_down(ctx: EventContext) -> None:
        ctx.sleep(1)
        if ctx.event > 0:
            ctx.enqueue(ctx.event - 1)  # round-robin: hops to another instance

    handler = Recorder(count_down)
    pool = sim.define("p", execute=handler, concurrency=3)

    pool.enqueue(5)
    assert pool.join(timeout=10)

    assert [(run.event, run.started_at) for run in handler.runs] == [
        (n, float(5 - n)) for n in range(5, -1, -1)
    ]
    assert len({run.index for run in handler.runs}) == 3
    status = pool.status()
    assert (status.pending, status.succeeded) == (0, 6)
    assert sim.clock.now() == 6.0


# -- ctx.sleep under the simulated clock ---------------------------------------------


def test_sleep_advances_virtual_time_and_sleeps_overlap(sim: Runtime) -> None:
    woke: list[tuple[int, float]] = []

    def nap(ctx: EventContext) -> None:
        ctx.sleep(5)
        woke.append((ctx.instance_index, sim.clock.now()))

    pool = sim.define("p", execute=nap, concurrency=2)
    pool.enqueue_many(["a", "b"])
    assert pool.join(timeout=10)

    assert sorted(woke) == [(0, 5.0), (1, 5.0)]
    assert sim.clock.now() == 5.0


def test_a_sleeping_instance_does_not_block_the_others(sim: Runtime) -> None:
    k0, k1 = key_for(0, 2), key_for(1, 2)
    finished: list[tuple[str, float]] = []

    def handler(ctx: EventContext) -> None:
        if ctx.event == "slow":
            ctx.sleep(100)
        finished.append((ctx.event, sim.clock.now()))

    pool = sim.define("p", execute=handler, concurrency=2)
    pool.enqueue("slow", partition_key=k0)
    pool.enqueue_many(["fast-1", "fast-2", "fast-3"], partition_key=k1)

    clock_of(sim).run_until(50)
    first, second = pool.status().instances
    assert first.state == "processing"
    assert (second.state, second.succeeded) == ("idle", 3)
    assert finished == [("fast-1", 0.0), ("fast-2", 0.0), ("fast-3", 0.0)]

    assert pool.join(timeout=10)
    assert finished[-1] == ("slow", 100.0)


@pytest.mark.parametrize("seconds", [math.nan, math.inf, "5"], ids=["nan", "inf", "str"])
def test_a_sleep_of_no_finite_time_fails_the_attempt_and_moves_no_clock(
    sim: Runtime, seconds: Any
) -> None:
    """NaN never woke the handler (close waited for it for ever); infinity moved the
    simulated clock to it, and every later time with it."""

    def nap(ctx: EventContext) -> None:
        ctx.sleep(seconds)

    pool = sim.define("p", execute=nap)
    later = sim.define("q", execute=lambda ctx: None)
    pool.enqueue("x")
    later.enqueue("y", delay=50)
    assert pool.join(timeout=10)
    [dead] = pool.dead_letters()
    assert dead.error.startswith("ConfigurationError: ctx.sleep")
    assert later.join(timeout=10)
    assert sim.clock.now() == 50.0


def test_a_sleep_past_the_last_clock_time_fails_the_attempt(sim: Runtime) -> None:
    """Two sleeps of 1e308 took the simulated clock to infinity, and the next write
    stored it: the meta record failed its checks, and the pool was refused for good."""

    def nap(ctx: EventContext) -> None:
        ctx.sleep(1e308)
        ctx.sleep(1e308)

    pool = sim.define("p", execute=nap)
    pool.enqueue("x")
    assert pool.join(timeout=10)
    [dead] = pool.dead_letters()
    assert dead.error == "ConfigurationError: ctx.sleep(1e+308) would wake past any clock time"
    assert sim.clock.now() == 1e308
    pool.enqueue("y")  # the pool is readable and writable
    assert pool.status().pending == 1


# -- validation ------------------------------------------------------------------------


def _assert_nothing_stored(pool: WorkerPool, seen: list[PoolEvent]) -> None:
    status = pool.status()
    assert (status.enqueued, status.pending) == (0, 0)
    assert seen == []


@pytest.mark.parametrize(
    "event",
    [{1, 2}, object(), {"nested": {1}}, [1, object()], 2**64],
    ids=["set", "object", "nested-set", "list-with-object", "int-too-big"],
)
def test_unencodable_events_are_rejected(sim: Runtime, event: Any) -> None:
    pool = sim.define("p", execute=noop)
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    with pytest.raises(EventValidationError):
        pool.enqueue(event)
    _assert_nothing_stored(pool, seen)


def test_encodable_values_round_trip_and_tuples_become_lists(sim: Runtime) -> None:
    handler = Recorder()
    pool = sim.define("p", execute=handler)
    event = {"s": "text", "i": -3, "f": 1.5, "b": True, "n": None, "raw": b"\x00", "t": (1, (2,))}

    pool.enqueue(event)
    assert pool.join(timeout=10)

    assert handler.events == [{**event, "t": [1, [2]]}]


def test_a_schema_rejection_stores_nothing(sim: Runtime) -> None:
    def schema(event: Any) -> Any:
        if not isinstance(event, dict):
            raise TypeError("want a dict")
        return event

    pool = sim.define("p", execute=noop, schema=schema)
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    with pytest.raises(EventValidationError, match="want a dict"):
        pool.enqueue("not a dict")
    _assert_nothing_stored(pool, seen)


def test_the_schema_result_is_what_is_stored(sim: Runtime) -> None:
    handler = Recorder(lambda ctx: ctx.enqueue(0) if ctx.event["value"] > 0 else None)
    pool = sim.define("p", execute=handler, schema=lambda event: {"value": event})

    pool.enqueue(7)
    assert pool.join(timeout=10)

    assert handler.events == [{"value": 7}, {"value": 0}]  # follow-ups pass the schema too


def test_an_event_over_128_kib_is_rejected(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop)
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    with pytest.raises(EventTooLargeError) as info:
        pool.enqueue(b"x" * (MAX_EVENT_BYTES - 4))  # msgpack adds a 5-byte header
    assert (info.value.size, info.value.limit) == (MAX_EVENT_BYTES + 1, MAX_EVENT_BYTES)
    _assert_nothing_stored(pool, seen)

    pool.enqueue(b"x" * (MAX_EVENT_BYTES - 5))  # exactly 128 KiB encoded is fine
    assert pool.status().enqueued == 1


@pytest.mark.parametrize(
    "key",
    ["k" * (MAX_PARTITION_KEY_BYTES + 1), "é" * (MAX_PARTITION_KEY_BYTES // 2 + 1)],
    ids=["ascii", "two-byte-utf8"],
)
def test_a_partition_key_over_2_kib_is_rejected(sim: Runtime, key: str) -> None:
    pool = sim.define("p", execute=noop)
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    with pytest.raises(EventTooLargeError):
        pool.enqueue("x", partition_key=key)
    _assert_nothing_stored(pool, seen)


def test_a_partition_key_of_exactly_2_kib_is_accepted(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop)

    pool.enqueue("x", partition_key="k" * MAX_PARTITION_KEY_BYTES)
    pool.enqueue("x", partition_key="é" * (MAX_PARTITION_KEY_BYTES // 2))

    assert pool.status().enqueued == 2


@pytest.mark.parametrize("priority", [2**31, -(2**31) - 1, 1.5, "1", True, None])
def test_a_bad_priority_is_rejected(sim: Runtime, priority: Any) -> None:
    pool = sim.define("p", execute=noop)
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    with pytest.raises(EventValidationError):
        pool.enqueue("x", priority=priority)
    _assert_nothing_stored(pool, seen)


def test_extreme_priorities_are_accepted_and_ordered(sim: Runtime) -> None:
    handler = Recorder()
    pool = sim.define("p", execute=handler)

    pool.enqueue("lowest", priority=-(2**31))
    pool.enqueue("default")
    pool.enqueue("highest", priority=2**31 - 1)
    assert pool.join(timeout=10)

    assert handler.events == ["highest", "default", "lowest"]


def test_a_full_instance_refuses_enqueue(sim: Runtime) -> None:
    key = key_for(1, 2)
    pool = sim.define("p", execute=noop, concurrency=2, max_queue_depth=2)
    pool.enqueue_many(["a", "b"], partition_key=key)

    with pytest.raises(QueueFullError) as info:
        pool.enqueue("c", partition_key=key)

    assert (info.value.instance_index, info.value.depth, info.value.max_depth) == (1, 2, 2)
    assert pool.status().instance(1).enqueued == 2
    pool.enqueue("d", partition_key=key_for(0, 2))  # the other instance still has room


@pytest.mark.parametrize(
    "name",
    ["", "a" * 65, "has space", "a/b", "a:b", "ü", 7, None],
    ids=["empty", "too-long", "space", "slash", "colon", "non-ascii", "int", "none"],
)
def test_a_bad_pool_name_is_refused(sim: Runtime, name: Any) -> None:
    with pytest.raises(ConfigurationError):
        sim.define(name, execute=noop)


def test_good_pool_names_are_accepted(sim: Runtime) -> None:
    for name in ["a" * 64, "A-z_0.9", "x"]:
        assert sim.define(name, execute=noop).name == name


def test_defining_a_name_twice_is_refused(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop)

    with pytest.raises(ConfigurationError):
        sim.define("p", execute=noop)
    pool.enqueue("still works")
    assert pool.status().enqueued == 1


@pytest.mark.parametrize("concurrency", [0, -1, "2", True, 1.5])
def test_a_bad_concurrency_is_refused(sim: Runtime, concurrency: Any) -> None:
    with pytest.raises(ConfigurationError):
        sim.define("p", execute=noop, concurrency=concurrency)
    assert sim.define("p", execute=noop, concurrency=2).concurrency == 2  # the name is still free


@pytest.mark.parametrize("concurrency", [MAX_CONCURRENCY + 1, 2**40, 10**18])
def test_a_concurrency_over_the_maximum_is_refused_before_anything_starts(
    sim: Runtime, concurrency: int
) -> None:
    with pytest.raises(ConfigurationError) as info:
        sim.define("p", execute=noop, concurrency=concurrency)
    assert f"<= {MAX_CONCURRENCY}" in str(info.value)
    assert pykka.ActorRegistry.get_all() == running_instances() == []
    with sim._store.read() as txn:
        assert sim._store.get_pool(txn, "p") is None


@pytest.mark.parametrize(
    "body",
    [
        [MAX_CONCURRENCY + 1, False],
        [0, False],
        [-1, False],
        ["2", False],
        [2.0, False],
        [None, False],
        [2, None],
        [2, 1],
        [2],  # format 8's
        {"concurrency": 2},
        [],
    ],
    ids=repr,
)
def test_a_corrupt_stored_concurrency_is_a_damaged_record(sim: Runtime, body: Any) -> None:
    with sim._store.write() as txn:
        txn.put(b"Pp", seal(b"Pp", pack(body)))
    with pytest.raises(DamagedRecordError, match="pool record 'p'") as info:
        sim.define("p", execute=noop, concurrency=2)
    assert info.value.key == b"Pp"
    assert pykka.ActorRegistry.get_all() == running_instances() == []


def test_the_maximum_concurrency_is_documented_and_fits_the_benchmarks() -> None:
    assert MAX_CONCURRENCY >= 10**6  # benchmarks/activation.py defines a million instances
    docs = Path(__file__).parents[2] / "docs"
    for page in ("api.md", "guarantees.md"):
        assert "2**32" in (docs / page).read_text(), page


@pytest.mark.parametrize("execute", [None, "handler", 3])
def test_a_non_callable_execute_is_refused(sim: Runtime, execute: Any) -> None:
    with pytest.raises(ConfigurationError):
        sim.define("p", execute=execute)


@pytest.mark.parametrize("depth", [0, -1, "5", True, 2.5])
def test_a_bad_max_queue_depth_is_refused(sim: Runtime, depth: Any) -> None:
    with pytest.raises(ConfigurationError):
        sim.define("p", execute=noop, max_queue_depth=depth)


@pytest.mark.parametrize("retry", [{"max_attempts": 3}, 3, "retry", RetryPolicy])
def test_a_bad_retry_is_refused(sim: Runtime, retry: Any) -> None:
    with pytest.raises(ConfigurationError):
        sim.define("p", execute=noop, retry=retry)


@pytest.mark.parametrize("durability", ["fast", "SYNC", None])
def test_a_bad_durability_is_refused(tmp_path: Path, durability: Any) -> None:
    with pytest.raises(ConfigurationError):
        Runtime(tmp_path / "store", durability=durability)


class _EmptyPath(os.PathLike[str]):
    def __fspath__(self) -> str:
        return ""


@pytest.mark.parametrize(
    "path",
    ["", _EmptyPath(), None, 5, b"store", "st\0re"],
    ids=["empty", "empty-pathlike", "none", "int", "bytes", "nul"],
)
def test_a_bad_store_path_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Any
) -> None:
    monkeypatch.chdir(tmp_path)  # "" used to mean the current directory
    with pytest.raises(ConfigurationError, match="path"):
        Runtime(path)
    if path is not None:  # Runtime.simulated(None) uses a temporary directory
        with pytest.raises(ConfigurationError, match="path"):
            Runtime.simulated(path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "seed", [object(), 1.5, True, b"seed", [1]], ids=["object", "float", "bool", "bytes", "list"]
)
def test_a_bad_seed_is_refused(tmp_path: Path, seed: Any) -> None:
    store = tmp_path / "store"
    with pytest.raises(ConfigurationError, match="seed"):
        Runtime(store, seed=seed)
    with pytest.raises(ConfigurationError, match="seed"):
        Runtime.simulated(store, seed=seed)
    assert not store.exists()


def test_an_empty_dopool_path_means_the_default_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOPOOL_PATH", "")
    monkeypatch.setattr(dopool._handles.runtime, "_default", None)
    runtime = dopool._handles.runtime.default_runtime()
    try:
        assert runtime.path == Path(".dopool")
        assert (tmp_path / ".dopool" / "lock").is_file()
        assert not (tmp_path / "lock").exists()
    finally:
        runtime.close()


def test_a_refused_simulated_runtime_leaves_no_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for options in ({"seed": object()}, {"durability": "fast"}):
        with pytest.raises(ConfigurationError):
            Runtime.simulated(**options)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", [0, -3, 2**80, "", "run-7", None])
def test_int_str_and_none_seeds_are_taken(tmp_path: Path, seed: int | str | None) -> None:
    with Runtime.simulated(tmp_path / "store", seed=seed) as runtime:
        assert runtime.seed == seed if seed is not None else isinstance(runtime.seed, int)


def test_enqueue_many_with_one_bad_event_stores_nothing(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop, concurrency=2)
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    with pytest.raises(EventValidationError) as invalid:
        pool.enqueue_many([1, 2, {3}, 4])
    with pytest.raises(EventTooLargeError) as too_large:
        pool.enqueue_many([1, b"x" * MAX_EVENT_BYTES, 3])

    assert invalid.value.position == 2
    assert too_large.value.position == 1
    _assert_nothing_stored(pool, seen)


@pytest.mark.parametrize(
    "events",
    [
        5,
        None,
        1.5,
        object(),
        "abc",
        b"abc",
        bytearray(b"abc"),
        memoryview(b"abc"),
        {"a": 1, "b": 2},
        MappingProxyType({"a": 1}),
    ],
    ids=lambda events: type(events).__name__,
)
def test_enqueue_many_refuses_what_is_not_a_batch_of_events(sim: Runtime, events: Any) -> None:
    pool = sim.define("p", execute=noop, concurrency=2)
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    with pytest.raises(EventValidationError) as info:
        pool.enqueue_many(events)

    assert type(events).__name__ in str(info.value)
    assert info.value.position is None
    _assert_nothing_stored(pool, seen)


def test_enqueue_many_takes_lists_tuples_generators_and_other_iterables(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop, concurrency=2)
    stored = [
        pool.enqueue_many(["a", "b"]),
        pool.enqueue_many(("c",)),
        pool.enqueue_many(f"g{n}" for n in range(3)),
        pool.enqueue_many(range(2)),
        pool.enqueue_many({"k": "v"}.values()),
        pool.enqueue_many(iter([])),
    ]
    assert [len(results) for results in stored] == [2, 1, 3, 2, 1, 0]
    assert pool.status().enqueued == 9


def test_enqueue_many_reports_what_other_instances_stored(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop, concurrency=2, max_queue_depth=2)

    # Round-robin: positions 0, 2, 4 go to instance 0 (3 > 2: refused), 1, 3 to instance 1.
    with pytest.raises(QueueFullError) as info:
        pool.enqueue_many(["a", "b", "c", "d", "e"])

    assert (info.value.instance_index, info.value.max_depth) == (0, 2)
    assert list(info.value.stored) == [EnqueueResult(0, 1, "p:1", 0), EnqueueResult(1, 1, "p:1", 1)]
    assert [s.enqueued for s in pool.status().instances] == [0, 2]


def test_enqueue_many_results_are_in_input_order(sim: Runtime) -> None:
    pool = sim.define("p", execute=noop, concurrency=2)

    results = pool.enqueue_many(["a", "b", "c"])
    keyed = pool.enqueue_many(["d", "e"], partition_key=key_for(1, 2))

    assert [(r.instance_index, r.sequence) for r in results] == [(0, 0), (1, 0), (0, 1)]
    assert [(r.instance_index, r.sequence, r.position) for r in keyed] == [(1, 1, 1), (1, 2, 2)]
    assert pool.enqueue_many([]) == []


# -- a closed runtime -------------------------------------------------------------------


POOL_METHODS: dict[str, Callable[[WorkerPool], Any]] = {
    "enqueue": lambda pool: pool.enqueue("x"),
    "enqueue_many": lambda pool: pool.enqueue_many(["x"]),
    "pause": lambda pool: pool.pause(),
    "pause_one": lambda pool: pool.pause(0),
    "resume": lambda pool: pool.resume(),
    "drain": lambda pool: pool.drain(),
    "status": lambda pool: pool.status(),
    "join": lambda pool: pool.join(timeout=1),
    "dead_letters": lambda pool: pool.dead_letters(),
    "redrive": lambda pool: pool.redrive(),
    "redrive_some": lambda pool: pool.redrive([]),
    "purge_dead_letters": lambda pool: pool.purge_dead_letters(),
}


@pytest.mark.parametrize("method", POOL_METHODS.values(), ids=POOL_METHODS.keys())
def test_every_pool_method_raises_after_close(
    sim: Runtime, method: Callable[[WorkerPool], Any]
) -> None:
    pool = sim.define("p", execute=noop)
    sim.close()

    with pytest.raises(PoolClosedError):
        method(pool)


def test_close_is_idempotent(sim: Runtime) -> None:
    sim.define("p", execute=noop).enqueue("x")

    sim.close()
    sim.close()

    assert sim.closed


def test_the_context_manager_closes_the_runtime(store_path: Path) -> None:
    with Runtime.simulated(store_path) as runtime:
        pool = runtime.define("p", execute=noop)
        pool.enqueue("x")
    assert runtime.closed
    with pytest.raises(PoolClosedError):
        pool.enqueue("y")

    with Runtime.simulated(store_path) as again:  # the store lock was released
        assert again.define("p", execute=noop).status().pending == 1


# -- restart: close and reopen the store --------------------------------------------------


def test_pending_events_survive_a_reopen_and_then_run(sim: Runtime, store_path: Path) -> None:
    pool = sim.define("p", execute=noop, concurrency=2)
    pool.enqueue_many(["a", "b", "c"])

    handler = Recorder()
    with reopen(sim, store_path) as runtime:
        pool = runtime.define("p", execute=handler, concurrency=2)
        status = pool.status()
        assert (status.enqueued, status.pending) == (3, 3)
        assert pool.join(timeout=10)

    assert sorted((run.event, run.index, run.sequence) for run in handler.runs) == [
        ("a", 0, 0),
        ("b", 1, 0),
        ("c", 0, 1),
    ]


def test_sequences_continue_after_a_reopen(sim: Runtime, store_path: Path) -> None:
    pool = sim.define("p", execute=noop)
    pool.enqueue_many(["a", "b"])
    assert pool.join(timeout=10)

    with reopen(sim, store_path) as runtime:
        result = runtime.define("p", execute=noop).enqueue("c")
    assert result.sequence == 2


def test_the_paused_flag_survives_a_reopen(sim: Runtime, store_path: Path) -> None:
    pool = sim.define("p", execute=noop, concurrency=2)
    pool.pause(1)
    pool.enqueue_many(["a", "b"])

    with reopen(sim, store_path) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=2)
        assert [s.state for s in pool.status().instances] == ["idle", "paused"]
        assert not pool.join(timeout=10)
        assert [s.pending for s in pool.status().instances] == [0, 1]


@pytest.mark.parametrize(
    ("reopen_at", "retry_starts_at"),
    [(None, 10.0), (4.0, 10.0), (30.0, 30.0)],
    ids=["same-clock", "new-clock-before-due", "new-clock-after-due"],
)
def test_a_retry_in_backoff_survives_a_reopen_at_its_absolute_time(
    sim: Runtime, store_path: Path, reopen_at: float | None, retry_starts_at: float
) -> None:
    pool = sim.define("p", execute=fail, retry=no_jitter(initial_delay=10))
    pool.enqueue("x")
    clock_of(sim).advance(2)  # attempt 1 failed at t=0; the retry is due at t=10
    sim.close()

    clock = sim.clock if reopen_at is None else SimulatedClock(start=reopen_at)
    handler = Recorder(fail_first_attempt)
    with Runtime(store_path, clock=clock, seed=0) as runtime:
        pool = runtime.define("p", execute=handler, retry=no_jitter(initial_delay=10))
        [instance] = pool.status().instances
        assert (instance.state, instance.attempt, instance.current_sequence) == ("backoff", 1, 0)
        assert instance.next_alarm_at == 10.0
        assert pool.join(timeout=10)

    assert [(run.attempt, run.started_at) for run in handler.runs] == [(2, retry_starts_at)]


def test_dead_letters_and_counters_survive_a_reopen(sim: Runtime, store_path: Path) -> None:
    pool = sim.define("p", execute=fail_if_bad, concurrency=2)
    pool.enqueue_many(["ok", "bad", "ok", "bad"])
    assert pool.join(timeout=10)
    pool.pause(0)
    pool.enqueue_many(["drained", "x", "pending"])
    pool.drain(1)
    before = (pool.status(), pool.dead_letters())

    with reopen(sim, store_path) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=2)
        assert (pool.status(), pool.dead_letters()) == before

    status, dead_letters = before
    assert len(dead_letters) == 2
    assert (status.succeeded, status.dead_lettered, status.drained, status.pending) == (2, 2, 1, 2)
    assert all(instance.restarts == 0 for instance in status.instances)


def _fan_out_to_instance_1(ctx: EventContext) -> None:
    if ctx.event == "parent":
        ctx.enqueue("child", partition_key=key_for(1, 2))


@pytest.mark.parametrize("steps", [1, 2], ids=["not-delivered", "delivered-not-acknowledged"])
def test_an_outbox_follow_up_survives_a_reopen_and_runs_once(
    sim: Runtime, store_path: Path, steps: int
) -> None:
    pool = sim.define("p", execute=_fan_out_to_instance_1, concurrency=2)
    pool.enqueue("parent", partition_key=key_for(0, 2))
    for _ in range(steps):  # 1: the parent commits its outbox; 2: instance 1 accepts the child
        assert clock_of(sim).step()

    handler = Recorder(_fan_out_to_instance_1)
    with reopen(sim, store_path) as runtime:
        pool = runtime.define("p", execute=handler, concurrency=2)
        assert pool.join(timeout=10)
        status = pool.status()

    assert handler.events == ["child"]
    assert [s.enqueued for s in status.instances] == [1, 1]
    assert_counters_balance(status)


@pytest.mark.parametrize("held", ["pending", "dead-letter", "outbox"])
@pytest.mark.parametrize("new_concurrency", [1, 3])
def test_a_changed_concurrency_is_refused_while_the_store_holds_work(
    sim: Runtime, store_path: Path, held: str, new_concurrency: int
) -> None:
    def handler(ctx: EventContext) -> None:
        _fan_out_to_instance_1(ctx)
        if ctx.event == "bad":
            raise PermanentError("bad")

    pool = sim.define("p", execute=handler, concurrency=2)
    if held == "pending":
        pool.enqueue_many(["a", "b"])
    elif held == "dead-letter":
        pool.enqueue("bad")
        assert pool.join(timeout=10)
    else:
        pool.enqueue("parent", partition_key=key_for(0, 2))
        assert clock_of(sim).step()  # the parent succeeded; its child waits in the outbox
    before = (pool.status(), pool.dead_letters())

    with reopen(sim, store_path) as runtime:
        with pytest.raises(ConfigurationError):
            runtime.define("p", execute=noop, concurrency=new_concurrency)
        pool = runtime.define("p", execute=noop, concurrency=2)
        assert (pool.status(), pool.dead_letters()) == before


def test_a_changed_concurrency_is_accepted_when_the_store_holds_no_work(
    sim: Runtime, store_path: Path
) -> None:
    pool = sim.define("p", execute=fail_if_bad, concurrency=2)
    pool.enqueue_many(["ok", "bad", "ok"])
    assert pool.join(timeout=10)
    pool.purge_dead_letters()

    handler = Recorder()
    with reopen(sim, store_path) as runtime:
        pool = runtime.define("p", execute=handler, concurrency=3)
        assert pool.status().concurrency == 3
        pool.enqueue_many(range(3))
        assert pool.join(timeout=10)
    assert sorted(run.index for run in handler.runs) == [0, 1, 2]


# -- the store lock -------------------------------------------------------------------


def test_a_second_runtime_on_the_same_store_is_refused(sim: Runtime, store_path: Path) -> None:
    pool = sim.define("p", execute=noop)

    with pytest.raises(StoreLockedError) as info:
        Runtime(store_path)
    with pytest.raises(StoreLockedError):
        Runtime.simulated(store_path)

    assert f"pid {os.getpid()}" in info.value.holder
    assert info.value.holder in str(info.value)
    pool.enqueue("the first runtime still works")
    assert pool.join(timeout=10)

    sim.close()
    with Runtime.simulated(store_path) as runtime:
        assert runtime.define("p", execute=noop).status().succeeded == 1


# -- subscribers and the trace ------------------------------------------------------------


def test_subscribers_see_every_step_in_order(sim: Runtime) -> None:
    seen: list[PoolEvent] = []
    unsubscribe = sim.subscribe(seen.append)
    pool = sim.define(
        "p",
        execute=fail_if_bad,
        retry=no_jitter(max_attempts=2, initial_delay=1),
    )

    pool.enqueue("ok")
    pool.enqueue("bad")
    assert pool.join(timeout=10)
    pool.pause()
    pool.enqueue("late")
    pool.drain()
    pool.resume()

    assert [(e.kind, e.instance_index, e.sequence, e.attempt, e.time) for e in seen] == [
        ("activated", 0, None, None, 0.0),  # started by its first enqueue
        ("enqueued", 0, 0, None, 0.0),
        ("enqueued", 0, 1, None, 0.0),
        ("started", 0, 0, 1, 0.0),
        ("succeeded", 0, 0, 1, 0.0),
        ("started", 0, 1, 1, 0.0),
        ("retry_scheduled", 0, 1, 1, 0.0),
        ("started", 0, 1, 2, 1.0),
        ("dead_lettered", 0, 1, 2, 1.0),
        ("empty", 0, None, None, 1.0),
        ("paused", 0, None, None, 1.0),
        ("enqueued", 0, 2, None, 1.0),
        ("drained", 0, None, None, 1.0),
        ("resumed", 0, None, None, 1.0),
    ]
    assert {e.pool for e in seen} == {"p"}
    errors = {e.kind: e.error for e in seen if e.error is not None}
    assert set(errors) == {"retry_scheduled", "dead_lettered"}
    assert all("ValueError" in error for error in errors.values())

    unsubscribe()
    pool.enqueue("unseen")
    assert pool.join(timeout=10)
    assert len(seen) == 14


def test_a_raising_subscriber_is_logged_and_ignored(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    def subscriber(_event: PoolEvent) -> None:
        raise RuntimeError("subscriber broke")

    sim.subscribe(subscriber)
    pool = sim.define("p", execute=noop)
    with caplog.at_level(logging.ERROR, logger="dopool"):
        pool.enqueue("x")
        assert pool.join(timeout=10)

    assert pool.status().succeeded == 1
    assert any("subscriber" in r.getMessage() for r in caplog.records)


def test_the_trace_is_written_as_json_lines(store_path: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    with Runtime.simulated(store_path, trace=trace) as runtime:
        pool = runtime.define("p", execute=noop)
        pool.enqueue("x")
        assert pool.join(timeout=10)

    records = [json.loads(line) for line in trace.read_text().splitlines()]
    kinds = ["activated", "enqueued", "started", "succeeded", "empty"]
    assert [r["kind"] for r in records] == kinds
    assert records[3] == {
        "kind": "succeeded",
        "pool": "p",
        "instance_index": 0,
        "sequence": 0,
        "attempt": 1,
        "time": 0.0,
        "error": None,
    }


def _traced_scenario(directory: Path, seed: int) -> bytes:
    """Retries with jitter, follow-ups, sleeps and three instances; returns the trace."""

    def handler(ctx: EventContext) -> None:
        n = ctx.event["n"]
        ctx.sleep(n % 3)
        if ctx.event["children"]:
            ctx.enqueue({"n": n + 10, "children": 0})
            ctx.enqueue({"n": n + 20, "children": 0}, partition_key=f"child-{n}")
        if n % 2 == 0 and ctx.attempt == 1:
            raise ValueError(f"flaky {n}")
        if n == 7:
            raise ValueError("poison")

    trace = directory / "trace.jsonl"
    with Runtime.simulated(directory / "store", seed=seed, trace=trace) as runtime:
        pool = runtime.define(
            "p",
            execute=handler,
            concurrency=3,
            retry=RetryPolicy(max_attempts=3, initial_delay=1, jitter=0.5),
        )
        for n in range(9):
            pool.enqueue({"n": n, "children": n % 4 == 0}, partition_key=f"k{n % 5}")
        for n in range(4):
            pool.enqueue({"n": 100 + n, "children": 0})
        assert pool.join(timeout=10)
    return trace.read_bytes()


def test_the_same_seed_gives_a_byte_identical_trace(tmp_path: Path) -> None:
    first = _traced_scenario(tmp_path / "one", seed=7)
    second = _traced_scenario(tmp_path / "two", seed=7)
    other = _traced_scenario(tmp_path / "three", seed=8)

    records = [json.loads(line) for line in first.splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"retry_scheduled", "dead_lettered", "succeeded", "empty"} <= kinds
    assert {r["instance_index"] for r in records} == {0, 1, 2}
    assert first == second
    assert first != other


def _trace_of_pool_wide_calls(directory: Path) -> bytes:
    trace = directory / "trace.jsonl"
    with Runtime.simulated(directory / "store", trace=trace) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=4)
        pool.enqueue_many(range(8))
        for _ in range(3):
            pool.pause()
            pool.resume()
        pool.drain()
    return trace.read_bytes()


def test_pool_wide_calls_give_a_reproducible_trace(tmp_path: Path) -> None:
    traces = {_trace_of_pool_wide_calls(tmp_path / f"run-{n}") for n in range(5)}

    assert len(traces) == 1


def test_runtime_define_is_worker_pool_define(sim: Runtime) -> None:
    policy = no_jitter(max_attempts=2)
    options: dict[str, Any] = {
        "execute": fail,
        "concurrency": 2,
        "retry": policy,
        "max_queue_depth": 1,
    }
    via_runtime = sim.define("a", **options)
    via_class = WorkerPool.define("b", runtime=sim, **options)

    for pool in (via_runtime, via_class):
        assert isinstance(pool, WorkerPool)
        assert pool.concurrency == 2
        pool.enqueue_many(["x", "y"])
        with pytest.raises(QueueFullError):
            pool.enqueue("z")
        assert pool.join(timeout=10)
        assert [d.attempts for d in pool.dead_letters()] == [2, 2]
    with pytest.raises(ConfigurationError):
        WorkerPool.define("a", runtime=sim, execute=noop)
    with pytest.raises(ConfigurationError):
        sim.define("b", execute=noop)
