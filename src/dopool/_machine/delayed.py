"""The queue machine's delayed events: one not due yet is stored aside, and moved into
the run queue when its due time comes. Part of the queue machine (:mod:`dopool._machine.machine`).

An event enqueued with a ``delay`` or a ``not_before`` still in the future is stored at
once under a *delayed* key, ordered by due time, and counted in the meta's
``pending`` and ``scheduled`` (the stored counter's name, docs/store-format.md);
``next_due`` is the earliest due time among them, so the alarm slot can cover it
from the meta alone (:func:`dopool._machine.alarm.rearm`). When the instance looks
for work (its alarm, an outcome's chained start) the ones due by then
are *promoted*: moved, in one transaction, to the run queue, under the queue key of
their due time. The first queue key is then always the next event to run, and no
start scans past events that are not due. Promotion only keeps books: it starts
nothing, and where it happens later than the due time (the instance was busy or
paused) the order is the same, since the queue key holds the due time, not the time
of the move.

An event due when it is stored gets a queue key with the due time ``now``, or the
meta's ``last_due`` if that is later: the highest due time any queue key was given.
Under a clock that never steps back the two are the same; under a real clock stepped
back (NTP), the event still goes behind every event already due of its priority, so
events enqueued due keep their FIFO order. ``QueueMachine.append`` writes it out.
"""

from __future__ import annotations

from dopool._machine.types import Item
from dopool._store.layout import Meta, Namespace
from dopool._store.txn import Txn


def store_delayed(
    ns: Namespace, txn: Txn, meta: Meta, sequence: int, item: Item, at: float, now: float
) -> None:
    """Store ``item`` as event ``sequence``, not due until ``at`` (later than ``now``).

    The caller counts it in ``pending`` and ``scheduled``.
    """
    expires = None if item.ttl is None else now + item.ttl
    ns.add_delayed(
        txn,
        sequence,
        item.event,
        now,
        item.partition_key,
        item.priority,
        at,
        item.dedup_key,
        expires,
        item.trace,
    )
    if meta.next_due is None or at < meta.next_due:
        meta.next_due = at


def promote(ns: Namespace, txn: Txn, meta: Meta, now: float) -> bool:
    """Move the delayed events due by ``now`` into the run queue, and count them there;
    False if the meta counts scheduled events that no key holds (their keys were
    damaged: the caller sets them aside, ``DeadLetters.set_aside_lost``).

    Cheap to call: it reads nothing unless one is due.
    """
    if meta.next_due is None or meta.next_due > now:
        return True
    moved = ns.promote(txn, now)
    counts = meta.priorities
    for priority in moved.priorities:
        counts[priority] = counts.get(priority, 0) + 1
    meta.scheduled -= len(moved.priorities)
    meta.next_due = moved.next_due
    last = moved.last_due
    if last is not None and (meta.last_due is None or last > meta.last_due):
        meta.last_due = last
    return meta.next_due is not None or not meta.scheduled
