"""Scheduled events in the queue machine, driven directly: their keys, their promotion into
the run queue, the order of due events, and the alarm slot that covers them."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dopool import RetryPolicy
from dopool._machine.invariants import read_instance, violations
from dopool._machine.types import Effects, Item
from dopool._ops.check import check_store
from dopool._store.environment import Store
from dopool._store.layout import (
    MIGRATED_DUE,
    Meta,
    Namespace,
    decode_due,
    delayed_key_due,
    delayed_key_priority,
    encode_due,
    open_sealed,
    pack,
    queue_key_due,
    queue_key_priority,
    queue_key_sequence,
    seal,
    unpack,
)
from dopool._store.txn import Txn
from machine_rig import Rig

floats = st.floats(allow_nan=False)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "store", durability="async")
    yield store
    store.close()


def enqueue(rig: Rig, *events: Any, now: float, due: float | None = None, priority: int = 0) -> Any:
    """One batch of ``events`` due at ``due`` (None: at once), accepted at ``now``."""
    items = tuple(Item(pack(event), None, priority, due) for event in events)

    def accept(txn: Txn, meta: Meta, fx: Effects) -> None:
        rig.machine.accept(txn, meta, [("t", items)], now, fx)
        rig.machine.rearm(meta, now)

    _, fx = rig.step(accept)
    [(_, answer)] = fx.answers
    return answer


def run_next(rig: Rig, now: float) -> Any:
    """Take the alarm at ``now``; if that started an event, succeed it. The event, or None."""
    started = rig.start(now)
    if started is None:
        return None
    rig.succeed(now)
    return unpack(started[1].event)


def alarm(rig: Rig) -> float | None:
    """The alarm slot as the last step left it (a call: mypy keeps no narrowing across)."""
    return rig.meta.alarm


def stored_keys(rig: Rig) -> tuple[list[bytes], list[bytes]]:
    """The instance's queue keys and scheduled keys, in key order."""
    ns = rig.machine.namespace
    with rig.store.read() as txn:
        return list(ns.iter_event_keys(txn)), list(ns.iter_delayed_keys(txn))


# -- the keys -------------------------------------------------------------------------


@given(floats, floats)
def test_a_due_times_encoding_sorts_as_the_times_do(a: float, b: float) -> None:
    assert (encode_due(a) < encode_due(b)) == (a < b)
    assert decode_due(encode_due(a)) == a
    assert (
        struct.pack(">Q", encode_due(a)) < struct.pack(">Q", encode_due(math.inf)) or a == math.inf
    )


def test_minus_zero_is_zero_and_minus_infinity_is_the_lowest_due() -> None:
    assert encode_due(-0.0) == encode_due(0.0)
    assert encode_due(MIGRATED_DUE) < encode_due(-1e308)


@given(
    st.lists(
        st.tuples(st.integers(-(2**31), 2**31 - 1), floats, st.integers(0, 2**63)),
        min_size=2,
        max_size=20,
        unique_by=lambda entry: entry[2],
    )
)
def test_queue_keys_sort_by_priority_then_due_then_sequence(
    entries: list[tuple[int, float, int]],
) -> None:
    ns = Namespace("p", 0)
    keys = sorted(ns.queue_key(p, s, d) for p, d, s in entries)
    parsed = [(queue_key_priority(k), queue_key_due(k), queue_key_sequence(k)) for k in keys]
    assert parsed == sorted(
        [(p, d + 0.0, s) for p, d, s in entries], key=lambda e: (-e[0], e[1], e[2])
    )
    waiting = sorted(ns.delayed_key(p, s, d) for p, d, s in entries)
    assert [delayed_key_due(k) for k in waiting] == sorted(d + 0.0 for p, d, s in entries)
    assert sorted(delayed_key_priority(k) for k in waiting) == sorted(p for p, d, s in entries)


# -- storing ----------------------------------------------------------------------------------


def test_an_event_due_later_is_scheduled_not_queued(store: Store) -> None:
    rig = Rig(store)
    [result] = enqueue(rig, "later", now=0.0, due=10.0)
    meta = rig.meta
    assert (meta.pending, meta.scheduled, meta.next_due, meta.priorities) == (1, 1, 10.0, {})
    assert meta.alarm == 10.0  # the alarm slot covers it
    assert (result.sequence, result.position, result.event_id) == (0, 0, "p:0:0")
    queue, waiting = stored_keys(rig)
    assert (queue, waiting) == ([], [rig.machine.namespace.delayed_key(0, 0, 10.0)])
    assert rig.broken() == []


@pytest.mark.parametrize("due", [0.0, -5.0, None])
def test_an_event_due_by_now_is_an_ordinary_one(store: Store, due: float | None) -> None:
    rig = Rig(store)
    enqueue(rig, "now", now=0.0, due=due)
    assert (rig.meta.scheduled, rig.meta.priorities, rig.meta.alarm) == (0, {0: 1}, 0.0)
    queue, waiting = stored_keys(rig)
    assert (queue, waiting) == ([rig.machine.namespace.queue_key(0, 0, 0.0)], [])
    assert rig.broken() == []


def test_a_scheduled_events_position_is_the_due_events_sure_to_run_first(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "a", "b", now=0.0)
    enqueue(rig, "high", now=0.0, priority=3)
    low = enqueue(rig, "x", "y", now=0.0, due=5.0)
    high = enqueue(rig, "z", now=0.0, due=5.0, priority=3)
    assert [r.position for r in low] == [3, 4]  # all three due first, then x before y
    assert [r.position for r in high] == [1]
    after = enqueue(rig, "c", now=0.0)  # behind a, b, high (due), not x, y, z (scheduled)
    assert [r.position for r in after] == [3]


def test_max_queue_depth_counts_scheduled_events(store: Store) -> None:
    rig = Rig(store, max_queue_depth=2)
    enqueue(rig, "a", now=0.0, due=9.0)
    enqueue(rig, "b", now=0.0)
    full = enqueue(rig, "c", now=0.0, due=1.0)
    assert (full.depth, full.max_depth) == (2, 2)


# -- promotion and order --------------------------------------------------------------------


def test_due_events_run_by_priority_then_due_time_then_sequence(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "b-due-5", now=0.0, due=5.0)
    enqueue(rig, "c-prio-1-due-7", now=0.0, due=7.0, priority=1)
    enqueue(rig, "d-due-3", now=0.0, due=3.0)
    enqueue(rig, "e-due-3", now=0.0, due=3.0)
    enqueue(rig, "a-now", now=0.0)
    assert rig.meta.alarm == 0.0
    # Nothing ran until t=10: one look then moves all four, each by its due time.
    ran = [run_next(rig, 10.0) for _ in range(6)]
    assert ran == ["c-prio-1-due-7", "a-now", "d-due-3", "e-due-3", "b-due-5", None]
    assert rig.broken() == []


def test_a_scheduled_event_does_not_hold_up_due_events(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "later", now=0.0, due=5.0, priority=9)
    enqueue(rig, "now", now=1.0)
    assert rig.meta.alarm == 1.0
    assert run_next(rig, 1.0) == "now"
    assert rig.meta.alarm == 5.0
    assert run_next(rig, 4.0) is None  # a stale alarm: nothing is due
    assert rig.meta.alarm == 5.0
    assert run_next(rig, 5.0) == "later"
    assert (alarm(rig), rig.meta.pending) == (None, 0)


def test_a_scheduled_event_never_starts_before_its_due_time(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "later", now=0.0, due=5.0)
    rig.meta.alarm = 0.0  # an early alarm, as after a failed delivery's retry
    before = math.nextafter(5.0, 0.0)
    assert run_next(rig, before) is None
    assert (rig.meta.scheduled, rig.meta.alarm) == (1, 5.0)
    assert run_next(rig, 5.0) == "later"


def test_events_due_now_keep_fifo_when_the_clock_steps_back(store: Store) -> None:
    """An event due when stored goes behind every event already due of its priority, even
    if the clock read earlier than for the one before it (a real clock stepped back)."""
    rig = Rig(store)
    first = enqueue(rig, "first", now=100.0)
    second = enqueue(rig, "second", now=90.0)
    assert [r.position for r in first + second] == [0, 1]
    queue, _ = stored_keys(rig)
    assert [queue_key_due(key) for key in queue] == [100.0, 100.0]
    assert [run_next(rig, 90.0) for _ in range(2)] == ["first", "second"]
    assert rig.broken() == []


def test_a_promoted_event_keeps_its_due_time_not_the_time_it_moved(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "scheduled-for-2", now=0.0, due=2.0)
    enqueue(rig, "blocker", now=0.0, priority=5)
    rig.start(now=0.0)  # the blocker runs from 0 to 6: nothing moves meanwhile
    enqueue(rig, "enqueued-at-4", now=4.0)
    rig.succeed(6.0)  # the outcome's rearm: the alarm is due
    assert [run_next(rig, 6.0) for _ in range(2)] == ["scheduled-for-2", "enqueued-at-4"]
    assert rig.meta.last_due == 4.0


def test_drain_removes_scheduled_events_too(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "a", now=0.0)
    enqueue(rig, "b", "c", now=0.0, due=8.0)
    count, _ = rig.step(lambda txn, meta, fx: rig.machine.drain(txn, meta, 1.0, fx))
    meta = rig.meta
    assert (count, meta.pending, meta.scheduled, meta.next_due, meta.drained) == (3, 0, 0, None, 3)
    assert stored_keys(rig) == ([], [])
    assert meta.alarm is None
    assert rig.broken() == []


def test_a_paused_instance_has_no_alarm_and_moves_due_events_when_resumed(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "later", now=0.0, due=5.0)
    fx = Effects()
    rig.step(lambda txn, meta, _: rig.machine.set_paused(meta, True, 1.0, fx))
    assert alarm(rig) is None
    rig.step(lambda txn, meta, _: rig.machine.set_paused(meta, False, 9.0, fx))
    assert (alarm(rig), rig.meta.scheduled) == (5.0, 1)  # due since 5: fires at once
    assert run_next(rig, 9.0) == "later"


def test_the_alarm_covers_a_scheduled_event_due_during_a_backoff(store: Store) -> None:
    rig = Rig(store, retry=RetryPolicy(max_attempts=2, initial_delay=10, jitter=0))
    enqueue(rig, "flaky", now=0.0)
    enqueue(rig, "early", now=0.0, due=4.0)
    enqueue(rig, "late", now=0.0, due=30.0)
    rig.start(0.0)
    rig.fail(ValueError("boom"), now=0.0)
    assert (rig.meta.retry_at, rig.meta.alarm) == (10.0, 4.0)
    assert rig.broken() == []
    assert rig.start(4.0) is None  # head-of-line: it only moves "early"
    assert (rig.meta.scheduled, rig.meta.alarm) == (1, 10.0)
    assert run_next(rig, 10.0) == "flaky"
    assert run_next(rig, 10.0) == "early"
    assert rig.meta.alarm == 30.0
    assert rig.broken() == []


def test_recovery_rearms_the_alarm_for_scheduled_events(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "later", now=0.0, due=7.0)
    rig.meta.alarm = None  # as if the alarm had been lost with a crash
    rig.step(lambda txn, meta, fx: rig.machine.recover(txn, meta, 1, 2.0, fx))
    assert alarm(rig) == 7.0
    assert rig.broken() == []


def test_a_damaged_scheduled_record_moves_as_found_and_is_dead_lettered(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "later", now=0.0, due=5.0)
    enqueue(rig, "next", now=0.0, due=6.0)
    key = rig.machine.namespace.delayed_key(0, 0, 5.0)
    with store.write() as txn:
        value = bytearray(txn.get(key) or b"")
        value[-1] ^= 1
        txn.put(key, bytes(value))
    started, fx = rig.step(lambda txn, meta, fx: rig.machine.take_alarm(txn, meta, 6.0, fx))
    [dead] = fx.dead
    assert (dead.sequence, dead.damaged) == (0, True)
    assert unpack(started[1].event) == "next"
    assert rig.broken() == []


@pytest.mark.parametrize(
    "bits", [0xFFF0 << 48, 0xFFF8 << 48, 0x0007 << 48], ids=["inf", "nan", "-nan"]
)
def test_a_scheduled_key_due_at_no_finite_time_is_dead_lettered_not_kept(
    store: Store, bits: int
) -> None:
    """A crafted key (its record sealed for it) due at +inf or NaN: no enqueue gives one.
    It moves to the run queue as found, so it is dead-lettered as damaged, instead of
    staying for ever and making its due time the meta's ``next_due``, which the meta's
    own checks then refuse (the instance refused for good)."""
    rig = Rig(store)
    enqueue(rig, "crafted", now=0.0, due=5.0)
    enqueue(rig, "next", now=0.0, due=6.0)
    ns = rig.machine.namespace
    key = ns.delayed_key(0, 0, 5.0)
    crafted = key[:-20] + struct.pack(">Q", bits) + key[-12:]
    assert not math.isfinite(delayed_key_due(crafted))
    with store.write() as txn:
        txn.put(crafted, seal(crafted, open_sealed(key, txn.pop(key))))
        named = [p.key for p in check_store(txn).problems if "scheduled event due at" in p.what]
    assert named == [crafted]
    dead = []
    for _ in range(2):  # the crafted key sorts before "next" (-nan) or after it
        started, fx = rig.step(lambda txn, meta, fx: rig.machine.take_alarm(txn, meta, 6.0, fx))
        dead += fx.dead
        if started is not None:
            assert unpack(started[1].event) == "next"
            rig.succeed(6.0)
    assert [(d.sequence, d.damaged) for d in dead] == [(0, True)]
    with store.read() as txn:
        meta = ns.load_meta(txn)  # it reads
    assert (meta.pending, meta.scheduled, meta.next_due, meta.succeeded) == (0, 0, None, 1)


# -- what the invariants see ---------------------------------------------------------------


def test_the_invariants_check_the_scheduled_books(store: Store) -> None:
    rig = Rig(store)
    enqueue(rig, "a", now=0.0, due=5.0)
    enqueue(rig, "b", now=0.0, due=9.0)
    assert rig.broken() == []

    def broken_with(**changes: Any) -> list[str]:
        with store.read() as txn:
            state = read_instance(txn, "p", 0)
        for name, value in changes.items():
            setattr(state.meta, name, value)
        return violations(state)

    assert broken_with(scheduled=1) == ["p:0: meta counts 1 scheduled events, the store holds 2"]
    assert broken_with(next_due=9.0) == ["p:0: meta's next due time 9.0, the keys' 5.0"]
    assert broken_with(alarm=6.0) == ["p:0: the alarm at 6.0 is past the next due time 5.0"]
    assert broken_with(alarm=6.0, paused=True) == []
    enqueue(rig, "c", now=3.0)
    assert broken_with(last_due=2.0) == ["p:0: a queue key due at 3.0, past last_due 2.0"]
