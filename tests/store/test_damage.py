"""Events that do not decode and records that are damaged: refused, or reported, never run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import pykka
import pytest

from activation import activate, direct_path
from cli_support import invoke
from dopool import (
    DamagedRecordError,
    EventContext,
    EventValidationError,
    RetryPolicy,
    Runtime,
    SimulatedClock,
)
from dopool._engine.actor import running_instances
from dopool._ops.check import check_store
from dopool._store.environment import Store
from dopool._store.layout import (
    EventRecord,
    Namespace,
    OutboxRecord,
    ScheduleBook,
    pack,
    seal,
    seal_event,
)
from dopool._store.txn import Txn

UNDECODABLE = msgpack.packb({(1, 2): "x"})  # a tuple map key: encodes, never decodes


class Seen:
    """A handler that records the events it was called with."""

    def __init__(self, action: Callable[[EventContext], Any] | None = None) -> None:
        self.events: list[Any] = []
        self._action = action

    def __call__(self, ctx: EventContext) -> None:
        self.events.append(ctx.event)
        if self._action is not None:
            self._action(ctx)


@contextmanager
def raw_store(path: Path) -> Iterator[Txn]:
    """One write transaction on a closed runtime's store, outside any runtime."""
    store = Store(path)
    try:
        with store.write() as txn:
            yield txn
    finally:
        store.close()


def flip(value: bytes, position: int = -1) -> bytes:
    """``value`` with one bit of one byte flipped."""
    data = bytearray(value)
    data[position] ^= 0x01
    return bytes(data)


def paused_pool_with(path: Path, events: list[Any], **options: Any) -> None:
    """Store ``events`` on pool ``p`` (one instance, paused) and close the runtime."""
    with Runtime.simulated(path, seed=0) as runtime:
        pool = runtime.define("p", execute=Seen(), **options)
        pool.pause()
        for event in events:
            pool.enqueue(event)


def open_and_run(path: Path, handler: Seen, **options: Any) -> tuple[Runtime, Any]:
    runtime = Runtime(path, clock=SimulatedClock(100.0), seed=0)
    pool = runtime.define("p", execute=handler, **options)
    pool.resume()
    assert pool.join(timeout=10)
    return runtime, pool


# -- events that encode but do not decode ---------------------------------------


@pytest.mark.parametrize("event", [{(1, 2): "x"}, [{(1,): 1}], {"a": {("b", "c"): None}}])
def test_an_event_that_would_not_decode_is_refused_and_nothing_is_stored(
    sim: Runtime, event: Any
) -> None:
    pool = sim.define("p", execute=Seen())
    with pytest.raises(EventValidationError, match="does not decode") as caught:
        pool.enqueue(event)
    assert caught.value.position is None
    with pytest.raises(EventValidationError, match="event 1 of the batch") as batch:
        pool.enqueue_many([{"ok": 1}, event])
    assert batch.value.position == 1
    assert pool.status().enqueued == 0


def test_a_follow_up_that_would_not_decode_fails_its_parent_attempt(sim: Runtime) -> None:
    def parent(ctx: EventContext) -> None:
        if ctx.event == "parent":
            ctx.enqueue({(1, 2): "x"})

    handler = Seen(parent)
    pool = sim.define("p", execute=handler)
    pool.enqueue("parent")
    assert pool.join(timeout=10)
    [dead] = pool.dead_letters()
    assert "does not decode" in dead.error
    assert handler.events == ["parent"]
    assert pool.status().enqueued == 1


def test_a_stored_event_that_does_not_decode_is_dead_lettered_without_running(
    store_path: Path,
) -> None:
    paused_pool_with(store_path, ["first", "second"])
    ns = Namespace("p", 0)
    with raw_store(store_path) as txn:
        key = ns.queue_key(0, 0, 0.0)
        record = EventRecord(UNDECODABLE, 1.0, None, 0)
        txn.put(key, seal_event(key, record))  # as another version might have stored it
    handler = Seen()
    emptied: list[Any] = []
    runtime, pool = open_and_run(
        store_path, handler, retry=RetryPolicy(max_attempts=5), on_empty=emptied.append
    )
    with runtime:
        assert handler.events == ["second"]
        [dead] = pool.dead_letters()
        assert dead.sequence == 0
        assert dead.event == UNDECODABLE  # the stored bytes, as found
        assert dead.attempts == 1  # dead-lettered at once: decoding will not succeed later
        assert dead.error.startswith("UndecodableEventError: the stored event does not decode")
        assert not dead.damaged
        status = pool.status()
        assert (status.succeeded, status.dead_lettered, status.pending) == (1, 1, 0)
        assert status.instance(0).restarts == 0
        assert len(emptied) == 1


# -- damaged records ------------------------------------------------------------------


@pytest.mark.parametrize("position", [0, 3, 4, -1], ids=["crc", "crc-end", "body", "last"])
def test_a_damaged_pending_event_is_dead_lettered_as_damaged_and_never_run(
    store_path: Path, position: int, caplog: pytest.LogCaptureFixture
) -> None:
    paused_pool_with(store_path, [{"n": 0}, {"n": 1}, {"n": 2}])
    key = Namespace("p", 0).queue_key(0, 1, 0.0)
    with raw_store(store_path) as txn:
        original = txn.get(key)
        txn.put(key, flip(original, position))
    handler = Seen()
    dead_seen: list[Any] = []
    with caplog.at_level(logging.ERROR, logger="dopool"):
        runtime, pool = open_and_run(store_path, handler, on_dead_letter=dead_seen.append)
    with runtime:
        assert handler.events == [{"n": 0}, {"n": 2}]
        [dead] = pool.dead_letters()
        assert dead.damaged
        assert dead.sequence == 1
        assert dead.event == flip(original, position)
        assert dead.error == "DamagedRecordError: checksum mismatch"
        assert dead_seen == [dead]
        assert "event 1 dead-lettered" in caplog.text
        # Never redriven: it stays to be inspected, and purge removes it.
        assert pool.redrive() == 0
        assert pool.dead_letters() == [dead]
        assert pool.purge_dead_letters() == 1
        status = pool.status()
        assert (status.enqueued, status.succeeded, status.dead_lettered) == (3, 2, 1)


def test_a_damaged_event_in_backoff_is_dead_lettered_at_its_retry(store_path: Path) -> None:
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define(
            "p", execute=Seen(lambda ctx: 1 / 0), retry=RetryPolicy(max_attempts=3, jitter=0)
        )
        pool.enqueue("flaky")
        runtime.clock.run_until(0.5)  # type: ignore[attr-defined]
        assert pool.status().instance(0).state == "backoff"
    key = Namespace("p", 0).queue_key(0, 0, 0.0)
    with raw_store(store_path) as txn:
        txn.put(key, flip(txn.get(key)))
    runtime = Runtime(store_path, clock=SimulatedClock(0.5), seed=0)
    with runtime:
        handler = Seen()
        pool = runtime.define("p", execute=handler, retry=RetryPolicy(max_attempts=3))
        assert pool.join(timeout=10)
        assert handler.events == []
        [dead] = pool.dead_letters()
        assert (dead.damaged, dead.attempts) == (True, 1)


# -- events whose keys are damaged: their records stored nowhere --------------------------

LOST = (
    "DamagedRecordError: its record is missing: its key was damaged "
    "(dopool check names the stray record)"
)


def move_out(txn: Txn, key: bytes) -> bytes:
    """Move the record under ``key`` to the key a flipped bit of its pool's name makes
    (``p`` to ``o``, as the fuzz test's flip did): the record is stored, under a key of
    no event. Returns that key."""
    ns = Namespace("p", 0)
    assert key.startswith(ns.prefix)
    stray = Namespace("o", 0).prefix + key[len(ns.prefix) :]
    value = txn.get(key)
    assert value is not None
    txn.delete(key)
    txn.put(stray, value)
    return stray


def lost_store(path: Path, where: str) -> bytes:
    """Pool ``p`` (one instance) holding events 0, 1 and 2, event 1 with dedup key "k",
    and due at 50.0 if ``where`` is "scheduled"; event 1's key moved out. Returns it."""
    with Runtime.simulated(path, seed=0) as runtime:
        pool = runtime.define("p", execute=Seen(), dedup_window=60.0)
        pool.pause()
        pool.enqueue({"n": 0})
        delay = 50.0 if where == "scheduled" else None
        pool.enqueue({"n": 1}, dedup_key="k", delay=delay)
        pool.enqueue({"n": 2})
    ns = Namespace("p", 0)
    key = ns.delayed_key(0, 1, 50.0) if where == "scheduled" else ns.queue_key(0, 1, 0.0)
    with raw_store(path) as txn:
        return move_out(txn, key)


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
@pytest.mark.parametrize("where", ["due", "scheduled"])
def test_an_event_whose_key_is_damaged_is_dead_lettered_as_damaged_and_never_run(
    store_path: Path, caplog: pytest.LogCaptureFixture, where: str, backend: str
) -> None:
    """Its record is under a key of no event (``dopool check`` names it); the meta counts
    it and its index entry names it. It is dead-lettered as damaged, with no bytes, its
    dedup key released; the events behind it run, and the instance never crashes."""
    stray = lost_store(store_path, where)
    handler = Seen()
    dead_seen: list[Any] = []
    runtime = Runtime(store_path, clock=SimulatedClock(100.0, backend=backend), seed=0)
    with runtime, caplog.at_level(logging.ERROR, logger="dopool"):
        pool = runtime.define(
            "p", execute=handler, dedup_window=60.0, on_dead_letter=dead_seen.append
        )
        pool.resume()
        assert pool.join(timeout=10)
        assert handler.events == [{"n": 0}, {"n": 2}]
        [dead] = pool.dead_letters()
        assert (dead.sequence, dead.event, dead.error) == (1, b"", LOST)
        assert (dead.damaged, dead.attempts, dead.priority, dead.dedup_key) == (True, 0, 0, "k")
        assert dead_seen == [dead]
        assert f"event 1 dead-lettered: {LOST}" in caplog.text
        info = pool.event("p:0:1")
        assert info is not None
        assert info.state == "dead_lettered"
        status = pool.status()
        counts = (status.enqueued, status.succeeded, status.dead_lettered, status.pending)
        assert counts == (3, 2, 1, 0)
        assert status.instance(0).restarts == 0
        assert pool.redrive() == 0  # damaged: never redriven
        # Its key was released as a bury releases it: finished now, so for the window
        # an enqueue with it is its duplicate (an entry left unfinished would be stale,
        # and claimed anew).
        again = pool.enqueue({"n": 3}, dedup_key="k")
        assert (again.duplicate, again.sequence) == (True, 1)
    with raw_store(store_path) as txn:
        problems = check_store(txn).problems
    assert stray in {problem.key for problem in problems}
    assert {problem.instance for problem in problems} == {"o:0"}  # p:0 itself is sound


@pytest.mark.parametrize("state", ["backoff", "running"])
def test_a_started_event_whose_key_is_damaged_is_dead_lettered_after_its_attempt(
    store_path: Path, state: str
) -> None:
    """In backoff, it is dead-lettered at its retry; interrupted by a crash (running), at
    the recovery. Either way with the attempt it had, and the event behind it runs."""
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define(
            "p",
            execute=Seen(lambda ctx: 1 / 0 if ctx.event == "flaky" else None),
            retry=RetryPolicy(max_attempts=3, jitter=0),
        )
        pool.enqueue("flaky")
        runtime.clock.run_until(0.5)  # type: ignore[attr-defined]
        assert pool.status().instance(0).state == "backoff"
        pool.pause()
        pool.enqueue("next")
    ns = Namespace("p", 0)
    with raw_store(store_path) as txn:
        move_out(txn, ns.queue_key(0, 0, 0.0))
        if state == "running":  # as a crash during its second attempt leaves it
            meta = ns.load_meta(txn)
            meta.running, meta.retry_at, meta.attempt = True, None, 2
            ns.save_meta(txn, meta)
    handler = Seen()
    with Runtime(store_path, clock=SimulatedClock(0.5), seed=0) as runtime:
        pool = runtime.define("p", execute=handler, retry=RetryPolicy(max_attempts=3))
        pool.resume()
        assert pool.join(timeout=10)
        assert handler.events == ["next"]
        [dead] = pool.dead_letters()
        assert (dead.sequence, dead.error, dead.damaged) == (0, LOST, True)
        assert dead.attempts == (1 if state == "backoff" else 2)
        status = pool.status()
        assert (status.succeeded, status.dead_lettered, status.pending) == (1, 1, 0)
        assert status.instance(0).restarts == 0


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
@pytest.mark.parametrize("entry", ["deleted", "damaged"])
def test_an_event_whose_key_and_index_entry_are_damaged_leaves_the_counts_reconciled(
    store_path: Path, caplog: pytest.LogCaptureFixture, entry: str, backend: str
) -> None:
    """Nothing names the lost event any more (a damaged entry's sequence may be damaged
    too): the meta's counts are set to what the keys hold, logged at ERROR, and the
    instance goes on, crashing never; ``dopool check`` names the stray record."""
    stray = lost_store(store_path, "due")
    with raw_store(store_path) as txn:
        key = Namespace("p", 0)._entries + (1).to_bytes(8, "big")
        if entry == "deleted":
            txn.delete(key)
        else:
            txn.put(key, flip(txn.get(key)))
    handler = Seen()
    runtime = Runtime(store_path, clock=SimulatedClock(100.0, backend=backend), seed=0)
    with runtime, caplog.at_level(logging.ERROR, logger="dopool"):
        pool = runtime.define("p", execute=handler, dedup_window=60.0)
        pool.resume()
        assert pool.join(timeout=10)
        assert handler.events == [{"n": 0}, {"n": 2}]
        assert pool.dead_letters() == []
        assert (
            "instance p:0: its meta counted 1 pending events (0 scheduled, {0: 1} by "
            "priority), its keys hold 0 (0 scheduled, {})"
        ) in caplog.text
        status = pool.status()
        assert (status.succeeded, status.pending, status.instance(0).restarts) == (2, 0, 0)
        pool.enqueue({"n": 3})
        assert pool.join(timeout=10)
        assert handler.events[-1] == {"n": 3}
    with raw_store(store_path) as txn:
        assert stray in {problem.key for problem in check_store(txn).problems}


def test_a_damaged_due_event_with_only_scheduled_events_behind_it_crashes_nothing(
    store_path: Path,
) -> None:
    """Set aside, it leaves no event due: the start stops there, as an expiry does, and
    the scheduled event runs at its time."""
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define("p", execute=Seen())
        pool.pause()
        pool.enqueue("now")
        pool.enqueue("later", delay=500.0)
    key = Namespace("p", 0).queue_key(0, 0, 0.0)
    with raw_store(store_path) as txn:
        txn.put(key, flip(txn.get(key)))
    handler = Seen()
    with Runtime(store_path, clock=SimulatedClock(100.0), seed=0) as runtime:
        pool = runtime.define("p", execute=handler)
        pool.resume()
        assert pool.join(timeout=10)
        assert handler.events == ["later"]
        [dead] = pool.dead_letters()
        assert (dead.sequence, dead.damaged) == (0, True)
        assert pool.status().instance(0).restarts == 0


def test_a_damaged_dead_letter_is_listed_as_damaged_and_not_redriven(store_path: Path) -> None:
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define("p", execute=Seen(lambda ctx: 1 / 0))
        pool.enqueue_many(["a", "b"])
        assert pool.join(timeout=10)
    key = Namespace("p", 0)._dead + (0).to_bytes(8, "big")
    with raw_store(store_path) as txn:
        txn.put(key, b"\x00garbage")
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define("p", execute=Seen())
        damaged, intact = pool.dead_letters()
        assert (damaged.damaged, damaged.event) == (True, b"\x00garbage")
        assert damaged.error == "DamagedRecordError: checksum mismatch"
        assert (intact.damaged, intact.event) == (False, "b")
        assert pool.dead_letters(error="DamagedRecordError") == [damaged]
        assert pool.redrive(error="DamagedRecordError") == 0  # matched, never redriven
        assert pool.redrive() == 1
        assert [dead.sequence for dead in pool.dead_letters()] == [0]
        assert pool.purge_dead_letters(where=lambda dead: dead.damaged) == 1
        assert pool.dead_letters() == []


def test_a_damaged_meta_record_refuses_the_pool_and_leaves_no_actor(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paused_pool_with(store_path, ["a"])
    key = Namespace("p", 0)._meta
    with raw_store(store_path) as txn:
        txn.put(key, flip(txn.get(key), 10))
    with Runtime.simulated(store_path, seed=0) as runtime:
        with pytest.raises(DamagedRecordError) as caught:
            runtime.define("p", execute=Seen())
        assert caught.value.key == key
        assert caught.value.reason == "checksum mismatch"
        assert pykka.ActorRegistry.get_all() == running_instances() == []
        # Logged by name, without a traceback (dopool worker prints its log on stderr).
        assert "damaged meta record of instance p:0" in caplog.text
        errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
        assert errors
        assert all(record.exc_info is None for record in errors)
        other = runtime.define("q", execute=Seen())  # the runtime goes on
        other.enqueue("x")
        assert other.join(timeout=10)


def test_a_damaged_outbox_entry_is_dropped_with_an_error_not_delivered(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define("p", execute=Seen(), concurrency=2)
        pool.enqueue("x")
        assert pool.join(timeout=10)
    ns = Namespace("p", 0)
    key = ns._outbox + (7).to_bytes(8, "big")
    with raw_store(store_path) as txn:
        txn.put(key, b"not a record")
        meta = ns.load_meta(txn)
        meta.outbox += 1
        ns.save_meta(txn, meta)
    with caplog.at_level(logging.ERROR, logger="dopool"), Runtime.simulated(store_path) as rt:
        pool = rt.define("p", execute=Seen(), concurrency=2)
        assert pool.join(timeout=10)
        assert "follow-up 7 dropped" in caplog.text
        with rt._store.read() as txn:
            assert ns.count_outbox(txn) == 0
            assert ns.load_meta(txn).outbox == 0


def _relay_to_b(ctx: EventContext) -> None:
    ctx.enqueue(ctx.event, pool="b")


def _pipeline(path: Path, events: list[str]) -> None:
    """Pools ``b`` and ``a`` (a's handler sends each event on to b), run to the end."""
    with Runtime.simulated(path, seed=0) as runtime:
        b = runtime.define("b", execute=Seen())
        a = runtime.define("a", execute=_relay_to_b)
        for event in events:
            a.enqueue(event)
        assert a.join(timeout=10)
        assert b.join(timeout=10)


def test_a_damaged_follow_up_for_another_pool_is_dropped_with_an_error(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _pipeline(store_path, ["x"])
    ns = Namespace("a", 0)
    with raw_store(store_path) as txn:
        ns.put_outbox(txn, 7, OutboxRecord("b", 0, 1, b"\xa1y", 1.0, None, 0))
        key = ns.outbox_key(7)
        txn.put(key, flip(txn.get(key) or b""))  # its target's pool is now unknown
        meta = ns.load_meta(txn)
        meta.outbox += 1
        ns.save_meta(txn, meta)
    seen = Seen()
    with caplog.at_level(logging.ERROR, logger="dopool"), Runtime.simulated(store_path) as rt:
        b = rt.define("b", execute=seen)
        a = rt.define("a", execute=_relay_to_b)
        assert a.join(timeout=10)
        assert b.join(timeout=10)
        assert "follow-up 7 dropped" in caplog.text
        assert seen.events == []
        with rt._store.read() as txn:
            assert (ns.count_outbox(txn), ns.load_meta(txn).outbox) == (0, 0)


def test_a_damaged_mark_of_another_pools_source_holds_its_follow_ups_back(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """b:0 cannot tell which of a:0's links it took: it takes none, and a:0 keeps the
    follow-up in its outbox. b:0 goes on with its own events: the damage is logged and
    reported by ``dopool check``, and crashes nothing."""
    _pipeline(store_path, ["x"])
    key = Namespace("b", 0).mark_key("a", 0)
    with raw_store(store_path) as txn:
        txn.put(key, flip(txn.get(key) or b""))
    seen = Seen()
    with Runtime.simulated(store_path) as rt:
        b = rt.define("b", execute=seen)
        a = rt.define("a", execute=_relay_to_b)
        a.enqueue("y")
        clock = rt.clock
        assert isinstance(clock, SimulatedClock)
        clock.run_until(clock.now() + 30)
        b.enqueue("own")
        clock.run_until(clock.now() + 1)  # not join(): it waits for the held follow-up too
        assert seen.events == ["own"]
        assert b.status().instance(0).crash_streak == 0
        assert "delivery mark" in caplog.text
        with rt._store.read() as txn:
            held = [record for _, record in Namespace("a", 0).iter_outbox(txn)]
            assert [(r.pool, r.link, r.event) for r in held] == [("b", 1, b"\xa1y")]  # type: ignore[union-attr]
            assert [p.key for p in check_store(txn).problems] == [key]


def test_an_enqueue_to_an_instance_whose_meta_is_damaged_names_the_record(
    store_path: Path,
) -> None:
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define("p", execute=Seen())
        activate(pool)  # running, its meta damaged under it
        key = Namespace("p", 0)._meta
        with runtime._store.write() as txn:
            txn.put(key, b"\x00\x00\x00\x00")
        direct_path(pool, 0)._memory.meta = None  # forget the copy of the last commit
        with pytest.raises(DamagedRecordError, match="checksum mismatch"):
            pool.enqueue("x")
        with pytest.raises(DamagedRecordError):
            pool.status()


def test_a_follow_up_sealed_with_a_priority_no_enqueue_takes_is_dropped_not_crash_looped(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crafted record with a sound checksum: its priority fits no queue key's rank.
    Delivered, it would crash its target at every attempt; read, it is damaged."""
    _pipeline(store_path, ["x"])
    ns = Namespace("a", 0)
    with raw_store(store_path) as txn:
        ns.put_outbox(txn, 7, OutboxRecord("b", 0, 1, b"\xa1y", 1.0, None, 2**40))
        meta = ns.load_meta(txn)
        meta.outbox += 1
        ns.save_meta(txn, meta)
        [problem] = check_store(txn).problems
        assert problem.what == f"damaged: field 'priority' is {2**40}"
    seen = Seen()
    with caplog.at_level(logging.ERROR, logger="dopool"), Runtime.simulated(store_path) as rt:
        b = rt.define("b", execute=seen)
        a = rt.define("a", execute=_relay_to_b)
        a.enqueue("z")
        assert a.join(timeout=10)
        assert b.join(timeout=10)
        assert "follow-up 7 dropped" in caplog.text
        assert seen.events == ["z"]
        assert b.status().instance(0).restarts == 0


@pytest.mark.parametrize(
    "change",
    [{"priority": -(2**40)}, {"every": 0.0005}],
    ids=["priority out of range", "every below the least"],
)
def test_a_schedule_sealed_with_an_impossible_value_is_not_fired(
    store_path: Path, caplog: pytest.LogCaptureFixture, change: dict[str, Any]
) -> None:
    """Crafted records with a sound checksum: a priority no queue key can rank (the
    occurrence would crash its instance at each delivery), an ``every`` no definition
    takes (a flood of occurrences). Read, each is damaged; the other schedule fires."""
    with Runtime.simulated(store_path) as rt:
        pool = rt.define("p", execute=Seen(), concurrency=2)
        pool.schedule("bad", "b", every=10.0)
        pool.schedule("good", "g", every=10.0)
    book = ScheduleBook(Namespace("p", 0))
    with raw_store(store_path) as txn:
        key = book.record_key("bad")
        record = book.get(txn, "bad")
        assert record is not None
        txn.put(key, seal(key, pack(record._replace(**change))))
        assert [p.key for p in check_store(txn).problems] == [key]
    seen = Seen()
    with caplog.at_level(logging.ERROR, logger="dopool"), Runtime.simulated(store_path) as rt:
        pool = rt.define("p", execute=seen, concurrency=2)
        clock = rt.clock
        assert isinstance(clock, SimulatedClock)
        clock.run_until(10.004)
        assert seen.events == ["g"]
        assert "a schedule is not fired" in caplog.text
        with pytest.raises(DamagedRecordError) as caught:
            pool.schedules()
        assert caught.value.key == key
        status = pool.status()
        assert [status.instance(i).restarts for i in range(2)] == [0, 0]


def test_a_stray_key_among_the_pending_events_is_deleted_by_a_drain_uncounted(
    store_path: Path,
) -> None:
    """A key under the queue's (or the scheduled events') prefix of no event's length is
    no event: the instance runs past it, and a drain, here dopool drain's, deletes it
    without counting it, instead of refusing with 'N pending but N + 1 keys'."""
    paused_pool_with(store_path, ["a", "b"])
    ns = Namespace("p", 0)
    strays = [ns.prefix + b"q\x01", ns.prefix + b"w" + bytes(30)]
    with raw_store(store_path) as txn:
        for stray in strays:
            txn.put(stray, seal(stray, pack([])))
    result = invoke("drain", str(store_path), "--pool", "p")
    assert result.exit_code == 0, result.output
    with raw_store(store_path) as txn:
        assert [txn.get(stray) for stray in strays] == [None, None]
        assert check_store(txn).ok
        assert ns.load_meta(txn).drained == 2
