"""The storage invariants of guarantee 4 ("Counters", docs/guarantees.md), on a real store.

Each test writes one balanced instance with :class:`Namespace`, breaks one invariant,
and expects :func:`violations` to name exactly that one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dopool._machine.invariants import broken_invariants, read_instance, violations
from dopool._store.environment import Store
from dopool._store.layout import DeadRecord, Meta, Namespace, OutboxRecord, pack
from dopool._store.txn import Txn

NS = Namespace("p", 0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "store", durability="async")
    yield store
    store.close()


def write_balanced(txn: Txn) -> Meta:
    """Five enqueued: one succeeded, one dead-lettered (sequence 3), three pending, the
    one of priority 5 started; one follow-up waiting in the outbox."""
    for sequence, priority in ((0, 0), (1, 0), (2, 5)):
        NS.add_event(txn, sequence, pack(sequence), 0.0, None, priority, 0.0)
    NS.put_dead_letter(txn, 3, DeadRecord(pack(3), "ValueError: x", 1, 0.0, 1.0, None, 0))
    NS.put_outbox(txn, 0, OutboxRecord("p", 1, 0, pack("kid"), 1.0, None, 0))
    meta = Meta(
        tail=5,
        enqueued=5,
        pending=3,
        succeeded=1,
        dead_lettered=1,
        held_dead_letters=1,
        outbox=1,
        priorities={5: 1, 0: 2},
        current=NS.queue_key(5, 2, 0.0),
        attempt=1,
        running=True,
        last_due=0.0,
    )
    NS.save_meta(txn, meta)
    return meta


def found(store: Store, damage: Callable[[Txn, Meta], None] | None = None) -> list[str]:
    """The violations of the balanced instance, once ``damage`` changed it."""
    with store.write() as txn:
        meta = write_balanced(txn)
        if damage is not None:
            damage(txn, meta)
            NS.save_meta(txn, meta)
    with store.read() as txn:
        return violations(read_instance(txn, "p", 0))


def test_a_balanced_instance_passes(store: Store) -> None:
    assert found(store) == []
    with store.read() as txn:
        state = read_instance(txn, "p", 0)
    assert (state.pending_keys, state.dead_letter_keys, state.outbox_keys) == (3, 1, 1)
    assert state.priorities == {5: 1, 0: 2}
    assert state.last_sequence == 3
    assert state.started_has_record


def test_an_instance_never_written_is_balanced(store: Store) -> None:
    with store.read() as txn:
        state = read_instance(txn, "p", 7)
    assert state.meta == Meta()
    assert violations(state) == []


def unbalanced(txn: Txn, meta: Meta) -> None:
    meta.enqueued = 6


def pending_not_the_keys(txn: Txn, meta: Meta) -> None:
    meta.pending, meta.succeeded = 4, 0  # still balanced, but one queue key short


def dead_letters_not_the_keys(txn: Txn, meta: Meta) -> None:
    meta.held_dead_letters = 2


def outbox_not_the_keys(txn: Txn, meta: Meta) -> None:
    NS.delete_outbox(txn, 0)


def priorities_not_the_keys(txn: Txn, meta: Meta) -> None:
    meta.priorities = {5: 2, 0: 1}


def a_sequence_past_the_tail(txn: Txn, meta: Meta) -> None:
    meta.tail = 3  # the dead letter's sequence is 3


def started_without_a_record(txn: Txn, meta: Meta) -> None:
    meta.current = NS.queue_key(5, 4, 0.0)


def running_without_a_start(txn: Txn, meta: Meta) -> None:
    meta.current = None


def waiting_without_an_alarm(txn: Txn, meta: Meta) -> None:
    meta.running = False  # the started event waits for its next attempt, and no alarm


def stalled_while_running(txn: Txn, meta: Meta) -> None:
    meta.alarm_failures = 7  # no alarm, failures counted: given up, but an attempt runs


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (unbalanced, "enqueued 6 != succeeded + dead_lettered + drained + cancelled + pending = 5"),
        (pending_not_the_keys, "meta counts 4 pending events, the store holds 3"),
        (dead_letters_not_the_keys, "meta counts 2 dead letters, the store holds 1"),
        (outbox_not_the_keys, "meta counts 1 outbox entries, the store holds 0"),
        (
            priorities_not_the_keys,
            "meta counts {5: 2, 0: 1} per priority, the keys {5: 1, 0: 2}",
        ),
        (a_sequence_past_the_tail, "sequence 3 at or past the tail 3"),
        (started_without_a_record, "the started event 4 has no record"),
        (running_without_a_start, "an attempt is running, but no event is started"),
        (waiting_without_an_alarm, "3 pending events, no alarm set, and not stalled"),
        (
            stalled_while_running,
            "stalled (7 alarm failures, no alarm) with 3 pending and running=True",
        ),
    ],
)
def test_each_broken_invariant_is_named(
    store: Store, damage: Callable[[Txn, Meta], None], expected: str
) -> None:
    assert found(store, damage) == [f"p:0: {expected}"]


def stalled(txn: Txn, meta: Meta) -> None:
    meta.running, meta.alarm_failures = False, 7  # the alarm was given up


def paused_without_an_alarm(txn: Txn, meta: Meta) -> None:
    meta.running, meta.paused = False, True


def waiting_for_an_alarm(txn: Txn, meta: Meta) -> None:
    meta.running, meta.alarm = False, 12.5


@pytest.mark.parametrize("state", [stalled, paused_without_an_alarm, waiting_for_an_alarm])
def test_pending_events_need_an_alarm_unless_paused_running_or_stalled(
    store: Store, state: Callable[[Txn, Meta], None]
) -> None:
    assert found(store, state) == []


def test_the_keys_of_a_neighbour_and_stray_keys_are_not_counted(store: Store) -> None:
    neighbour = Namespace("p", 10)  # its keys begin with "p:1", not with "p:1\0"
    with store.write() as txn:
        write_balanced(txn)
        neighbour.add_event(txn, 0, pack(0), 0.0, None, 0, 0.0)
        txn.put(NS.prefix + b"q" + b"\x00" * 3, b"stray: a suffix of the wrong length")
        txn.put(NS.prefix + b"z", b"stray: no such tag")
    with store.read() as txn:
        assert violations(read_instance(txn, "p", 0)) == []
        assert read_instance(txn, "p", 1).pending_keys == 0


def test_the_lines_name_the_instance_and_the_bare_list_does_not(store: Store) -> None:
    with store.write() as txn:
        meta = write_balanced(txn)
        meta.enqueued, meta.held_dead_letters = 9, 0
        NS.save_meta(txn, meta)
    with store.read() as txn:
        state = read_instance(txn, "p", 0)
    assert state.name == "p:0"
    assert broken_invariants(state) == [
        "meta counts 0 dead letters, the store holds 1",
        "enqueued 9 != succeeded + dead_lettered + drained + cancelled + pending = 5",
    ]
    assert violations(state) == [f"p:0: {line}" for line in broken_invariants(state)]
