"""The queue machine of one instance: every transition of its stored state, and nothing else.

A transition takes the instance's meta record, its namespace inside one open
write transaction, and the time; it writes what changes and records in
:class:`Effects` what must be published once the transaction has committed
(events, dead letters, follow-ups to deliver, answers to enqueues). It never
commits, publishes, sleeps or talks to another actor: the actor shell
(:mod:`dopool._engine.shell`) loads and saves the meta, commits, and publishes. So
each transition can be driven directly by a test, on a store, in microseconds.
Where follow-ups go, and which deliveries it takes, is :mod:`dopool._machine.followups`.

The guarantees these transitions keep are in docs/guarantees.md: order and
priority (guarantee 3), counters (guarantee 4), and what a crash counts as.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from dopool._errors import (
    DamagedRecordError,
    DopoolError,
    QueueFullError,
    StorageError,
    failed,
)
from dopool._machine.alarm import delivery_failed, rearm, wake
from dopool._machine.dead_letters import DeadLetters
from dopool._machine.dedup import Dedup, keyed, merge
from dopool._machine.delayed import promote, store_delayed
from dopool._machine.drain import drain, running_sequence
from dopool._machine.followups import FollowUp, FollowUps
from dopool._machine.lifecycle import Lifecycle
from dopool._machine.rates import Throttle
from dopool._machine.recurring import Recurring
from dopool._machine.status import position as _position
from dopool._machine.types import (
    Batches,
    Cancel,
    DefineSchedule,
    Drain,
    Effects,
    FaultPoint,
    Item,
    Pause,
    Purge,
    QueueRules,
    Redrive,
    Request,
    Resume,
    Started,
    StorageRows,
    Unschedule,
)
from dopool._retry import next_delay, uniform_draw
from dopool._store.layout import (
    DedupClaim,
    EventRecord,
    Meta,
    Namespace,
    OutboxRecord,
    StoredValues,
    queue_key_priority,
    queue_key_sequence,
)
from dopool._store.txn import Txn
from dopool._types import EnqueueResult, EventKind, EventState, PoolEvent
from dopool.chaos import FaultInjector

logger = logging.getLogger("dopool")


class QueueMachine:
    """The transitions of one instance's queue (see the module docstring); ``recurring``
    holds those of its pool's schedules (instance 0's: :mod:`dopool._machine.recurring`).

    Args:
        pool, index: whose queue.
        rules: what the machine reads of the pool's options (retry policy, queue depth).
        seed: the runtime's seed, for retry jitter.
        route: the pool's router: the instance a follow-up's partition key picks.
        faults: this instance's fault injector (alarm delivery failures).
        fault_point: crashes the instance at a named point, if it must.
        listening: whether anyone takes events (if not, the hot path makes none).
    """

    __slots__ = (
        "_dead",
        "_dedup",
        "_fault_point",
        "_faults",
        "_follow_ups",
        "_id",
        "_index",
        "_life",
        "_listening",
        "_ns",
        "_pool",
        "_recurring",
        "_rules",
        "_seed",
        "_throttle",
    )

    def __init__(
        self,
        *,
        pool: str,
        index: int,
        rules: QueueRules,
        seed: int | str | None,
        route: Callable[[str | None], int],
        faults: FaultInjector,
        fault_point: FaultPoint,
        listening: Callable[[], bool],
    ) -> None:
        self._pool = pool
        self._index = index
        self._id = f"{pool}:{index}"
        self._rules = rules
        self._seed = seed
        self._faults = faults
        self._fault_point = fault_point
        self._listening = listening
        self._ns = Namespace(pool, index)
        self._dedup = Dedup(pool, rules.dedup_window)
        self._follow_ups = FollowUps(
            pool=pool, index=index, namespace=self._ns, route=route, append=self.append
        )
        self._dead = DeadLetters(
            ident=self._id,
            index=index,
            namespace=self._ns,
            dedup=self._dedup,
            append=self.append,
            remove=self._finish,
            event=self.event,
        )
        self._life = Lifecycle(self._ns, index, rules.keep_finished, self._dedup, self.event)
        self._recurring = Recurring(self._ns, self._follow_ups.commit, fault_point)
        limit, per_key = rules.rate_limit, rules.rate_limit_per_key
        limited = limit is not None or per_key is not None
        self._throttle = Throttle(pool, self._ns, limit, per_key) if limited else None

    @property
    def namespace(self) -> Namespace:
        return self._ns

    def dismantle(self) -> None:
        """Drop the parts (which hold this machine's methods) and the fault point (the
        shell's): the references that make an incarnation a cycle. For one that has
        stopped for good (evicted), so that it is freed as its last reference goes, not
        by the cyclic collector, which spent 16% of a simulation evicting instances
        after half a second (docs/benchmarks.md). Nothing may call the machine after."""
        del self._dead, self._follow_ups, self._life, self._recurring, self._fault_point

    # -- enqueue -----------------------------------------------------------------
    def accept(self, txn: Txn, meta: Meta, batches: Batches, now: float, fx: Effects) -> None:
        """Append each batch that fits; ``fx.answers`` gets ``(token, answer)`` for each.

        ``token`` is the caller's (its message). A batch is all or nothing: one
        that would pass ``max_queue_depth`` is refused alone (its answer is the
        :class:`QueueFullError`), or whose dedup key's entry is damaged; an item whose
        dedup key an event holds is not stored (:mod:`dopool._machine.dedup`).
        """
        limit = self._rules.max_queue_depth
        for token, batch in batches:
            results: list[EnqueueResult] = []
            keyed_one = len(batch) == 1 and batch[0].dedup_key is not None
            if keyed_one and (limit is None or meta.pending < limit):  # the usual keyed enqueue
                results = self.append(txn, meta, batch, now, fx, claim_first=True)
            if not results:  # (one keyed item's are empty if its key is held: looked up here)
                items, duplicates = batch, None
                if keyed_one or (len(batch) > 1 and keyed(batch)):
                    try:
                        items, duplicates = self._dedup.screen(txn, items, now)
                    except DamagedRecordError as damage:
                        logger.error("instance %s: enqueue refused: %s", self._id, damage)
                        fx.answers.append((token, damage))
                        continue
                incoming = len(items)
                if limit is not None and incoming and meta.pending + incoming > limit:
                    full = QueueFullError(
                        pool=self._pool,
                        instance_index=self._index,
                        depth=meta.pending,
                        max_depth=limit,
                        incoming=incoming,
                    )
                    fx.answers.append((token, full))
                    continue
                results = self.append(txn, meta, items, now, fx) if items else []
                if duplicates:
                    results = merge(incoming + len(duplicates), results, duplicates)
                    meta.duplicates += len(duplicates)
            fx.answers.append((token, results))
            self._fault_point("enqueue", "crash_during_enqueue")

    def enqueue(self, txn: Txn, meta: Meta, batches: Batches, now: float, fx: Effects) -> None:
        """An enqueue's transition, the owner's or a producer's (:mod:`dopool._handles.connection`):
        :meth:`accept`, then point the alarm slot."""
        self.accept(txn, meta, batches, now, fx)
        rearm(meta, now)

    def append(
        self,
        txn: Txn,
        meta: Meta,
        items: tuple[Item, ...],
        now: float,
        fx: Effects,
        claim_first: bool = False,
    ) -> list[EnqueueResult]:
        """Store ``items`` as new pending events, in order; their results. An item due
        later than ``now`` is scheduled (:mod:`dopool._machine.delayed`).

        ``claim_first``: one keyed item, not looked up: its claim, written first, is the
        lookup (``Dedup.claim_free``); if its key has an entry, nothing is written, and
        the results are empty.
        """
        results: list[EnqueueResult] = []
        listening = self._listening()
        ns, index, ident, counts = self._ns, self._index, self._id, meta.priorities
        dedup = self._dedup
        claims: list[DedupClaim] = []  # written together, after the events
        # Due now, and never before an event already due (a clock stepped back: _scheduled).
        due = now if meta.last_due is None or meta.last_due < now else meta.last_due
        previous: int | None = None
        was_waiting = False
        position = 0
        scheduled = 0
        for item in items:
            priority, at = item.priority, item.due
            waiting = at is not None and at > now
            if priority == previous and waiting == was_waiting:
                position += 1  # right behind the one before, of the same priority
            else:
                position = _position(meta, priority)
                previous, was_waiting = priority, waiting
            sequence = meta.tail
            key = item.dedup_key
            if key is not None:
                key_due = at if waiting and at is not None else due  # the due time its key has
                claim = (key, index, sequence, position, priority, key_due)
                if not claim_first:
                    claims.append(claim)
                elif not dedup.claim_free(txn, *claim):
                    return results  # held: nothing is written (the only item)
            meta.tail = sequence + 1
            if waiting and at is not None:
                store_delayed(ns, txn, meta, sequence, item, at, now)
                scheduled += 1
            else:
                ttl = item.ttl
                expires = None if ttl is None else now + ttl
                ns.add_event(
                    txn,
                    sequence,
                    item.event,
                    now,
                    item.partition_key,
                    priority,
                    due,
                    key,
                    expires,
                    item.trace,
                )
                counts[priority] = counts.get(priority, 0) + 1
            results.append(EnqueueResult(sequence, index, ident, position))
            if listening:  # a scheduled one says when it is due
                fx.events.append(self.event("enqueued", now, sequence, due=at if waiting else None))
        if claims:
            dedup.claim(txn, claims)
        if scheduled != len(items):
            meta.last_due = due
        meta.scheduled += scheduled
        meta.pending += len(items)
        meta.enqueued += len(items)
        if self._rules.per_key and meta.key is None and items:  # the instance's first
            meta.key = items[0].partition_key
        if items and meta.alarm_failures:  # (the hot path skips the call)
            wake(meta)  # a write ends a stall: the caller's rearm sets the alarm
        return results

    # -- the alarm and the start of an attempt --------------------------------------
    def take_alarm(self, txn: Txn, meta: Meta, now: float, fx: Effects) -> Started | None:
        """Act on the alarm slot if it is due: start the next attempt, if there is one.

        A stale or early alarm is harmless. A delivery that fails (``alarm_error``)
        does nothing but set a retry of the alarm after a backoff, or, past the
        pool's ``alarm_retries``, give the alarm up: the instance stalls
        (:mod:`dopool._machine.alarm`).
        """
        if meta.alarm is None or meta.alarm > now or meta.running:
            return None
        if self._faults.active and self._faults.fires("alarm_error"):
            gave_up = delivery_failed(meta, now, self._rules.alarm_retries)
            if gave_up is not None:
                fx.events.append(self.event("alarm_given_up", now, error=gave_up))
            return None
        meta.alarm_failures = 0
        if meta.next_fire is not None and not meta.paused:  # instance 0's schedules
            self._recurring.fire_due(txn, meta, now, fx)
        return self._start_attempt(txn, meta, now, fx)

    def _start_attempt(
        self, txn: Txn, meta: Meta, now: float, fx: Effects, reconciled: bool = False
    ) -> Started | None:
        """Consume the alarm and, if there is work, record the next attempt's start.

        A damaged event record met on the way is dead-lettered, never started; so is
        one stored nowhere (its key was damaged), once the meta is found counting
        events that no key holds (:meth:`DeadLetters.set_aside_lost`; ``reconciled``:
        that was done in this transaction already).
        """
        meta.alarm = None
        if not promote(self._ns, txn, meta, now) and not reconciled:
            self._dead.set_aside_lost(txn, meta, now, fx)
            reconciled = True
        if meta.paused or meta.pending == meta.scheduled:  # nothing due
            rearm(meta, now)  # the next scheduled event's due time, if any
            return None
        if meta.current is not None and meta.retry_at is not None and meta.retry_at > now:
            rearm(meta, now)  # never run a retry early (nor a scheduled event late)
            return None
        while True:
            try:
                if meta.current is None:
                    first = self._ns.first_event(txn)
                    key, record = (None, None) if first is None else first
                    if first is not None and self._life.expired(first[1], now):  # first start
                        self._dead.expire(txn, meta, *first, now, fx)
                        if meta.pending == meta.scheduled:
                            rearm(meta, now)
                            return None
                        continue
                else:
                    key = meta.current
                    record = self._ns.get_event(txn, key)
                break
            except DamagedRecordError as damage:
                self._dead.set_aside(txn, meta, damage, now, fx)
                if meta.pending == meta.scheduled:  # none due now
                    rearm(meta, now)  # the next scheduled event, a schedule's next fire
                    return None
        if key is None or record is None:  # the meta counts an event no key holds
            if reconciled:  # (set_aside_lost made the counts the keys': never again)
                raise StorageError(f"instance {self._id}: {meta.pending} pending but no event key")
            self._dead.set_aside_lost(txn, meta, now, fx)
            return self._start_attempt(txn, meta, now, fx, reconciled=True)
        throttle = self._throttle
        if throttle is None:
            meta.throttled_until = None  # (a limit the pool had before: gone now)
        elif not throttle.take(txn, meta, now, record.partition_key):
            rearm(meta, now)  # at the next token
            return None
        meta.current = key
        meta.attempt += 1
        meta.running = True
        meta.retry_at = None
        meta.started_at = meta.last_started = now
        return key, record, meta.attempt, now

    rearm = staticmethod(rearm)  # the alarm slot where the state needs it (``_alarm.rearm``)

    # -- outcomes ----------------------------------------------------------------------
    def finish_attempt(self, meta: Meta) -> None:
        """The started attempt has an outcome now: it is no longer running."""
        meta.running = False
        meta.started_at = None

    def succeed(
        self,
        txn: Txn,
        meta: Meta,
        key: bytes,
        attempt: int,
        follow_ups: list[FollowUp],
        now: float,
        fx: Effects,
        dedup_key: str | None = None,
        writes: Mapping[str, bytes | None] | None = None,
        rows: StorageRows | None = None,
    ) -> None:
        """The current event succeeded: remove it, store its follow-ups, and apply its
        handler's writes to the instance's storage (``None``: delete the key); ``rows``,
        what its handler did with the storage, goes on its ``succeeded`` event."""
        self._finish(txn, meta, key, "succeeded", None, now)
        if writes:
            stored = StoredValues(self._ns)
            for name, value in writes.items():
                if value is None:
                    meta.stored -= stored.delete(txn, name)
                else:
                    meta.stored += stored.put(txn, name, value)
        meta.succeeded += 1
        if dedup_key is not None:
            self._dedup.release(txn, dedup_key, self._index, queue_key_sequence(key), now)
        if self._listening():
            sequence = queue_key_sequence(key)
            fx.events.append(self.event("succeeded", now, sequence, attempt, rows=rows))
        if follow_ups:
            self._follow_ups.commit(txn, meta, follow_ups, now, fx)
        fx.empty = None if meta.pending else len(fx.events)

    def fail(
        self,
        txn: Txn,
        meta: Meta,
        key: bytes,
        record: EventRecord,
        failure: BaseException,
        now: float,
        fx: Effects,
        rows_read: int | None = None,
        trace: str | None = None,
    ) -> None:
        """Settle a failed attempt of the current event: schedule a retry or dead-letter it.
        ``rows_read``: the storage rows its handler read (none it wrote is committed);
        ``trace``: the failure's traceback, kept while in backoff and by the dead letter."""
        sequence = queue_key_sequence(key)
        error = failed(failure)
        attempt, rules = meta.attempt, self._rules
        draw = partial(uniform_draw, self._seed, self._pool, self._index, sequence, attempt)
        delay = next_delay(failure, attempt, rules.max_attempts, rules.retry, draw)
        if delay is None:
            self._dead.bury_event(
                txn, meta, key, record, error, attempt, now, fx, rows_read=rows_read, trace=trace
            )
            return
        meta.retry_at = now + delay
        meta.last_error = error
        meta.last_traceback = trace
        retry = self.event("retry_scheduled", now, sequence, attempt, error, rows_read=rows_read)
        fx.events.append(retry)

    def _finish(
        self, txn: Txn, meta: Meta, key: bytes, state: EventState, error: str | None, now: float
    ) -> None:
        """Remove the event at ``key``, which finishes now as ``state`` (remembered, if the
        pool keeps finished events: :mod:`dopool._machine.lifecycle`)."""
        self._life.finished(txn, meta, key, state, error, now)
        self._remove_current(txn, meta, key)

    def _remove_current(self, txn: Txn, meta: Meta, key: bytes) -> None:
        """Take a due event out of the queue: the current one, or (cancelled) another."""
        self._ns.delete_event(txn, key)
        priority = queue_key_priority(key)
        remaining = meta.priorities[priority] - 1
        if remaining:
            meta.priorities[priority] = remaining
        else:
            del meta.priorities[priority]
        meta.pending -= 1
        if key == meta.current:
            meta.current = None
            meta.attempt = 0
            meta.retry_at = None
            meta.last_error = meta.last_traceback = None

    # -- recovery ----------------------------------------------------------------------
    def recover(self, txn: Txn, meta: Meta, restarts: int, now: float, fx: Effects) -> None:
        """After a restart: count the interrupted attempt as failed, resend the outbox.

        A stalled instance stays stalled: a restart sets no alarm.
        """
        meta.restarts += restarts
        if self._throttle is None:  # a limit the pool had before keeps no start waiting
            meta.throttled_until = None
        if meta.running and meta.current is not None:
            self.finish_attempt(meta)
            try:
                record = self._ns.get_event(txn, meta.current)
            except DamagedRecordError as damage:
                self._dead.set_aside(txn, meta, damage, now, fx)
            else:
                if record is None:  # its key was damaged: stored nowhere
                    self._dead.set_aside_lost(txn, meta, now, fx)
                else:
                    crash = DopoolError(f"instance crashed during attempt {meta.attempt}")
                    self.fail(txn, meta, meta.current, record, crash, now, fx)
        self._follow_ups.resend(txn, meta, fx)
        rearm(meta, now)

    # -- control ------------------------------------------------------------------------
    def control(self, txn: Txn, meta: Meta, request: Request, now: float, fx: Effects) -> Any:
        """Make a caller's ``request`` (one transition); its result answers the caller.

        Adding a request is its record in :mod:`dopool._machine.types`, its case
        here, and the pool method that sends it: the shell runs every request the
        same way (one transaction, publish, answer).
        """
        match request:
            case Pause() | Resume():  # answered with nothing
                self.set_paused(meta, isinstance(request, Pause), now, fx)
                return None
            case Drain():
                return self.drain(txn, meta, now, fx)
            case Redrive(sequences):
                return self._dead.redrive(txn, meta, sequences, now, fx)
            case Purge(sequences):
                return self._dead.purge(txn, meta, sequences)
            case Cancel(sequence):
                return self.cancel(txn, meta, sequence, now, fx)
            case DefineSchedule(spec):
                return self._recurring.define(txn, meta, spec, now)
            case Unschedule(name):
                return self._recurring.remove(txn, meta, name, now)
        raise AssertionError(f"not a request: {request!r}")  # pragma: no cover

    def set_paused(self, meta: Meta, paused: bool, now: float, fx: Effects) -> bool:
        """Pause or resume; whether that changed anything (and so must be saved).

        Resuming also wakes a stalled instance, paused or not (no event says
        so when the flag does not change).
        """
        woken = not paused and wake(meta)
        if meta.paused == paused:
            if woken:
                rearm(meta, now)
            return woken
        meta.paused = paused
        rearm(meta, now)
        fx.events.append(self.event("paused" if paused else "resumed", now))
        return True

    def drain(self, txn: Txn, meta: Meta, now: float, fx: Effects) -> int:
        """Remove every pending event but a running attempt's (:mod:`dopool._machine.drain`); how
        many. Each one's dedup key is released, and it is remembered (``keep_finished``),
        as if it had finished now. Counters but ``pending`` and ``drained``, paused and
        dead letters stay."""
        running = running_sequence(meta)
        self._life.drained(txn, meta, now, keep=running)
        self._dedup.release_pending(txn, self._ns, self._index, now, keep=running)
        count = drain(self._ns, txn, meta, now, self._id)
        fx.events.append(self.event("drained", now))
        return count

    def cancel(self, txn: Txn, meta: Meta, sequence: int, now: float, fx: Effects) -> bool:
        """Cancel event ``sequence`` unless it is running or finished; whether it was
        (:mod:`dopool._machine.lifecycle`). Its head of line is freed if it waited in backoff."""
        cancelled = self._life.cancel(txn, meta, sequence, now, self._remove_current, fx.events)
        self._fault_point("cancel", "crash_during_cancel")  # all written, nothing committed
        return cancelled

    # -- follow-ups between instances ------------------------------------------------------
    def deliver(
        self,
        txn: Txn,
        meta: Meta,
        source_pool: str,
        source: int,
        record: OutboxRecord,
        now: float,
        fx: Effects,
    ) -> int:
        """Accept follow-up ``record.link`` from instance ``source`` of ``source_pool`` if it
        is the next one (see :meth:`FollowUps.accept`); returns the link expected."""
        expected = self._follow_ups.accept(txn, meta, source_pool, source, record, now, fx)
        if record.link == expected:
            rearm(meta, now)
        return expected

    def delivered(self, txn: Txn, oseq: int) -> bool:
        """The target has follow-up ``oseq``: drop it from the outbox; whether it was there."""
        return self._follow_ups.acknowledged(txn, oseq)

    # -- records --------------------------------------------------------------------------
    def event(
        self,
        kind: EventKind,
        time: float,
        sequence: int | None = None,
        attempt: int | None = None,
        error: str | None = None,
        due: float | None = None,
        *,
        rows: StorageRows | None = None,
        rows_read: int | None = None,
    ) -> PoolEvent:
        """A :class:`PoolEvent` of this instance; ``rows`` (a success's) or ``rows_read``
        (a failed attempt's): what its handler did with the instance's storage."""
        read, written = (rows_read, None) if rows is None else rows
        return PoolEvent(
            kind, self._pool, self._index, sequence, attempt, time, error, due, read, written
        )
