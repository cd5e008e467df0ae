"""The queue machine's drain: every pending event removed, but one whose attempt runs.
Part of the queue machine (:mod:`dopool._machine.machine`).

A runtime drains an instance from its own actor, between two messages: no attempt
of it runs then. ``dopool drain`` drains it from another process, in a transaction
of its own (:func:`dopool._handles.connection.control`), which may commit while the
owner runs one of its events. That event is kept, with the attempt's state: the owner's outcome
(success, retry, dead letter) then commits on it as usual, and with no owner the
next recovery settles the attempt. Removing it would leave an outcome nothing to
settle, and count an event drained that ran.
"""

from __future__ import annotations

from dopool._errors import StorageError
from dopool._machine.alarm import rearm
from dopool._store.layout import EventIndex, Meta, Namespace, queue_key_priority, queue_key_sequence
from dopool._store.txn import Txn


def running_sequence(meta: Meta) -> int | None:
    """The sequence of the event whose attempt is running, which a drain keeps; or None."""
    return None if meta.current is None or not meta.running else queue_key_sequence(meta.current)


def drain(ns: Namespace, txn: Txn, meta: Meta, now: float, instance: str) -> int:
    """Remove every pending event but a running attempt's; how many were removed.

    Counters but ``pending`` and ``drained``, the paused flag and the dead letters stay.
    The caller releases the removed events' dedup keys first (``Dedup.release_pending``).
    """
    running = meta.current if meta.running else None
    kept = None if running is None else ns.get_event(txn, running)
    removed = ns.delete_events(txn)
    count = meta.pending
    if removed != count:
        raise StorageError(f"instance {instance}: {count} pending but {removed} keys")
    meta.scheduled = 0
    meta.next_due = None
    if running is not None and kept is not None:  # back under its own key, as it was
        ns.put_event(txn, running, kept)
        EventIndex(ns).put_entry(txn, running)  # and in the index, which the drain emptied
        meta.pending = 1
        meta.priorities = {queue_key_priority(running): 1}
    else:
        meta.pending = 0
        meta.priorities = {}
        meta.current = None
        meta.attempt = 0
        meta.retry_at = None
        meta.last_error = meta.last_traceback = None
    drained = count - meta.pending
    meta.drained += drained
    rearm(meta, now)
    return drained
