"""An event's life seen by its id: looking it up, cancelling it, remembering it finished.

Part of the queue machine (:mod:`dopool._machine.machine`), which calls :class:`Lifecycle` in its
transitions; :func:`lookup` reads committed state for ``pool.event`` and producers. The
records are :mod:`dopool._store.layout.events`' (an index entry per unfinished event, a record
and an expiry key per remembered finished one); the semantics are in docs/api.md
("Looking events up", "Cancelling an event").
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from dopool._errors import DamagedRecordError, EventIdError
from dopool._machine.alarm import rearm
from dopool._machine.dedup import Dedup
from dopool._store.layout import (
    FINISHED_STATES,
    EventIndex,
    EventRecord,
    FinishedRecord,
    Located,
    Meta,
    Namespace,
    delayed_key_due,
    delayed_key_priority,
    queue_key_due,
    queue_key_priority,
    queue_key_sequence,
    read_dead,
)
from dopool._store.txn import Txn
from dopool._types import EventInfo, EventKind, EventState, PoolEvent

MakeEvent = Callable[..., PoolEvent]

#: How an expired event's dead letter's error begins (a handler's failure begins with
#: its exception's type name, never this).
EXPIRED = "expired: "

#: The last sequence an instance can issue (a key holds it in 8 bytes), and its digits.
MAX_SEQUENCE = 2**64 - 1
_MAX_SEQUENCE_DIGITS = len(str(MAX_SEQUENCE))


def parse_event_id(event_id: object, pool: str, concurrency: int) -> tuple[int, int]:
    """The instance index and sequence of one of ``pool``'s event ids.

    Raises:
        EventIdError: not ``"<pool>:<index>:<sequence>"`` of this pool and one of its
            instances (an id of another pool is a mistake, not an unknown event).
    """
    if not isinstance(event_id, str):
        raise EventIdError(event_id=event_id, pool=pool, reason="not a str")
    name, _, rest = event_id.rpartition(":")
    name, _, index = name.rpartition(":")
    if not (index.isascii() and index.isdigit() and rest.isascii() and rest.isdigit()):
        raise EventIdError(event_id=event_id, pool=pool, reason="not <pool>:<index>:<sequence>")
    if name != pool:
        raise EventIdError(event_id=event_id, pool=pool, reason=f"an id of pool {name!r}")
    # A sequence is 8 bytes in a key: a longer one was never issued, and would have
    # crashed the instance asked to cancel it (or int() refused its 5,000 digits).
    if len(rest) > _MAX_SEQUENCE_DIGITS or int(rest) > MAX_SEQUENCE:
        reason = f"a sequence past {MAX_SEQUENCE}, the last an instance can issue"
        raise EventIdError(event_id=event_id, pool=pool, reason=reason)
    if int(index) >= concurrency:
        reason = f"the pool has no instance {int(index)}"
        raise EventIdError(event_id=event_id, pool=pool, reason=reason)
    return int(index), int(rest)


def lookup(
    txn: Txn,
    ns: Namespace,
    meta: Meta,
    pool: str,
    index: int,
    sequence: int,
    keep_finished: float,
    now: float,
) -> EventInfo | None:
    """Event ``sequence`` of instance ``index`` from committed state; None if unknown.

    Checked in order: unfinished (the index entry), finished and remembered (for
    ``keep_finished`` seconds after it finished), dead-lettered and still held.

    Raises:
        DamagedRecordError: the event's record (or its remembered one) is damaged.
    """
    if sequence >= meta.tail:
        return None  # never enqueued
    ident = f"{pool}:{index}:{sequence}"
    events = EventIndex(ns)
    located = events.locate(txn, sequence)
    if located is not None:
        record = events.read(txn, located)
        state, due, priority = _unfinished(meta, located)
        current = located.key == meta.current
        return EventInfo(
            ident,
            pool,
            index,
            sequence,
            state,
            meta.attempt if current else 0,
            record.enqueued_at,
            due,
            meta.last_started if current else None,
            None,
            meta.retry_at if current else None,
            meta.last_error if current else None,
            record.partition_key,
            priority,
            record.dedup_key,
            meta.last_traceback if current else None,
        )
    done = events.finished(txn, sequence)
    key = ns.dead_letter_key(sequence)
    raw = txn.get(key)
    if done is not None and done.finished_at + keep_finished > now:
        # A dead letter still held keeps its traceback; one damaged tells none.
        dead = None
        if raw is not None:
            with suppress(DamagedRecordError):
                dead = read_dead(key, raw)
        return EventInfo(
            ident,
            pool,
            index,
            sequence,
            _finished_state(done.state),
            done.attempts,
            done.enqueued_at,
            done.due,
            done.started_at,
            done.finished_at,
            None,
            done.error,
            done.partition_key,
            done.priority,
            done.dedup_key,
            None if dead is None else dead.traceback,
        )
    if raw is None:
        return None
    dead = read_dead(key, raw)
    return EventInfo(
        ident,
        pool,
        index,
        sequence,
        "expired" if dead.error.startswith(EXPIRED) else "dead_lettered",
        dead.attempts,
        dead.enqueued_at,
        None,
        None,
        dead.failed_at,
        None,
        dead.error,
        dead.partition_key,
        dead.priority,
        dead.dedup_key,
        dead.traceback,
    )


_FINISHED: dict[str, EventState] = {state: state for state in FINISHED_STATES}  # type: ignore[misc]


def _finished_state(name: str) -> EventState:
    """A remembered record's state (checked when it was read)."""
    return _FINISHED[name]


def _unfinished(meta: Meta, located: Located) -> tuple[EventState, float, int]:
    """An unfinished event's state, due time and priority, from its key and the meta."""
    key = located.key
    if located.scheduled:
        return "scheduled", delayed_key_due(key), delayed_key_priority(key)
    state: EventState = "pending"
    if key == meta.current:
        if meta.running:
            state = "running"
        elif meta.retry_at is not None:
            state = "backoff"
    return state, queue_key_due(key), queue_key_priority(key)


class Lifecycle:
    """The machine's part in an event's life by id: remembering finishes, sweeping them,
    cancelling. Each method runs inside the machine's open write transaction."""

    __slots__ = ("_dedup", "_event", "_events", "_index", "_keep", "_ns")

    def __init__(
        self, ns: Namespace, index: int, keep_finished: float, dedup: Dedup, event: MakeEvent
    ) -> None:
        self._ns = ns
        self._index = index
        self._events = EventIndex(ns)
        self._keep = keep_finished
        self._dedup = dedup
        self._event = event

    def finished(
        self,
        txn: Txn,
        meta: Meta,
        key: bytes,
        state: EventState,
        error: str | None,
        now: float,
        sweep: bool = True,
    ) -> None:
        """The event at ``key`` finishes now (before it is removed): sweep the remembered
        records past their time, and remember this one if the pool keeps finished events.

        A damaged record is not remembered (a damaged dead letter holds its bytes).
        """
        if meta.remembered and sweep:  # (the hot path, with keep_finished 0, reads nothing)
            meta.remembered -= self._events.sweep(txn, now - self._keep)
        if not self._keep:
            return
        try:
            record = self._ns.get_event(txn, key)
        except DamagedRecordError:
            return
        if record is None:
            return
        current = key == meta.current
        scheduled = self._events.is_delayed(key)
        remembered = FinishedRecord(
            state,
            meta.attempt if current else 0,
            record.enqueued_at,
            delayed_key_due(key) if scheduled else queue_key_due(key),
            meta.last_started if current else None,
            now,
            error if error is not None or not current else meta.last_error,
            record.partition_key,
            record.priority,
            record.dedup_key,
        )
        self._events.remember(txn, queue_key_sequence(key), remembered)
        meta.remembered += 1

    @staticmethod
    def expired(record: EventRecord, now: float) -> bool:
        """Whether an event about to start for the first time is past its ttl."""
        return record.expires_at is not None and now >= record.expires_at

    def drained(self, txn: Txn, meta: Meta, now: float, keep: int | None = None) -> None:
        """Every pending event but ``keep`` (a running attempt's) is drained now: remember
        each, before the drain deletes them. A drain sweeps nothing: it may be another
        process's (``dopool drain``), which does not know the owner's ``keep_finished``."""
        if not self._keep:
            return
        for key in [*self._ns.iter_event_keys(txn), *self._ns.iter_delayed_keys(txn)]:
            if queue_key_sequence(key) != keep:
                self.finished(txn, meta, bytes(key), "drained", None, now, sweep=False)

    def cancel(
        self,
        txn: Txn,
        meta: Meta,
        sequence: int,
        now: float,
        remove: Callable[[Txn, Meta, bytes], None],
        events: list[PoolEvent],
    ) -> bool:
        """Cancel event ``sequence`` if it is scheduled, pending or in backoff; whether it was.

        A running event, a finished or unknown one, and one whose record is damaged
        (its turn dead-letters it) are left alone. ``remove`` takes a due event out of
        the queue (the machine's), freeing the head of line if it was the current one.
        """
        located = self._events.locate(txn, sequence)
        if located is None or (located.key == meta.current and meta.running):
            return False
        try:
            record = self._events.read(txn, located)
        except DamagedRecordError:
            return False
        key = located.key
        self.finished(txn, meta, key, "cancelled", None, now)
        if located.scheduled:
            self._ns.delete_event(txn, key)
            meta.pending -= 1
            meta.scheduled -= 1
            if meta.scheduled == 0:
                meta.next_due = None
            elif delayed_key_due(key) == meta.next_due:
                meta.next_due = self._events.first_due(txn)
        else:
            remove(txn, meta, key)
        meta.cancelled += 1
        if record.dedup_key is not None:
            self._dedup.release(txn, record.dedup_key, self._index, sequence, now)
        kind: EventKind = "cancelled"
        events.append(self._event(kind, now, sequence))
        rearm(meta, now)
        return True
