"""The dead letters of one instance: an event buried (its attempts ended, or its record is
damaged), redriven as new events, or purged. Part of the queue machine
(:mod:`dopool._machine.machine`).

A buried event leaves the queue for the dead letters in the transaction of its last
outcome, and releases its dedup key. A pending event whose record is damaged is set
aside without being decoded: its dead letter keeps the bytes as found, is marked
``damaged``, and is never redriven. So is one whose record is stored nowhere, because its
key was damaged (the record is then under a key of no event, which ``dopool check``
names): the meta counts it, the event index names it, and its dead letter holds no bytes
(:meth:`DeadLetters.set_aside_lost`).

A redrive takes the dead letters asked for (all, or some by sequence) out of the store
and appends them to the queue as new events, with new sequences, in one transaction.
A damaged dead letter stays, to be inspected and purged; so does one whose dedup key's
index entry is damaged. A redrive is a new enqueue with the dead letter's dedup key,
checked like any (:mod:`dopool._machine.dedup`), except that the dead letter's own finish does
not hold the key against it: one whose key another event holds is that event's
duplicate, removed, counted in the meta's ``duplicates``, and not stored. A redriven
event has no ttl.

An event not started within its ttl is *expired* when it would start: buried with an
error that says so, counted in the meta's ``expired`` as well as ``dead_lettered``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dopool._errors import DamagedRecordError
from dopool._machine.alarm import rearm
from dopool._machine.dedup import Dedup, keyed
from dopool._machine.lifecycle import EXPIRED
from dopool._machine.status import dead_letter_from_record
from dopool._machine.types import Effects, Item
from dopool._store.layout import (
    DeadRecord,
    EventIndex,
    EventRecord,
    Meta,
    Namespace,
    queue_key_priority,
    queue_key_sequence,
)
from dopool._store.txn import Txn
from dopool._types import EventState, PoolEvent

logger = logging.getLogger("dopool")

#: Why an event whose record is stored nowhere was dead-lettered (after its error's type).
LOST = "its record is missing: its key was damaged (dopool check names the stray record)"

# The machine's: append items as new events; remove the current event; make a PoolEvent.
Append = Callable[[Txn, Meta, tuple[Item, ...], float, "Effects"], object]
# Removes a finished event: key, its final state, its error, the time.
Remove = Callable[[Txn, Meta, bytes, EventState, str | None, float], None]
MakeEvent = Callable[..., PoolEvent]


class DeadLetters:
    """Instance ``index``'s dead letters (see the module docstring)."""

    __slots__ = ("_append", "_dedup", "_event", "_events", "_id", "_index", "_ns", "_remove")

    def __init__(
        self,
        *,
        ident: str,
        index: int,
        namespace: Namespace,
        dedup: Dedup,
        append: Append,
        remove: Remove,
        event: MakeEvent,
    ) -> None:
        self._id = ident
        self._index = index
        self._ns = namespace
        self._events = EventIndex(namespace)
        self._dedup = dedup
        self._append = append
        self._remove = remove
        self._event = event

    def bury(
        self,
        txn: Txn,
        meta: Meta,
        key: bytes,
        sequence: int,
        dead: DeadRecord,
        now: float,
        fx: Effects,
        state: EventState = "dead_lettered",
        rows_read: int | None = None,
    ) -> None:
        """Move the event at ``key`` to the dead letters, in this transaction
        (``rows_read``: the storage rows its last attempt's handler read)."""
        self._ns.put_dead_letter(txn, sequence, dead)
        meta.held_dead_letters += 1
        meta.dead_lettered += 1
        self._remove(txn, meta, key, state, dead.error, now)
        if dead.dedup_key is not None:
            self._dedup.release(txn, dead.dedup_key, self._index, sequence, now)
        event = self._event(
            "dead_lettered", now, sequence, dead.attempts, dead.error, rows_read=rows_read
        )
        fx.events.append(event)
        fx.dead.append(dead_letter_from_record(self._index, sequence, dead))
        fx.empty = None if meta.pending else len(fx.events)

    def set_aside(
        self, txn: Txn, meta: Meta, damage: DamagedRecordError, now: float, fx: Effects
    ) -> None:
        """Dead-letter a pending event whose record is damaged, without decoding it."""
        key = damage.key
        sequence = queue_key_sequence(key)
        attempts = meta.attempt if meta.current == key else 0
        error = f"DamagedRecordError: {damage.reason}"
        priority = queue_key_priority(key)
        dead = DeadRecord(damage.value, error, attempts, now, now, None, priority, True)
        logger.error("instance %s: event %d dead-lettered: %s", self._id, sequence, error)
        self.bury(txn, meta, key, sequence, dead, now, fx)

    def set_aside_lost(self, txn: Txn, meta: Meta, now: float, fx: Effects) -> None:
        """The meta counts pending events that no key holds (a start found none to
        take): dead-letter as damaged each one the event index names that is stored
        nowhere, and set the meta's counts to what the keys hold.

        A lost event's dead letter has no bytes, the priority its index entry says, and
        its dedup key, if an entry names it (released, as a bury does). With none found
        (the index is damaged too), only the counts change, logged at ERROR: the stray
        record stays for ``dopool check`` to name. Scans: for a damaged store only.
        """
        ns, events = self._ns, self._events
        priorities, scheduled, next_due = events.tally(txn)
        stored = sum(priorities.values()) + scheduled
        counted = (meta.pending, meta.scheduled, dict(meta.priorities))
        found = [  # never one that was not issued, nor one already dead-lettered
            (sequence, key)
            for sequence, key in events.lost(txn)
            if sequence < meta.tail and txn.get(ns.dead_letter_key(sequence)) is None
        ][: max(0, meta.pending - stored)]
        started = meta.current
        current = None if started is None else queue_key_sequence(started)
        # The current event's own key, so that its removal frees the head of the line.
        lost = [(s, started if s == current and started else key) for s, key in found]
        for _, key in lost:  # counted among the due events: bury's removal uncounts it
            priority = queue_key_priority(key)
            priorities[priority] = priorities.get(priority, 0) + 1
        meta.pending, meta.scheduled, meta.next_due = stored + len(lost), scheduled, next_due
        meta.priorities = priorities
        dedup_keys = self._dedup.held_by(txn, self._index, {sequence for sequence, _ in lost})
        error = f"DamagedRecordError: {LOST}"
        for sequence, key in lost:
            attempts = meta.attempt if key == meta.current else 0
            priority, dedup_key = queue_key_priority(key), dedup_keys.get(sequence)
            dead = DeadRecord(b"", error, attempts, now, now, None, priority, True, dedup_key)
            logger.error("instance %s: event %d dead-lettered: %s", self._id, sequence, error)
            self.bury(txn, meta, key, sequence, dead, now, fx)
        if meta.current is not None and txn.get(meta.current) is None:  # its entry lost too
            meta.current, meta.attempt, meta.retry_at = None, 0, None
            meta.last_error = meta.last_traceback = None
        if counted[0] - stored != len(lost):
            logger.error(
                "instance %s: its meta counted %d pending events (%d scheduled, %s by "
                "priority), its keys hold %d (%d scheduled, %s): counts set to the keys' "
                "(a damaged key: dopool check names the stray record)",
                self._id,
                *counted,
                stored,
                scheduled,
                meta.priorities,
            )
        fx.empty = None if meta.pending else len(fx.events)

    def expire(
        self, txn: Txn, meta: Meta, key: bytes, record: EventRecord, now: float, fx: Effects
    ) -> None:
        """Dead-letter an event not started within its ttl, instead of starting it."""
        assert record.expires_at is not None
        ttl = record.expires_at - record.enqueued_at
        error = f"{EXPIRED}not started within its ttl of {ttl:g} s (by {record.expires_at:.3f})"
        meta.expired += 1
        self.bury_event(txn, meta, key, record, error, 0, now, fx, "expired")

    def bury_event(
        self,
        txn: Txn,
        meta: Meta,
        key: bytes,
        record: EventRecord,
        error: str,
        attempts: int,
        now: float,
        fx: Effects,
        state: EventState = "dead_lettered",
        rows_read: int | None = None,
        trace: str | None = None,
    ) -> None:
        """Move the event at ``key``, its record ``record``, to the dead letters after
        ``attempts``, failed with ``error`` and its traceback ``trace`` (:meth:`bury`)."""
        dead = DeadRecord(
            record.event,
            error,
            attempts,
            record.enqueued_at,
            now,
            record.partition_key,
            record.priority,
            False,
            record.dedup_key,
            trace,
        )
        self.bury(txn, meta, key, queue_key_sequence(key), dead, now, fx, state, rows_read)

    def redrive(
        self, txn: Txn, meta: Meta, wanted: frozenset[int] | None, now: float, fx: Effects
    ) -> int:
        """Re-enqueue dead letters (those ``wanted``, or all) as new events; how many were
        stored."""
        dedup = self._dedup
        chosen = [
            (sequence, dead)
            for sequence, dead in self._ns.iter_dead_letters(txn)
            if (wanted is None or sequence in wanted)
            and not dead.damaged
            and (dead.dedup_key is None or dedup.readable(txn, dead.dedup_key))
        ]
        for sequence, _ in chosen:
            self._ns.pop_dead_letter(txn, sequence)
        batch = tuple(
            Item(dead.event, dead.partition_key, dead.priority, None, dead.dedup_key)
            for _, dead in chosen
        )
        meta.held_dead_letters -= len(batch)
        if keyed(batch):
            owners = [(self._index, sequence) for sequence, _ in chosen]
            duplicates = dedup.resolve(txn, batch, now, owners)
            batch = tuple(item for n, item in enumerate(batch) if n not in duplicates)
            meta.duplicates += len(duplicates)
        self._append(txn, meta, batch, now, fx)
        rearm(meta, now)
        return len(batch)

    def purge(self, txn: Txn, meta: Meta, wanted: frozenset[int] | None) -> int:
        """Delete the dead letters ``wanted`` still stored, or all; how many. No counter
        changes."""
        if wanted is None:
            count, meta.held_dead_letters = self._ns.delete_dead_letters(txn), 0
            return count
        count = sum(self._ns.pop_dead_letter(txn, sequence) is not None for sequence in wanted)
        meta.held_dead_letters -= count
        return count
