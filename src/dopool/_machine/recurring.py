"""The queue machine's recurring schedules: defined, removed, and fired by instance 0.
Part of the queue machine (:mod:`dopool._machine.machine`).

A pool's schedules live in instance 0's namespace (:mod:`dopool._store.layout.schedules`), so
they exist under any concurrency. Instance 0's alarm slot covers the earliest fire
time (the meta's ``next_fire``: :func:`dopool._machine.alarm.rearm`), and taking a due alarm
fires every schedule due by then, unless the instance is paused. A fire enqueues one
occurrence, routed as an enqueue with the schedule's partition key (its name if it has
none), into instance 0's own queue or its outbox (:mod:`dopool._machine.followups`), in the
transaction that moves the schedule's next fire time on: each fire time is fired once.

Times (docs/guarantees.md, "Recurring schedules"): ``every=S`` fires first at the
definition's ``now + S``, then ``S`` after the previous fire *time* (no drift); ``cron``
at each of its times after the definition, read in UTC, the clock's time being seconds
since 1970-01-01T00:00Z. A fire that comes late (the process was down, instance 0 was
paused or busy) enqueues one occurrence for all the fire times that passed, and the next
fire time is the first one after now.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError

from dopool._errors import DamagedRecordError
from dopool._machine.alarm import rearm, wake
from dopool._machine.types import Item
from dopool._store.layout import Meta, Namespace, ScheduleBook, ScheduleRecord
from dopool._store.txn import Txn

logger = logging.getLogger("dopool")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The most cron times one late fire counts as coalesced; past it, it jumps to now.
MAX_COUNTED = 10_000

# machine.follow_ups.commit: store follow-ups made "now" (here, or in the outbox).
Commit = Callable[[Txn, Meta, Iterable[tuple[Item, None]], float, Any], None]
FaultPoint = Callable[[str, str], None]


def cron_problem(expression: str) -> str | None:
    """Why ``expression`` is no 5-field cron expression cronsim reads; None if it is one."""
    if len(expression.split()) != 5:
        return f"{len(expression.split())} fields, not 5"
    try:
        CronSim(expression, _EPOCH)
    except CronSimError as exc:
        return str(exc) or type(exc).__name__
    return None


def cron_after(expression: str, time: float) -> float | None:
    """The first time of ``expression`` strictly after clock time ``time``; None if none."""
    try:
        start = _EPOCH + timedelta(seconds=time)
        match = next(CronSim(expression, start))
    except (CronSimError, OverflowError, ValueError, StopIteration):
        return None
    return (match - _EPOCH).total_seconds()


def _time_left(at: float) -> float | None:
    """``at``, or None past the largest float: a schedule with no time left, as a cron
    expression's can be (an infinite time is no clock time, and no record takes it)."""
    return at if math.isfinite(at) else None


def first_fire(every: float | None, cron: str | None, now: float) -> float | None:
    """A new definition's first fire time."""
    if every is not None:
        return _time_left(max(now + every, math.nextafter(now, math.inf)))  # see following()
    assert cron is not None
    return cron_after(cron, now)


def following(record: ScheduleRecord, now: float) -> tuple[float | None, int]:
    """After a fire at ``now`` (its ``next_at`` passed): the next fire time, strictly
    after ``now``, and how many fire times passed (1 if it fired on time)."""
    at = record.next_at
    assert at is not None
    every = record.every
    if every is not None:
        passed = math.floor((now - at) / every) + 1
        nxt = at + passed * every
        if nxt <= now:  # the division's rounding; or, past ~4.5e12 s, every below the
            passed += 1  # clock's resolution: the next representable time, never now
            nxt = max(nxt + every, math.nextafter(now, math.inf))
        return _time_left(nxt), passed
    assert record.cron is not None
    passed, later = 1, cron_after(record.cron, at)
    while later is not None and later <= now:
        if passed >= MAX_COUNTED:
            return cron_after(record.cron, now), passed
        passed += 1
        later = cron_after(record.cron, later)
    return later, passed


class Recurring:
    """Instance 0's schedules: the transitions that define, remove and fire them.

    Args:
        namespace: instance 0's namespace.
        commit: stores an occurrence as a follow-up made now (routed by the pool).
        fault_point: crashes the instance at a named point, if it must.
    """

    __slots__ = ("_book", "_commit", "_fault_point", "_id")

    def __init__(self, namespace: Namespace, commit: Commit, fault_point: FaultPoint) -> None:
        self._book = ScheduleBook(namespace)
        self._commit = commit
        self._fault_point = fault_point
        self._id = namespace.prefix[1:-1].decode(errors="replace")

    @property
    def book(self) -> ScheduleBook:
        return self._book

    def define(self, txn: Txn, meta: Meta, spec: ScheduleRecord, now: float) -> ScheduleRecord:
        """Store ``spec`` (its times and counts aside) under its name; the record stored.

        An identical definition changes nothing, its next fire time included; another
        replaces the stored one, counts reset, its first fire computed from ``now``.
        A damaged record under the name is replaced.
        """
        book = self._book
        try:
            old = book.get(txn, spec.name)
            known = old is not None
        except DamagedRecordError:
            old, known = None, True  # its fire key, if any, is dropped when it comes due
        if old is not None and old.same_definition(spec):
            return old
        record = spec._replace(
            next_at=first_fire(spec.every, spec.cron, now),
            fired=0,
            coalesced=0,
            last_fired_at=None,
        )
        book.put(txn, record, old)
        if not known:
            meta.schedules += 1
        meta.next_fire = book.next_fire(txn)
        wake(meta)  # a write ends a stall
        rearm(meta, now)
        return record

    def remove(self, txn: Txn, meta: Meta, name: str, now: float) -> bool:
        """Remove the schedule named ``name``; whether there was one."""
        book = self._book
        try:
            old = book.get(txn, name)
        except DamagedRecordError:
            txn.delete(book.record_key(name))  # its fire key goes when it comes due
            old = None
            meta.schedules -= 1
        else:
            if old is None:
                return False
            book.delete(txn, old)
            meta.schedules -= 1
        meta.next_fire = book.next_fire(txn)
        rearm(meta, now)
        return True

    def fire_due(self, txn: Txn, meta: Meta, now: float, fx: Any) -> None:
        """Fire every schedule due by ``now``: one occurrence each, however many of its
        fire times passed. A fire key that names no record at that time is dropped."""
        book = self._book
        while meta.next_fire is not None and meta.next_fire <= now:
            first = book.first_fire(txn)
            if first is None or first[0] > now:
                meta.next_fire = None if first is None else first[0]
                break
            at, name, key = first
            try:
                record = book.record_by_name_key(txn, name)
            except DamagedRecordError as damage:
                logger.error("instance %s: a schedule is not fired: %s", self._id, damage)
                record = None
            if record is None or record.next_at != at:
                txn.delete(key)
            else:
                self._fire(txn, meta, record, now, fx)
            meta.next_fire = book.next_fire(txn)

    def _fire(self, txn: Txn, meta: Meta, record: ScheduleRecord, now: float, fx: Any) -> None:
        nxt, passed = following(record, now)
        key = record.name if record.partition_key is None else record.partition_key
        self._commit(txn, meta, [(Item(record.event, key, record.priority), None)], now, fx)
        if meta.pending:  # the occurrence refilled this queue: it is not left empty
            fx.empty = None
        fired = record._replace(
            next_at=nxt,
            fired=record.fired + 1,
            coalesced=record.coalesced + passed - 1,
            last_fired_at=now,
        )
        self._book.put(txn, fired, record)
        self._fault_point("schedule_fire", "crash_during_fire")  # all written, nothing committed
