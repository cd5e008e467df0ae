"""The instance actor: one Durable Object, its queue state machine and its alarm.

Every message is handled as: one write transaction, commit, then (and only
then) the clock, subscribers, callbacks and the caller learn of it. Nothing in
memory is needed for correctness; each message starts from the stored meta.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import Any

import pykka

from dopool._clock import Clock
from dopool._context import EventContext
from dopool._errors import (
    DopoolError,
    InstanceCrashedError,
    PermanentError,
    QueueFullError,
    RetryAfter,
    StorageError,
)
from dopool._mailbox import Mailbox, fail_reply
from dopool._messages import (
    Alarm,
    Deliver,
    Delivered,
    Drain,
    Enqueue,
    Item,
    Kill,
    Pause,
    Purge,
    Recover,
    Redrive,
    Resume,
)
from dopool._retry import RetryPolicy, uniform_draw
from dopool._router import Router
from dopool._storage import (
    DeadRecord,
    EventRecord,
    Meta,
    Namespace,
    OutboxRecord,
    Store,
    Txn,
    queue_key_priority,
    queue_key_sequence,
    unpack,
)
from dopool._types import DeadLetter, EmptyInfo, EnqueueResult, EventKind, PoolEvent
from dopool.chaos import FaultInjector

logger = logging.getLogger("dopool")

ALARM_RETRY_FIRST = 2.0  # seconds before a failed alarm delivery is retried; doubles
ALARM_RETRY_MAX = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    """A pool's definition, as the instances need it."""

    name: str
    concurrency: int
    execute: Callable[[EventContext], Any]
    retry: RetryPolicy | None
    on_dead_letter: Callable[[DeadLetter], Any] | None
    on_empty: Callable[[EmptyInfo], Any] | None
    max_queue_depth: int | None
    prepare: Callable[[Any, str | None, int], Item]

    @property
    def max_attempts(self) -> int:
        return 1 if self.retry is None else self.retry.max_attempts


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceEnv:
    """What an instance shares with the rest of its runtime."""

    store: Store
    clock: Clock
    seed: int | str | None
    emit: Callable[[PoolEvent], None]
    router: Router
    mailboxes: list[Mailbox]
    in_handler: threading.local  # .instance: (pool, index) whose thread this is, mid-message
    restart: Callable[[int, threading.Event], pykka.ActorRef[Any]]  # the supervisor
    faults: list[FaultInjector]  # one per instance, outliving its incarnations


class _Crash(Exception):
    """Unwinds an instance from a fault point; it never leaves the actor."""

    def __init__(self, point: str) -> None:
        self.point = point
        super().__init__(f"crashed at fault point {point!r}")


class _Effects:
    """What a committed transaction must tell the world, in order."""

    __slots__ = ("dead", "deliveries", "empty", "events")

    def __init__(self) -> None:
        self.events: list[PoolEvent] = []
        self.dead: list[DeadLetter] = []
        self.deliveries: list[tuple[int, OutboxRecord]] = []
        self.empty = False


class InstanceActor(pykka.ThreadingActor):
    """One instance of a pool. Handles one message at a time, in its own thread."""

    def __init__(self, spec: PoolSpec, index: int, env: InstanceEnv, kill: threading.Event) -> None:
        super().__init__()
        self._kill = kill
        self._faults = env.faults[index]
        self._spec = spec
        self._index = index
        self._id = f"{spec.name}:{index}"
        self._env = env
        self._store = env.store
        self._clock = env.clock
        self._ns = Namespace(spec.name, index)
        self._mailbox = env.mailboxes[index]
        self._armed: float | None = None  # what the clock was last told, to skip repeats
        self._handlers: dict[type, Callable[[Any], None]] = {
            Enqueue: self._on_enqueue,
            Alarm: self._on_alarm,
            Recover: self._on_recover,
            Pause: self._on_pause,
            Resume: self._on_resume,
            Drain: self._on_drain,
            Redrive: self._on_redrive,
            Purge: self._on_purge,
            Deliver: self._on_deliver,
            Delivered: self._on_delivered,
            Kill: self._on_kill,
        }

    def on_receive(self, message: Any) -> None:
        # Lets the pool refuse calls from handlers and hooks that would wait on this actor.
        self._env.in_handler.instance = (self._spec.name, self._index)
        try:
            self._fault_point("receive")  # a kill lands before any later message
            self._handlers[type(message)](message)
        except _Crash as crash:
            self._crash(crash.point, message)
        except Exception as exc:
            engine_failure = isinstance(exc, StorageError) or not isinstance(exc, DopoolError)
            if engine_failure:
                logger.exception("instance %s failed handling %r", self._id, message)
            reply = getattr(message, "reply", None)
            if reply is not None:
                with suppress(queue.Full):  # unless it was answered before the failure
                    reply.set_exception()
            if engine_failure:  # the in-memory state is suspect: restart from storage
                self._crash(f"{type(exc).__name__}: {exc}", message)
        finally:
            self._env.in_handler.instance = None
            self._mailbox.finished()

    # -- crashes -------------------------------------------------------------
    def _fault_point(self, point: str, fault: str | None = None) -> None:
        """Crash here if this incarnation was killed, or if the fault plan says so.

        Whatever was not committed yet is lost with the actor.
        """
        if self._kill.is_set():
            raise _Crash(point)
        if fault is not None and self._faults.fires(fault):
            raise _Crash(fault)

    @contextmanager
    def _write(self) -> Iterator[Txn]:
        """A write transaction that may fail (``storage_error``) just before it commits."""
        with self._store.write() as txn:
            yield txn
            self._fault_point("storage_write", "storage_error")

    def _on_kill(self, _message: Kill) -> None:
        """Nothing to do: ``on_receive``'s fault point already crashed a killed instance."""

    def _crash(self, reason: str, message: Any) -> None:
        """Die: hand the address to a fresh incarnation, fail the caller, stop quietly.

        The successor is in place before the caller hears of the crash, so the
        caller's next call reaches it; ``crashed`` is emitted before the
        successor can emit ``recovered``.
        """
        self._env.emit(self._event("crashed", self._clock.now(), error=reason))
        start = partial(self._env.restart, self._index)
        self._mailbox.replace(start, self.actor_inbox, message)  # type: ignore[arg-type]
        fail_reply(message, InstanceCrashedError(self._id))
        self.stop()  # after the message in hand; the drained inbox holds nothing else

    # -- enqueue -----------------------------------------------------------
    def _on_enqueue(self, message: Enqueue) -> None:
        now = self._clock.now()
        effects = _Effects()
        with self._write() as txn:
            meta = self._ns.load_meta(txn)
            limit = self._spec.max_queue_depth
            if limit is not None and meta.pending + len(message.items) > limit:
                raise QueueFullError(
                    pool=self._spec.name,
                    instance_index=self._index,
                    depth=meta.pending,
                    max_depth=limit,
                    incoming=len(message.items),
                )
            results = self._append(txn, meta, message.items, now, effects)
            self._rearm(meta, now)
            self._ns.save_meta(txn, meta)
            self._fault_point("enqueue", "crash_during_enqueue")
        self._publish(meta, effects)
        message.reply.set(results)

    def _append(
        self, txn: Txn, meta: Meta, items: tuple[Item, ...], now: float, effects: _Effects
    ) -> list[EnqueueResult]:
        results = []
        for item in items:
            sequence = meta.tail
            meta.tail += 1
            position = self._position(meta, item.priority)
            key = self._ns.queue_key(item.priority, sequence)
            record = EventRecord(item.event, now, item.partition_key, item.priority)
            self._ns.put_event(txn, key, record)
            meta.pending += 1
            meta.enqueued += 1
            meta.priorities[item.priority] = meta.priorities.get(item.priority, 0) + 1
            results.append(EnqueueResult(sequence, self._index, self._id, position))
            effects.events.append(self._event("enqueued", now, sequence))
        return results

    @staticmethod
    def _position(meta: Meta, priority: int) -> int:
        """How many pending events will run before a new one of ``priority``."""
        ahead = sum(count for level, count in meta.priorities.items() if level >= priority)
        if meta.current is not None and queue_key_priority(meta.current) < priority:
            ahead += 1  # the started event keeps its place whatever its priority
        return ahead

    # -- processing ----------------------------------------------------------
    def _on_alarm(self, _message: Alarm) -> None:
        now = self._clock.now()
        self._armed = None  # the clock consumed it
        with self._write() as txn:
            meta = self._ns.load_meta(txn)
            if meta.alarm is None or meta.alarm > now or meta.running:
                started = None  # a stale or early delivery: harmless
            elif self._faults.fires("alarm_error"):
                # The delivery failed before doing anything: retry it later, never drop it.
                meta.alarm_failures += 1
                backoff = min(ALARM_RETRY_FIRST * 2 ** (meta.alarm_failures - 1), ALARM_RETRY_MAX)
                meta.alarm = now + backoff
                self._ns.save_meta(txn, meta)
                started = None
            else:
                meta.alarm_failures = 0
                started = self._start_attempt(txn, meta, now)
                self._ns.save_meta(txn, meta)
        if started is None:
            self._sync_alarm(meta)
            return
        key, record = started
        self._env.emit(self._event("started", now, queue_key_sequence(key), meta.attempt))
        self._fault_point("before_execute", "crash_before_execute")
        self._execute(key, record, meta.attempt, now)

    def _start_attempt(self, txn: Txn, meta: Meta, now: float) -> tuple[bytes, EventRecord] | None:
        """Consume the alarm and, if there is work, record the next attempt's start."""
        meta.alarm = None
        if meta.paused or meta.pending == 0:
            return None
        if meta.current is not None and meta.retry_at is not None and meta.retry_at > now:
            meta.alarm = meta.retry_at  # never run a retry early
            return None
        key = meta.current if meta.current is not None else self._ns.first_event_key(txn)
        record = None if key is None else self._ns.get_event(txn, key)
        if key is None or record is None:
            raise StorageError(f"instance {self._id}: {meta.pending} pending but no event key")
        meta.current = key
        meta.attempt += 1
        meta.running = True
        meta.retry_at = None
        meta.started_at = now
        return key, record

    def _execute(self, key: bytes, record: EventRecord, attempt: int, started_at: float) -> None:
        sequence = queue_key_sequence(key)
        ctx = EventContext(
            event=unpack(record.event),
            sequence=sequence,
            attempt=attempt,
            enqueued_at=record.enqueued_at,
            started_at=started_at,
            instance_index=self._index,
            instance_id=self._id,
            pool_name=self._spec.name,
            partition_key=record.partition_key,
            priority=record.priority,
            _prepare=self._spec.prepare,
            _sleep=self._sleep,
        )
        failure: BaseException | None = None
        try:
            self._spec.execute(ctx)
        except BaseException as exc:  # SystemExit too: a handler never takes the actor down
            failure = exc
        self._fault_point("after_execute", "crash_after_execute")
        now = self._clock.now()
        effects = _Effects()
        with self._write() as txn:
            meta = self._ns.load_meta(txn)
            meta.running = False
            meta.started_at = None
            if failure is None:
                self._succeed(txn, meta, key, now, ctx, effects)
            else:
                self._fail(txn, meta, key, record, failure, now, effects)
            self._rearm(meta, now)
            self._ns.save_meta(txn, meta)
        self._publish(meta, effects)

    def _sleep(self, seconds: float) -> None:
        self._clock.sleep(seconds, self._mailbox.key)

    def _succeed(
        self, txn: Txn, meta: Meta, key: bytes, now: float, ctx: EventContext, effects: _Effects
    ) -> None:
        sequence = queue_key_sequence(key)
        self._remove_current(txn, meta, key)
        meta.succeeded += 1
        effects.events.append(self._event("succeeded", now, sequence, ctx.attempt))
        for item in ctx._follow_ups:
            target = self._env.router.choose(item.partition_key)
            if target == self._index:
                self._append(txn, meta, (item,), now, effects)
                continue
            # Another instance's queue is its own: park the follow-up in our outbox,
            # committed with this outcome, and deliver it after the commit.
            oseq = meta.outbox_next
            meta.outbox_next += 1
            meta.outbox += 1
            link = meta.links.get(target, 0)
            meta.links[target] = link + 1
            record = OutboxRecord(target, link, item.event, now, item.partition_key, item.priority)
            self._ns.put_outbox(txn, oseq, record)
            effects.deliveries.append((oseq, record))
        effects.empty = meta.pending == 0

    def _fail(
        self,
        txn: Txn,
        meta: Meta,
        key: bytes,
        record: EventRecord,
        failure: BaseException,
        now: float,
        effects: _Effects,
    ) -> None:
        """Settle a failed attempt of the current event: schedule a retry or dead-letter it."""
        sequence = queue_key_sequence(key)
        error = f"{type(failure).__name__}: {failure}"
        attempt = meta.attempt
        if not isinstance(failure, PermanentError) and attempt < self._spec.max_attempts:
            if isinstance(failure, RetryAfter):
                delay = failure.seconds
            else:
                assert self._spec.retry is not None  # max_attempts > 1 implies a policy
                draw = uniform_draw(self._env.seed, self._spec.name, self._index, sequence, attempt)
                delay = self._spec.retry.delay(attempt, draw)
            meta.retry_at = now + delay
            effects.events.append(self._event("retry_scheduled", now, sequence, attempt, error))
            return
        dead = DeadRecord(
            record.event,
            error,
            attempt,
            record.enqueued_at,
            now,
            record.partition_key,
            record.priority,
        )
        self._ns.put_dead_letter(txn, sequence, dead)
        meta.dead_letters += 1
        meta.dead_lettered += 1
        self._remove_current(txn, meta, key)
        effects.events.append(self._event("dead_lettered", now, sequence, attempt, error))
        effects.dead.append(self._dead_letter(sequence, dead))
        effects.empty = meta.pending == 0

    def _remove_current(self, txn: Txn, meta: Meta, key: bytes) -> None:
        self._ns.delete_event(txn, key)
        priority = queue_key_priority(key)
        remaining = meta.priorities[priority] - 1
        if remaining:
            meta.priorities[priority] = remaining
        else:
            del meta.priorities[priority]
        meta.pending -= 1
        meta.current = None
        meta.attempt = 0
        meta.retry_at = None

    # -- recovery ------------------------------------------------------------
    def _on_recover(self, message: Recover) -> None:
        """Settle an attempt a crash interrupted, re-arm the alarm, resend the outbox."""
        now = self._clock.now()
        effects = _Effects()
        with self._write() as txn:
            meta = self._ns.load_meta(txn)
            meta.restarts += message.restarts
            if meta.running and meta.current is not None:
                record = self._ns.get_event(txn, meta.current)
                meta.running = False
                meta.started_at = None
                if record is not None:
                    crash = DopoolError(f"instance crashed during attempt {meta.attempt}")
                    self._fail(txn, meta, meta.current, record, crash, now, effects)
            self._rearm(meta, now)
            self._ns.save_meta(txn, meta)
            effects.deliveries.extend(self._ns.iter_outbox(txn))
        self._armed = object()  # type: ignore[assignment]  # force the clock to be told
        if message.restarts:
            self._mailbox.restarts_recorded(message.restarts)
            effects.events.insert(0, self._event("recovered", now))
        self._publish(meta, effects)
        if message.reply is not None:
            message.reply.set(None)

    # -- control ---------------------------------------------------------------
    def _on_pause(self, message: Pause) -> None:
        self._set_paused(True, message)

    def _on_resume(self, message: Resume) -> None:
        self._set_paused(False, message)

    def _set_paused(self, paused: bool, message: Pause | Resume) -> None:
        now = self._clock.now()
        effects = _Effects()
        with self._write() as txn:
            meta = self._ns.load_meta(txn)
            if meta.paused != paused:
                meta.paused = paused
                self._rearm(meta, now)
                self._ns.save_meta(txn, meta)
                effects.events.append(self._event("paused" if paused else "resumed", now))
        self._publish(meta, effects)
        message.reply.set(None)

    def _on_drain(self, message: Drain) -> None:
        now = self._clock.now()
        effects = _Effects()
        with self._write() as txn:
            meta = self._ns.load_meta(txn)
            removed = self._ns.delete_events(txn)
            meta.drained += meta.pending
            count = meta.pending
            meta.pending = 0
            meta.priorities = {}
            meta.current = None
            meta.attempt = 0
            meta.retry_at = None
            self._rearm(meta, now)
            self._ns.save_meta(txn, meta)
            if removed != count:
                raise StorageError(f"instance {self._id}: {count} pending but {removed} keys")
            effects.events.append(self._event("drained", now))
        self._publish(meta, effects)
        message.reply.set(count)

    def _on_redrive(self, message: Redrive) -> None:
        now = self._clock.now()
        effects = _Effects()
        with self._write() as txn:
            meta = self._ns.load_meta(txn)
            wanted = message.sequences
            chosen = [
                sequence
                for sequence, _ in self._ns.iter_dead_letters(txn)
                if wanted is None or sequence in wanted
            ]
            items = []
            for sequence in chosen:
                dead = self._ns.pop_dead_letter(txn, sequence)
                assert dead is not None
                items.append(Item(dead.event, dead.partition_key, dead.priority))
            meta.dead_letters -= len(items)
            self._append(txn, meta, tuple(items), now, effects)
            self._rearm(meta, now)
            self._ns.save_meta(txn, meta)
        self._publish(meta, effects)
        message.reply.set(len(items))

    def _on_purge(self, message: Purge) -> None:
        with self._write() as txn:
            meta = self._ns.load_meta(txn)
            count = self._ns.delete_dead_letters(txn)
            meta.dead_letters = 0
            self._ns.save_meta(txn, meta)
        message.reply.set(count)

    # -- follow-up delivery ------------------------------------------------------
    def _on_deliver(self, message: Deliver) -> None:
        """Accept a follow-up from another instance's outbox, once, then acknowledge it.

        Links from one source arrive in order (mailboxes are FIFO, and a message
        a crash interrupts is retried first), so the next link is accepted, an
        older one is a resent duplicate, and a newer one means an earlier one
        went missing: it is neither stored nor acknowledged, and stays in the
        source's outbox to be resent, rather than being taken for a duplicate.
        """
        now = self._clock.now()
        effects = _Effects()
        record = message.record
        with self._write() as txn:
            meta = self._ns.load_meta(txn)
            expected = self._ns.last_delivered(txn, message.source) + 1
            if record.link > expected:
                logger.error(
                    "instance %s: follow-up link %d from instance %d arrived before link %d",
                    self._id,
                    record.link,
                    message.source,
                    expected,
                )
                return
            if record.link == expected:
                item = Item(record.event, record.partition_key, record.priority)
                self._append(txn, meta, (item,), now, effects)
                self._ns.set_delivered(txn, message.source, record.link)
                self._rearm(meta, now)
                self._ns.save_meta(txn, meta)
        self._publish(meta, effects)
        source = self._env.mailboxes[message.source]
        ack = Delivered(message.oseq)
        self._clock.deliver(source.order, partial(source.send, ack))

    def _on_delivered(self, message: Delivered) -> None:
        with self._write() as txn:
            if self._ns.delete_outbox(txn, message.oseq):
                meta = self._ns.load_meta(txn)
                meta.outbox -= 1
                self._ns.save_meta(txn, meta)

    # -- after a commit ----------------------------------------------------------
    def _rearm(self, meta: Meta, now: float) -> None:
        """Point the alarm slot where the committed state needs it."""
        if meta.paused or meta.pending == 0:
            meta.alarm = None
            meta.alarm_failures = 0
            return
        if meta.current is not None and meta.retry_at is not None:
            due = meta.retry_at  # a retry's backoff is never shortened
        elif meta.alarm is not None and meta.alarm <= now:
            due = meta.alarm  # already due: keep it
        else:
            due = now
        if meta.alarm_failures and meta.alarm is not None:
            due = max(due, meta.alarm)  # nor is a failing alarm's backoff
        meta.alarm = due

    def _sync_alarm(self, meta: Meta) -> None:
        if meta.alarm != self._armed:
            self._armed = meta.alarm
            self._clock.set_alarm(self._mailbox, meta.alarm)

    def _publish(self, meta: Meta, effects: _Effects) -> None:
        """Tell the clock, subscribers, callbacks and other instances what just committed."""
        self._sync_alarm(meta)
        emit = self._env.emit
        for event in effects.events:
            emit(event)
        for oseq, record in effects.deliveries:
            target = self._env.mailboxes[record.target]
            deliver = Deliver(self._index, oseq, record)
            self._clock.deliver(target.order, partial(target.send, deliver))
        if self._spec.on_dead_letter is not None:
            for dead in effects.dead:
                _call_hook("on_dead_letter", self._spec.on_dead_letter, dead)
        if effects.empty:
            now = self._clock.now()
            emit(self._event("empty", now))
            if self._spec.on_empty is not None:
                info = EmptyInfo(
                    self._spec.name, self._index, self._id, meta.succeeded + meta.dead_lettered
                )
                _call_hook("on_empty", self._spec.on_empty, info)

    def _event(
        self,
        kind: EventKind,
        time: float,
        sequence: int | None = None,
        attempt: int | None = None,
        error: str | None = None,
    ) -> PoolEvent:
        return PoolEvent(kind, self._spec.name, self._index, sequence, attempt, time, error)

    def _dead_letter(self, sequence: int, dead: DeadRecord) -> DeadLetter:
        return dead_letter_from_record(self._index, sequence, dead)


def dead_letter_from_record(index: int, sequence: int, dead: DeadRecord) -> DeadLetter:
    return DeadLetter(
        sequence=sequence,
        instance_index=index,
        event=unpack(dead.event),
        error=dead.error,
        attempts=dead.attempts,
        enqueued_at=dead.enqueued_at,
        failed_at=dead.failed_at,
        partition_key=dead.partition_key,
        priority=dead.priority,
    )


def _call_hook(name: str, hook: Callable[[Any], Any], argument: Any) -> None:
    try:
        hook(argument)
    except Exception:
        logger.exception("%s hook raised; ignored", name)
