"""Instances are started when first used (docs/guarantees.md, "Instances started on
demand"): defining a pool starts none but those the store's work and alarm indexes
name, and a message, a follow-up, a kill or a producer's wake-up starts the one it is for."""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path
from typing import Any

import pykka
import pytest

from activation import activate
from dopool import (
    DamagedRecordError,
    EventContext,
    PoolEvent,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    WorkerPool,
    connect,
)
from dopool._clock.quiescence import Activity
from dopool._engine.actor import InstanceActor, running_instances
from dopool._engine.cells import PoolKeys
from dopool._engine.evicted import RETRY_START
from dopool._store.layout import Namespace
from worker_support import until

TIMEOUT = 30.0


def noop(ctx: EventContext) -> None:
    pass


def instance_actors() -> list[pykka.ActorRef[Any]]:
    """The instance actors running in this process (a pool's router actor is not one)."""
    return running_instances()


def started(pool: WorkerPool) -> list[int]:
    """The instances of ``pool`` that run in this runtime, by index."""
    return [cell.index for cell in pool._instances.cells.made()]


def clock(runtime: Runtime) -> SimulatedClock:
    assert isinstance(runtime.clock, SimulatedClock)
    return runtime.clock


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
def test_defining_a_pool_starts_no_instance_and_an_enqueue_starts_its_own(
    tmp_path: Path, backend: str
) -> None:
    with Runtime.simulated(tmp_path / "store", backend=backend) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=4096)
        assert started(pool) == []
        assert instance_actors() == []
        assert pool.status().pending == 0  # read from the store: no instance started for it
        result = pool.enqueue("a", partition_key="room-7")
        assert pool.join()
        assert started(pool) == [result.instance_index]
        assert len(instance_actors()) == 1
        assert pool.status().succeeded == 1


def test_reopening_starts_an_instance_whose_alarm_is_set_without_work(tmp_path: Path) -> None:
    """A schedule's next fire is instance 0's alarm, with no event pending: only the alarm
    index names it (with that read left out of ``instances_waiting``, nothing fires)."""
    store = tmp_path / "store"
    ran: list[tuple[str, float]] = []

    def record(ctx: EventContext) -> None:
        ran.append((ctx.event, ctx.started_at))

    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=record, concurrency=1000)
        pool.schedule("tick", "tick", every=10.0)
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=record, concurrency=1000)
        assert started(pool) == [0]
        clock(runtime).run_until(25.0)
        assert ran == [("tick", 10.0), ("tick", 20.0)]


def test_reopening_starts_an_instance_left_with_pending_events(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=1000)
        pool.pause()  # every instance: started, and stored as paused
        left = pool.enqueue("left", partition_key="k").instance_index
        delayed = pool.enqueue("delayed", partition_key="d", delay=5).instance_index
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=1000)
        assert started(pool) == sorted({left, delayed})  # from the work index
        pool.resume()
        assert pool.join()
        assert pool.status().succeeded == 2


def test_a_follow_up_starts_its_target_in_another_pool(tmp_path: Path) -> None:
    def relay(ctx: EventContext) -> None:
        ctx.enqueue(("relayed", ctx.event), pool="rooms", partition_key=ctx.event)

    with Runtime.simulated(tmp_path / "store") as runtime:
        rooms = runtime.define("rooms", execute=noop, concurrency=4096)
        front = runtime.define("front", execute=relay)
        front.enqueue("room-42")
        assert front.join()
        assert rooms.join()
        assert rooms.status().succeeded == 1
        assert len(started(rooms)) == 1


def test_an_instance_takes_no_direct_call_before_its_first_recovery_commits(
    tmp_path: Path,
) -> None:
    with Runtime.simulated(tmp_path / "store", backend="greenlet") as runtime:
        pool = runtime.define("p", execute=noop, concurrency=2)
        cell, reply = pool._instances.cells.open(1)
        assert reply is not None
        assert not cell.supervisor.takes_direct_calls()  # its recovery is still to run
        reply.get()
        assert cell.supervisor.takes_direct_calls()
        assert pool._instances.cells.open(1) == (cell, None)  # made once


def test_an_instance_first_used_after_close_is_not_started(tmp_path: Path) -> None:
    runtime = Runtime.simulated(tmp_path / "store")
    pool = runtime.define("p", execute=noop, concurrency=8)
    runtime.close()
    cell = pool._instances.cells[5]
    assert cell.mailbox.closed
    assert instance_actors() == []


@pytest.mark.threaded
def test_a_producers_event_starts_its_instance_under_the_real_clock(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = threading.Event()

    def handle(ctx: EventContext) -> None:
        done.set()

    with Runtime(store, poll_interval=0.05) as runtime:
        pool = runtime.define("p", execute=handle, concurrency=4096)
        assert started(pool) == []
        with connect(store) as producer:
            result = producer.pool("p").enqueue("from afar", partition_key="user-1")
        assert done.wait(TIMEOUT)  # the wake-up (or the poll) started the instance
        assert pool.join(timeout=TIMEOUT)
        assert started(pool) == [result.instance_index]


def test_pool_keys_are_a_set_of_every_instance_key_that_stores_none() -> None:
    keys = PoolKeys("p", 1000)
    assert len(keys) == 1000
    assert [key in keys for key in ("p:0", "p:999")] == [True, True]
    outside = ("p:1000", "p:007", "p:-1", "q:1", "p:", "p:1x", 1)
    assert [key in keys for key in outside] == [False] * len(outside)
    assert list(PoolKeys("p", 3)) == ["p:0", "p:1", "p:2"]
    activity = Activity()
    activity.sent("q:1")
    assert not activity.busy(keys)
    activity.sent("p:998")
    assert activity.busy(keys)


def test_an_enqueue_that_starts_an_instance_with_a_damaged_meta_names_the_record(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=4)
        pool.pause(2)  # a meta stored, and no work: a reopen does not start it
    key = Namespace("p", 2)._meta
    with Runtime.simulated(store) as runtime:
        with runtime._store.write() as txn:
            txn.put(key, b"\x00\x00\x00\x00")
        pool = runtime.define("p", execute=noop, concurrency=4)
        assert started(pool) == []
        with pytest.raises(DamagedRecordError, match="checksum mismatch") as caught:
            pool.enqueue("x", partition_key=key_of(pool, 2))
        assert caught.value.key == key
        other = pool.enqueue("y", partition_key=key_of(pool, 1))  # the others go on
        assert other.instance_index == 1


def key_of(pool: WorkerPool, index: int) -> str:
    """A partition key that routes to instance ``index``."""
    return next(key for key in map(str, range(999)) if pool._instances.router.choose(key) == index)


# -- eviction -------------------------------------------------------------------------


def test_an_idle_instance_is_evicted_after_its_idle_timeout_and_a_message_restarts_it(
    tmp_path: Path,
) -> None:
    seen: list[PoolEvent] = []
    with Runtime.simulated(tmp_path / "store") as runtime:
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=noop, concurrency=64, idle_timeout=10.0)
        first = pool.enqueue("a", partition_key="room")
        assert pool.join()
        index = first.instance_index
        clock(runtime).run_until(9.0)
        assert started(pool) == [index]
        pool.enqueue("b", partition_key="room")  # activity moves the deadline to t=19
        clock(runtime).run_until(18.0)
        assert started(pool) == [index]
        clock(runtime).run_until(20.0)
        assert started(pool) == []
        assert instance_actors() == []
        assert pool.status().active == 0
        pool.pause(index)  # a message starts it again, from its namespace
        assert started(pool) == [index]
        assert pool.status().active == 1
        pool.resume(index)
        third = pool.enqueue("c", partition_key="room")
        assert pool.join()
        assert third.sequence == 2
        status = pool.status()
        assert (status.enqueued, status.succeeded) == (3, 3)
        assert status.instance(index).restarts == 0  # an eviction is not a crash
    assert [e.kind for e in seen if e.kind in ("crashed", "recovered")] == []
    moves = [(e.kind, e.time) for e in seen if e.kind in ("activated", "evicted")]
    assert moves == [("activated", 0.0), ("evicted", 19.0), ("activated", 20.0)]


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
def test_an_evicted_incarnation_is_freed_at_once_not_by_the_cyclic_collector(
    tmp_path: Path, backend: str
) -> None:
    """Its actor, queue machine and cell hold each other (callbacks) while it runs; once
    evicted they are dropped, so nothing waits for the cyclic collector."""
    with Runtime.simulated(tmp_path / "store", backend=backend) as runtime:
        pool = runtime.define("p", execute=noop, concurrency="per-key", idle_timeout=1.0)
        for key in ("a", "b", "c"):
            pool.enqueue(key, partition_key=key)
        assert pool.join()
        actors = [
            weakref.ref(item)
            for item in gc.get_objects()
            if type(item) is InstanceActor and item._store is runtime._store
        ]
        assert len(actors) == 3
        gc.collect()
        gc.disable()
        try:
            clock(runtime).run_until(5.0)
            assert started(pool) == []
            until(lambda: instance_actors() == [], "the evicted actors to end")
            assert [actor for actor in actors if actor() is not None] == []
            assert gc.collect() == 0  # (nothing of theirs was left for it)
        finally:
            gc.enable()


def test_an_evicted_instances_delayed_event_and_retry_run_on_time(tmp_path: Path) -> None:
    """The runtime's timer starts an evicted instance when its alarm comes due (with the
    timer's note on eviction left out, neither runs)."""
    ran: list[tuple[object, int, float]] = []

    def flaky(ctx: EventContext) -> None:
        ran.append((ctx.event, ctx.attempt, ctx.started_at))
        if ctx.event == "flaky" and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    retry = RetryPolicy(max_attempts=2, initial_delay=50.0, jitter=0.0)
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=flaky, concurrency=8, idle_timeout=10.0, retry=retry)
        later = pool.enqueue("later", partition_key="a", delay=100.0).instance_index
        flaky_at = pool.enqueue("flaky", partition_key="b").instance_index
        assert later != flaky_at
        clock(runtime).run_until(30.0)
        assert started(pool) == []  # both waiting, evicted
        assert pool.join()
        assert ran == [("flaky", 1, 0.0), ("flaky", 2, 50.0), ("later", 1, 100.0)]
        assert pool.status().succeeded == 2


def test_an_evicted_instance_that_cannot_start_when_due_is_tried_again_and_others_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that fails in the runtime's timer (no thread left, say) loses no alarm: that
    instance is tried again RETRY_START later, and the timer goes on for the others (with
    the failure left to escape the timer, it ends the run: neither event runs)."""
    ran: list[tuple[object, float]] = []
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define(
            "p",
            execute=lambda ctx: ran.append((ctx.event, ctx.started_at)),
            concurrency=8,
            idle_timeout=10.0,
        )
        first = pool.enqueue("first", partition_key="a", delay=100.0).instance_index
        second = pool.enqueue("second", partition_key="b", delay=200.0).instance_index
        assert first != second
        clock(runtime).run_until(30.0)
        assert started(pool) == []  # both waiting, evicted
        cells, failures = pool._instances.cells, [first]
        real_ready = type(cells).ready

        def failing_ready(self: Any, index: int) -> Any:
            if failures and index == failures[0]:
                failures.pop()
                raise RuntimeError("can't start new thread")
            return real_ready(self, index)

        monkeypatch.setattr(type(cells), "ready", failing_ready)
        assert pool.join()
        assert ran == [("first", 100.0 + RETRY_START), ("second", 200.0)]
        assert pool.status().succeeded == 2


def test_an_instance_with_a_schedule_is_not_evicted(tmp_path: Path) -> None:
    ticks: list[float] = []

    def tick(ctx: EventContext) -> None:
        ticks.append(ctx.started_at)

    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=tick, concurrency=4, idle_timeout=10.0)
        pool.schedule("tick", "tick", every=100.0)
        clock(runtime).run_until(250.0)
        assert ticks == [100.0, 200.0]
        assert started(pool) == [0]


def one_evicted(runtime: Runtime) -> tuple[WorkerPool, int]:
    """Pool ``p`` (4 instances, idle_timeout 10) whose one instance used, with key ``k``,
    ran its event and was evicted; that instance's index."""
    pool = runtime.define("p", execute=noop, concurrency=4, idle_timeout=10.0)
    index = pool.enqueue("a", partition_key="k").instance_index
    assert pool.join()
    clock(runtime).run_until(20.0)
    assert started(pool) == []
    return pool, index


def test_a_crash_of_an_evicted_instance_restarts_it_and_it_recovers(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool, index = one_evicted(runtime)
        runtime.kill("p", index)  # starts it, and crashes it in its first recovery
        assert pool.enqueue("b", partition_key="k").instance_index == index
        assert pool.join()
        status = pool.status()
        assert status.succeeded == 2
        assert status.instance(index).restarts == 1


@pytest.mark.threaded
def test_eviction_and_a_timed_restart_under_the_real_clock(tmp_path: Path) -> None:
    done = threading.Event()

    def handle(ctx: EventContext) -> None:
        if ctx.event == "later":
            done.set()

    # No poll (it would find the evicted instance's work too): the timer must start it.
    with Runtime(tmp_path / "store", durability="async", poll_interval=3600) as runtime:
        pool = runtime.define("p", execute=handle, concurrency=16, idle_timeout=0.1)
        pool.enqueue("now", partition_key="a")
        pool.enqueue("later", partition_key="b", delay=0.6)
        until(lambda: started(pool) == [], "both instances evicted")
        assert instance_actors() == []
        assert done.wait(TIMEOUT)  # the runtime's timer started its instance when due
        assert pool.join(timeout=TIMEOUT)
        assert pool.status().succeeded == 2


def test_starting_an_evicted_instance_again_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves: list[tuple[str, int]] = []
    save_meta = Namespace.save_meta

    def counted(ns: Namespace, txn: Any, meta: Any) -> Any:
        saves.append((ns.pool, ns.index))
        return save_meta(ns, txn, meta)

    with Runtime.simulated(tmp_path / "store") as runtime:
        pool, index = one_evicted(runtime)
        monkeypatch.setattr(Namespace, "save_meta", counted)
        activate(pool, index)  # its recovery finds nothing to settle
        assert started(pool) == [index]
        assert saves == []


def test_an_evicted_instance_started_again_leaves_no_timer_behind(tmp_path: Path) -> None:
    """Evicted with a delayed event due at 7, then paused at 2 (started again by the pause,
    its alarm cleared): nothing is due, so running until idle leaves the clock at 2
    (a timer kept for the instance drove it to 7; found by the stateful model test)."""
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=noop, idle_timeout=1.0)
        pool.enqueue("later", delay=7.0)
        clock(runtime).run_until(2.0)
        assert started(pool) == []
        pool.pause()
        clock(runtime).run_until_idle()
        assert clock(runtime).now() == 2.0
        pool.resume()  # and the event still runs at its time
        assert pool.join()
        assert (clock(runtime).now(), pool.status().succeeded) == (7.0, 1)
