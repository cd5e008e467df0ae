"""Events by id: ``pool.event`` and ``pool.cancel``, remembered finishes under
``keep_finished`` (docs/api.md, "event" and "cancel"; docs/guarantees.md, "No loss")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import lmdb
import pytest

import dopool
from dopool import (
    ConfigurationError,
    EventContext,
    EventIdError,
    EventInfo,
    PoolEvent,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    WorkerPool,
)
from dopool._ops.check import check_store
from dopool._store.layout import EventIndex, Namespace, pack, seal


class Log:
    """A handler that records each event it ran; ``{"fail": n}`` fails n times."""

    def __init__(self) -> None:
        self.ran: list[Any] = []

    def __call__(self, ctx: EventContext) -> None:
        self.ran.append(ctx.event)
        if isinstance(ctx.event, dict) and ctx.attempt <= ctx.event.get("fail", 0):
            raise ValueError("told to")


def define(runtime: Runtime, **options: Any) -> tuple[WorkerPool, Log]:
    log = Log()
    return runtime.define("p", execute=log, **options), log


def clock_of(runtime: Runtime) -> SimulatedClock:
    clock = runtime.clock
    assert isinstance(clock, SimulatedClock)
    return clock


def events_of(runtime: Runtime) -> list[PoolEvent]:
    seen: list[PoolEvent] = []
    runtime.subscribe(seen.append)
    return seen


def checked(runtime: Runtime) -> None:
    with runtime._store.read() as txn:
        report = check_store(txn)
    assert report.ok, report.problems


# -- looking events up ---------------------------------------------------------------------


def test_an_event_is_found_in_each_state_of_its_life(sim: Runtime) -> None:
    retry = RetryPolicy(max_attempts=2, initial_delay=10.0, jitter=0.0)
    pool, _log = define(sim, retry=retry, keep_finished=60)
    clock = clock_of(sim)
    pool.pause()
    first = pool.enqueue({"fail": 1}, partition_key="k", priority=2, dedup_key="d")
    later = pool.enqueue("later", delay=5.0)
    info = pool.event(first.event_id)
    assert info is not None
    assert (info.state, info.attempts, info.priority, info.dedup_key) == ("pending", 0, 2, "d")
    assert (info.event_id, info.pool, info.instance_index, info.sequence) == ("p:0:0", "p", 0, 0)
    assert (info.enqueued_at, info.due, info.partition_key) == (0.0, 0.0, "k")
    scheduled = pool.event(later.event_id)
    assert scheduled is not None
    assert (scheduled.state, scheduled.due) == ("scheduled", 5.0)
    pool.resume()
    clock.step()  # the first attempt fails
    info = pool.event(first.event_id)
    assert info is not None
    assert (info.state, info.attempts, info.error, info.retry_at) == (
        "backoff",
        1,
        "ValueError: told to",
        10.0,
    )
    assert pool.join(timeout=10)
    done = pool.event(first.event_id)
    assert done is not None
    assert (done.state, done.attempts, done.started_at, done.finished_at) == (
        "succeeded",
        2,
        10.0,
        10.0,
    )
    assert done.error == "ValueError: told to"  # its last failure
    checked(sim)


def test_a_running_event_is_found_running_from_its_handler(sim: Runtime) -> None:
    states: list[EventInfo | None] = []
    pool = sim.define("p", execute=lambda ctx: states.append(pool.event(f"p:0:{ctx.sequence}")))
    pool.enqueue("x")
    assert pool.join(timeout=10)
    [info] = states
    assert info is not None
    assert info.state == "running"
    assert info.attempts == 1


def test_without_keep_finished_only_a_held_dead_letter_is_found(sim: Runtime) -> None:
    pool, _ = define(sim)
    ok = pool.enqueue("ok")
    bad = pool.enqueue({"fail": 1})
    assert pool.join(timeout=10)
    assert pool.event(ok.event_id) is None
    dead = pool.event(bad.event_id)
    assert dead is not None
    assert (dead.state, dead.attempts, dead.error, dead.due) == (
        "dead_lettered",
        1,
        "ValueError: told to",
        None,
    )
    pool.purge_dead_letters()
    assert pool.event(bad.event_id) is None
    assert pool.event("p:0:99") is None  # never issued
    checked(sim)


def test_finished_events_are_forgotten_after_keep_finished_and_swept(sim: Runtime) -> None:
    pool, _ = define(sim, keep_finished=10)
    clock = clock_of(sim)
    old = pool.enqueue_many(["a", "b", "c"])
    assert pool.join(timeout=10)
    assert [pool.event(r.event_id).state for r in old] == ["succeeded"] * 3  # type: ignore[union-attr]
    clock.advance(10.0)
    assert [pool.event(r.event_id) for r in old] == [None] * 3  # past its time: forgotten
    with sim._store.read() as txn:
        assert Namespace("p", 0).load_meta(txn).remembered == 3  # not swept yet
    for event in ("d", "e"):  # each finish sweeps up to two
        pool.enqueue(event)
        assert pool.join(timeout=10)
    with sim._store.read() as txn:
        assert Namespace("p", 0).load_meta(txn).remembered == 2  # d and e
        assert EventIndex(Namespace("p", 0)).count_finished(txn) == 2
    checked(sim)


def test_keep_finished_is_validated_like_dedup_window(sim: Runtime) -> None:
    for bad in (-1, float("inf"), float("nan"), True, "10"):
        with pytest.raises(ConfigurationError, match="keep_finished must be"):
            sim.define("p", execute=lambda ctx: None, keep_finished=bad)  # type: ignore[arg-type]


def test_a_malformed_or_foreign_id_is_refused_with_its_reason(sim: Runtime) -> None:
    pool, _ = define(sim, concurrency=2)
    cases = {
        "p:0": "not <pool>:<index>:<sequence>",
        "p:x:1": "not <pool>:<index>:<sequence>",
        "p:0:-1": "not <pool>:<index>:<sequence>",
        "q:0:1": "an id of pool 'q'",
        "p:2:0": "the pool has no instance 2",
        7: "not a str",
    }
    for event_id, reason in cases.items():
        for call in (pool.event, pool.cancel):
            with pytest.raises(EventIdError) as caught:
                call(event_id)  # type: ignore[arg-type]
            assert (caught.value.event_id, caught.value.pool) == (event_id, "p")
            assert caught.value.reason == reason


class _NoRepr:
    def __repr__(self) -> str:
        raise ValueError("no repr")


def test_an_id_past_any_sequence_is_refused_before_it_reaches_an_instance(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A sequence past 2**64 - 1 crashed the instance asked to cancel it (a struct.error
    reached the caller), and one of 5,000 digits made int() raise ValueError."""
    pool, _ = define(sim)
    reason = "a sequence past 18446744073709551615, the last an instance can issue"
    for event_id in (f"p:0:{2**64}", "p:0:" + "9" * 5000):
        for call in (pool.event, pool.cancel):
            with pytest.raises(EventIdError) as caught:
                call(event_id)
            assert caught.value.reason == reason
    assert pool.event(f"p:0:{2**64 - 1}") is None  # never issued: unknown, as any other
    assert not pool.cancel(f"p:0:{2**64 - 1}")
    assert "failed handling" not in caplog.text
    with pytest.raises(EventIdError, match="<_NoRepr object> is not an event id"):
        pool.event(_NoRepr())  # type: ignore[arg-type]


def test_events_are_found_after_a_restart(store_path: Path) -> None:
    with Runtime.simulated(store_path, seed=1) as runtime:
        pool, _ = define(runtime, keep_finished=3600)
        done = pool.enqueue("done")
        assert pool.join(timeout=10)
        pool.pause()
        waiting = pool.enqueue("waiting", delay=30)
    with Runtime(store_path, clock=SimulatedClock(5.0)) as runtime:
        pool, _ = define(runtime, keep_finished=3600)
        assert pool.event(done.event_id).state == "succeeded"  # type: ignore[union-attr]
        assert pool.event(waiting.event_id).state == "scheduled"  # type: ignore[union-attr]
        assert pool.cancel(waiting.event_id)
    with Runtime(store_path, clock=SimulatedClock(6.0)) as runtime:
        pool, _ = define(runtime, keep_finished=3600)
        assert pool.event(waiting.event_id).state == "cancelled"  # type: ignore[union-attr]


def test_a_producer_looks_events_up(sim: Runtime, store_path: Path) -> None:
    pool, _ = define(sim)
    pool.pause()
    result = pool.enqueue("x")
    with dopool.connect(store_path) as connection:
        producer = connection.pool("p")
        info = producer.event(result.event_id)
        assert info is not None
        assert info.state == "pending"
        assert producer.event("p:0:5") is None
        with pytest.raises(EventIdError):
            producer.event("p:1:0")


# -- cancelling ------------------------------------------------------------------------------


def test_cancel_in_each_state_counts_emits_and_remembers(sim: Runtime) -> None:
    retry = RetryPolicy(max_attempts=3, initial_delay=100.0, jitter=0.0)
    pool, log = define(sim, retry=retry, keep_finished=60)
    clock = clock_of(sim)
    stream = events_of(sim)
    pool.pause()
    stuck = pool.enqueue({"fail": 2})  # fails, then waits 100 s in backoff
    behind = pool.enqueue("behind")
    pending = pool.enqueue("pending")
    scheduled = pool.enqueue("scheduled", delay=50.0)
    assert pool.cancel(pending.event_id)
    assert pool.cancel(scheduled.event_id)
    pool.resume()
    clock.step()
    assert pool.event(stuck.event_id).state == "backoff"  # type: ignore[union-attr]
    assert pool.cancel(stuck.event_id)  # frees the head of line
    assert pool.join(timeout=10)
    assert log.ran == [{"fail": 2}, "behind"]
    assert clock.now() < 100.0  # behind ran without waiting out the cancelled backoff
    for result in (stuck, pending, scheduled):
        assert pool.event(result.event_id).state == "cancelled"  # type: ignore[union-attr]
        assert not pool.cancel(result.event_id)  # finished: nothing to cancel
    assert not pool.cancel(behind.event_id)  # succeeded
    assert not pool.cancel("p:0:99")  # unknown
    status = pool.status()
    assert (status.enqueued, status.succeeded, status.cancelled, status.pending) == (4, 1, 3, 0)
    cancels = [(e.sequence, e.time) for e in stream if e.kind == "cancelled"]
    assert cancels == [(pending.sequence, 0.0), (scheduled.sequence, 0.0), (stuck.sequence, 0.0)]
    checked(sim)


def test_cancel_releases_the_dedup_key(sim: Runtime) -> None:
    pool, log = define(sim)
    pool.pause()
    first = pool.enqueue("a", dedup_key="k")
    assert pool.enqueue("b", dedup_key="k").duplicate
    assert pool.cancel(first.event_id)
    again = pool.enqueue("c", dedup_key="k")
    assert not again.duplicate
    pool.resume()
    assert pool.join(timeout=10)
    assert log.ran == ["c"]


def test_cancel_of_the_earliest_scheduled_event_moves_the_next_due(sim: Runtime) -> None:
    pool, log = define(sim)
    clock = clock_of(sim)
    soon = pool.enqueue("soon", delay=10.0)
    pool.enqueue("later", delay=20.0)
    assert pool.cancel(soon.event_id)
    with sim._store.read() as txn:
        meta = Namespace("p", 0).load_meta(txn)
        assert (meta.scheduled, meta.next_due) == (1, 20.0)
    assert pool.join(timeout=10)
    assert (log.ran, clock.now()) == (["later"], 20.0)
    checked(sim)


def test_cancel_from_a_handler_refuses_its_own_instance_only(sim: Runtime) -> None:
    answers: list[object] = []
    ids: dict[str, str] = {}

    def handle(ctx: EventContext) -> None:
        try:
            pool.cancel(ids["canceller"])  # its own instance: it would wait on itself
        except ConfigurationError as exc:
            answers.append(type(exc).__name__)
        answers.append(pool.cancel(ids["victim"]))

    pool = sim.define("p", execute=handle, concurrency=2)
    pool.pause()
    victim = pool.enqueue("victim", partition_key="v")
    canceller = victim
    for key in map(str, range(100)):  # a partition key of the other instance
        if sim.pools["p"]._router.choose(key) != victim.instance_index:
            canceller = pool.enqueue("canceller", partition_key=key)
            break
    ids.update(victim=victim.event_id, canceller=canceller.event_id)
    pool.resume(canceller.instance_index)
    assert pool.join(timeout=10)  # the victim's instance is paused, and empty now
    assert answers == ["ConfigurationError", True]
    assert pool.status().instance(victim.instance_index).cancelled == 1


def test_a_drained_event_is_remembered_as_drained(sim: Runtime) -> None:
    pool, _ = define(sim, keep_finished=60)
    pool.pause()
    results = [pool.enqueue("a"), pool.enqueue("b", delay=5.0)]
    assert pool.drain() == 2
    assert [pool.event(r.event_id).state for r in results] == ["drained"] * 2  # type: ignore[union-attr]
    checked(sim)


# -- damage ----------------------------------------------------------------------------------


def entry_key(sequence: int) -> bytes:
    return Namespace("p", 0).prefix + b"n" + sequence.to_bytes(8, "big")


@pytest.mark.parametrize("damage", ["flipped", "another entry's value", "names no event"])
def test_a_damaged_index_entry_never_names_another_event(
    store_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Runtime.simulated(store_path) as runtime:
        pool, _ = define(runtime)
        pool.pause()
        pool.enqueue_many(["a", "b", "c"])
    with lmdb.open(str(store_path / "data"), subdir=True) as env, env.begin(write=True) as txn:
        key = entry_key(1)
        value = bytearray(txn.get(key) or b"")
        if damage == "flipped":
            value[-1] ^= 0x01
        elif damage == "another entry's value":
            value = bytearray(txn.get(entry_key(2)) or b"")
        else:  # sound, but naming a key of another priority
            value = bytearray(seal(key, pack((bytes(12),))))
        txn.put(key, bytes(value))
    with Runtime(store_path, clock=SimulatedClock(1.0)) as runtime:
        pool, log = define(runtime)
        info = pool.event("p:0:1")
        assert info is not None
        assert (info.sequence, info.state) == (1, "pending")
        assert "looked for by a scan" in caplog.text
        assert pool.cancel("p:0:1")
        pool.resume()
        assert pool.join(timeout=10)
        assert log.ran == ["a", "c"]  # b cancelled, nothing else
        checked(runtime)  # the damaged entry went with its event


# -- the real clock --------------------------------------------------------------------------


@pytest.mark.threaded
def test_a_running_event_is_not_cancelled_nor_interrupted(store_path: Path) -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[object] = []

    def handle(ctx: EventContext) -> None:
        started.set()
        assert release.wait(10)
        finished.append(ctx.event)

    with Runtime(store_path) as runtime:
        pool = runtime.define("p", execute=handle, keep_finished=60)
        result = pool.enqueue("slow")
        assert started.wait(10)
        info = pool.event(result.event_id)
        assert info is not None
        assert info.state == "running"
        cancelled: list[bool] = []
        caller = threading.Thread(target=lambda: cancelled.append(pool.cancel(result.event_id)))
        caller.start()  # waits while the handler runs, as drain does
        release.set()
        caller.join(10)
        assert cancelled == [False]
        assert pool.join(timeout=10)
        assert finished == ["slow"]
        assert pool.event(result.event_id).state == "succeeded"  # type: ignore[union-attr]
        assert pool.status().cancelled == 0
