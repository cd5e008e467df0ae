"""At most ``max_active`` instances run at once in a runtime; the rest wait in line
(docs/guarantees.md, "At most max_active at once")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pykka
import pytest

from dopool import (
    ConfigurationError,
    EventContext,
    InstanceStartError,
    PoolEvent,
    RealClock,
    Runtime,
    SimulatedClock,
    WorkerPool,
)
from dopool._engine.actor import running_instances
from dopool._engine.slots import DEFAULT_MAX_ACTIVE, Slots
from dopool._ops.check import check_store

TIMEOUT = 30.0


class Running:
    """The instances running, as the pool events say, and the most at once."""

    def __init__(self) -> None:
        self.now: set[tuple[str, int]] = set()
        self.most = 0
        self.kinds: list[tuple[str, int]] = []

    def __call__(self, event: PoolEvent) -> None:
        where = (event.pool, event.instance_index)
        if event.kind == "activated":
            assert where not in self.now, f"{where} started twice"
            self.now.add(where)
            self.most = max(self.most, len(self.now))
        elif event.kind == "evicted":
            self.now.remove(where)
        self.kinds.append((event.kind, event.instance_index))


def keys(pool: WorkerPool, count: int) -> list[str]:
    """``count`` partition keys, each routed to an instance of its own."""
    found: dict[int, str] = {}
    number = 0
    while len(found) < count:
        key = f"k{number}"
        found.setdefault(pool._router.choose(key), key)
        number += 1
    return list(found.values())


def test_at_most_max_active_run_and_the_rest_start_in_the_order_they_became_ready(
    tmp_path: Path,
) -> None:
    ran: list[tuple[str, float]] = []

    def work(ctx: EventContext) -> None:
        ran.append((ctx.event, ctx.started_at))
        ctx.sleep(10)

    running = Running()
    with Runtime.simulated(tmp_path / "store", max_active=2) as runtime:
        runtime.subscribe(running)
        pool = runtime.define("rooms", execute=work, concurrency="per-key", idle_timeout=1000)
        for key in "abcdef":
            pool.enqueue(key, partition_key=key)
        status = pool.status()
        assert (status.active, status.waiting, status.pending) == (2, 4, 6)
        assert pool.join()
        assert pool.status().waiting == 0
    assert ran == [(k, t) for k, t in zip("abcdef", (0, 0, 10, 10, 20, 20), strict=True)]
    assert running.most == 2


def test_an_enqueue_for_a_waiting_instance_is_stored_from_the_callers_thread(
    tmp_path: Path,
) -> None:
    """No cell, no actor, no message: stored, its enqueued event published, and run once a
    slot comes to it (with the stored path skipped, the enqueue waits for the slot)."""
    events: list[tuple[str, int]] = []
    with Runtime.simulated(tmp_path / "store", max_active=1) as runtime:
        pool = runtime.define(
            "rooms", execute=lambda ctx: ctx.sleep(5), concurrency="per-key", idle_timeout=1000
        )
        pool.enqueue("first", partition_key="a")
        runtime.subscribe(lambda event: events.append((event.kind, event.instance_index)))
        result = pool.enqueue("second", partition_key="b")
        assert pool._instances.cells.get(result.instance_index) is None  # nothing made
        assert runtime.clock.now() == 0.0  # it did not wait for the slot
        info = pool.event(result.event_id)
        assert info is not None
        assert info.state == "pending"
        assert events == [("enqueued", result.instance_index)]
        batch = pool.enqueue_many(["third", "fourth"], partition_key="b")
        assert [r.sequence for r in batch] == [1, 2]
        assert pool.join()
        assert pool.status().succeeded == 4
        assert runtime.clock.now() == 20.0


def test_a_busy_instance_gives_its_slot_up_after_its_attempt_while_others_wait(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    def work(ctx: EventContext) -> None:
        ran.append(ctx.event)
        ctx.sleep(1)

    with Runtime.simulated(tmp_path / "store", max_active=1) as runtime:
        pool = runtime.define("rooms", execute=work, concurrency="per-key", idle_timeout=1000)
        pool.enqueue_many(["a1", "a2", "a3"], partition_key="a")
        pool.enqueue("b1", partition_key="b")
        assert pool.join()
    # a1 runs; b waits, so a goes to the back of the line; b1; then a alone, in one go.
    assert ran == ["a1", "b1", "a2", "a3"]


def test_an_idle_instance_gives_its_slot_up_at_once_when_another_waits(tmp_path: Path) -> None:
    ran: list[tuple[str, float]] = []
    with Runtime.simulated(tmp_path / "store", max_active=1) as runtime:
        pool = runtime.define(
            "rooms",
            execute=lambda ctx: ran.append((ctx.event, ctx.started_at)),
            concurrency="per-key",
            idle_timeout=1000,
        )
        pool.enqueue("a", partition_key="a")
        assert pool.join()
        clock = runtime.clock
        assert isinstance(clock, SimulatedClock)
        clock.run_until(50.0)
        assert pool.status().active == 1  # idle, in its slot, short of its idle_timeout
        pool.enqueue("b", partition_key="b")
        assert pool.join()
        assert runtime.clock.now() == 50.0
    assert ran == [("a", 0.0), ("b", 50.0)]


def test_an_instance_never_evicted_for_idleness_still_gives_its_slot_up(tmp_path: Path) -> None:
    ran: list[str] = []
    with Runtime.simulated(tmp_path / "store", max_active=1) as runtime:
        pool = runtime.define(
            "rooms",
            execute=lambda ctx: ran.append(ctx.event),
            concurrency="per-key",
            idle_timeout=None,
        )
        pool.enqueue("a", partition_key="a")
        assert pool.join()
        pool.enqueue("b", partition_key="b")
        assert pool.join()
        assert pool.status().active == 1  # b, never evicted now that nobody waits
    assert ran == ["a", "b"]


def test_a_kill_of_a_waiting_instance_crashes_it_as_it_starts(tmp_path: Path) -> None:
    ran: list[tuple[str, float]] = []
    seen: list[tuple[str, float]] = []

    def work(ctx: EventContext) -> None:
        ran.append((ctx.event, ctx.started_at))
        ctx.sleep(5)

    with Runtime.simulated(tmp_path / "store", max_active=1) as runtime:
        pool = runtime.define(
            "rooms",
            execute=work,
            concurrency="per-key",
            idle_timeout=1000,
        )
        pool.enqueue("a", partition_key="a")
        b = pool.enqueue("b", partition_key="b").instance_index

        def restarts(event: PoolEvent) -> None:
            if event.instance_index == b and event.kind in ("crashed", "recovered"):
                seen.append((event.kind, event.time))

        runtime.subscribe(restarts)
        runtime.kill("rooms", b)  # nothing runs it yet: it crashes when its slot comes
        assert seen == []
        assert pool.join()
        assert pool.status().instance(b).restarts == 1
    assert seen == [("crashed", 5.0), ("recovered", 5.0)]
    assert ran == [("a", 0.0), ("b", 5.0)]


def test_a_follow_up_to_a_waiting_instance_is_kept_for_it_and_nothing_deadlocks(
    tmp_path: Path,
) -> None:
    """One slot: the sender holds it while its follow-up waits for the target, whose
    acknowledgement waits for the sender again; each gives the slot up in turn."""
    ran: list[str] = []

    def relay(ctx: EventContext) -> None:
        ran.append(f"{ctx.partition_key}:{ctx.event}")
        if ctx.event < 3:
            target = "b" if ctx.partition_key == "a" else "a"
            ctx.enqueue(ctx.event + 1, partition_key=target)

    running = Running()
    with Runtime.simulated(tmp_path / "store", max_active=1) as runtime:
        runtime.subscribe(running)
        pool = runtime.define("relay", execute=relay, concurrency="per-key", idle_timeout=1000)
        pool.enqueue(0, partition_key="a")
        pool.enqueue(10, partition_key="c")
        assert pool.join(timeout=TIMEOUT)
        assert pool.status().succeeded == 5
        with runtime._store.read() as txn:
            assert check_store(txn).ok  # every follow-up delivered and acknowledged once
    assert ran == ["a:0", "c:10", "b:1", "a:2", "b:3"]
    assert running.most == 1


def test_reopening_a_store_with_more_instances_at_work_than_slots_runs_them_all(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("rooms", execute=lambda ctx: None, concurrency="per-key")
        for key in "abcde":
            pool.enqueue(key, partition_key=key, delay=100)
    ran: list[tuple[str, float]] = []
    running = Running()
    with Runtime.simulated(store, max_active=2) as runtime:
        runtime.subscribe(running)
        pool = runtime.define(
            "rooms",
            execute=lambda ctx: ran.append((ctx.event, ctx.started_at)),
            concurrency="per-key",
        )
        assert pool.join()
        assert pool.status().succeeded == 5
    assert sorted(ran) == [(key, 100.0) for key in "abcde"]
    assert running.most == 2


def test_a_thread_that_cannot_start_is_a_clean_error_that_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller gets InstanceStartError naming the instance; nothing is stored, pykka's
    registry keeps no actor that never ran, and the slot it took is free again."""
    real = pykka.ThreadingActor._start_actor_loop
    failing = [True]

    def start(self: pykka.ThreadingActor) -> None:
        if failing[0]:
            raise RuntimeError("can't start new thread")
        real(self)

    monkeypatch.setattr(pykka.ThreadingActor, "_start_actor_loop", start)
    with Runtime(tmp_path / "store", max_active=1) as runtime:
        pool = runtime.define("rooms", execute=lambda ctx: None, concurrency="per-key")
        with pytest.raises(InstanceStartError) as caught:
            pool.enqueue("a", partition_key="a")
        assert caught.value.instance_id.startswith("rooms:")
        assert "can't start new thread" in str(caught.value)
        assert running_instances() == []
        status = pool.status()
        assert (status.enqueued, status.pending, status.active, status.waiting) == (0, 0, 0, 0)
        failing[0] = False
        pool.enqueue("b", partition_key="b")  # the slot is free again
        assert pool.join(timeout=TIMEOUT)
        assert pool.status().succeeded == 1


def test_under_a_real_clock_threads_stay_within_max_active(tmp_path: Path) -> None:
    peak = [0]
    lock = threading.Lock()
    running = Running()

    def work(ctx: EventContext) -> None:
        with lock:
            peak[0] = max(peak[0], len(running_instances()))

    with Runtime(tmp_path / "store", durability="async", max_active=8) as runtime:
        runtime.subscribe(running)
        pool = runtime.define("rooms", execute=work, concurrency="per-key", idle_timeout=60)
        for number in range(300):
            pool.enqueue(number, partition_key=f"room-{number}")
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()
        assert (status.succeeded, status.used, status.waiting) == (300, 300, 0)
    assert running.most <= 8
    assert 1 <= peak[0] <= 8


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "8"])
def test_a_bad_max_active_is_refused_by_name(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_active"):
        Runtime(tmp_path / "store", max_active=value)


def test_the_default_bounds_a_real_clock_only(tmp_path: Path) -> None:
    with Runtime(tmp_path / "real") as runtime:
        assert runtime.max_active == DEFAULT_MAX_ACTIVE
    with Runtime.simulated(tmp_path / "simulated") as runtime:
        assert runtime.max_active is None
    with Runtime(tmp_path / "both", clock=RealClock(), max_active=3) as runtime:
        assert runtime.max_active == 3


@pytest.mark.parametrize("backend", ["threads", "greenlet"])
def test_an_evicted_instance_is_busy_until_it_has_handed_its_slot_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Under a simulated clock's threads, a driver that found every actor quiet while the
    evicted one was still to hand its slot on would end its drive before the next in line
    starts (the chaos harness: "the pools never became idle")."""
    ran: list[str] = []
    quiet_at_hand_over: list[bool] = []
    give_back = Slots.give_back
    with Runtime.simulated(tmp_path / "store", max_active=1, backend=backend) as runtime:
        activity = runtime.clock.activity

        def watched(slots: Slots) -> None:
            quiet_at_hand_over.append(activity.quiet())
            give_back(slots)

        monkeypatch.setattr(Slots, "give_back", watched)
        pool = runtime.define(
            "rooms", execute=lambda ctx: ran.append(ctx.event), concurrency="per-key"
        )
        pool.enqueue("a", partition_key="a")
        pool.enqueue("b", partition_key="b")  # waits for a's slot
        assert pool.join(timeout=TIMEOUT)
    assert ran == ["a", "b"]
    assert quiet_at_hand_over
    assert not any(quiet_at_hand_over)
