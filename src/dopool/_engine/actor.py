"""The instance actor: one Durable Object's thread, handling one message at a time.

Its loop runs on a thread of its own, or as a greenlet on the thread that drives
a simulated clock: the clock's backend decides (see :mod:`dopool._clock.threads`).

Every message is handled as: one write transaction in which the queue machine
(:mod:`dopool._machine.machine`) makes its transition, commit, then (and only then) the
clock, subscribers, callbacks and the caller learn of it (see
:class:`dopool._engine.shell.InstanceShell`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import nullcontext, suppress
from functools import partial
from typing import Any, cast

import pykka

from dopool import tracing
from dopool._clock.threads import Future, Inbox
from dopool._engine import logs, middleware
from dopool._engine.cells import Cell, Cells
from dopool._engine.context import EventContext
from dopool._engine.mailbox import fail_reply
from dopool._engine.memory import UNTOLD
from dopool._engine.messages import (
    Alarm,
    Control,
    Deliver,
    Delivered,
    Enqueue,
    Evict,
    HandedOff,
    Kill,
    Recover,
    Redeliver,
    Resend,
)
from dopool._engine.shell import Crash, InstanceEnv, InstanceShell, PoolSpec, UndecodableEventError
from dopool._engine.storage import Storage
from dopool._engine.supervisor import KillFlag
from dopool._errors import (
    DamagedRecordError,
    DopoolError,
    InstanceCrashedError,
    InstanceStartError,
    PermanentError,
    StorageError,
    StoreClosedError,
    failed,
    failure_traceback,
)
from dopool._machine.types import Effects, Started
from dopool._store.layout import EventRecord, Meta, OutboxRecord, queue_key_sequence, unpack
from dopool._store.txn import Txn
from dopool._types import Outcome, OutcomeState
from dopool._usercode import ran

logger = logging.getLogger("dopool")

# The incarnations running in this process. They are not in pykka's ActorRegistry, a list
# that each stop scans: a run that evicts instances by the thousand would spend its time
# there (see :meth:`InstanceActor.launch`).
_RUNNING: set[pykka.ActorRef[Any]] = set()

# What a transaction takes from the head of its instance's inbox (``_take_and_continue``):
# enqueues, and alarms if it starts the due work whenever it may go on.
_TAKEN: tuple[type, ...] = (Enqueue,)
_TAKEN_WITH_ALARMS: tuple[type, ...] = (Enqueue, Alarm)


def running_instances() -> list[pykka.ActorRef[Any]]:
    """The instance actors running in this process, of every runtime (for tests)."""
    return list(_RUNNING)


def forget_instance(ref: pykka.ActorRef[Any]) -> None:
    """Stop listing ``ref`` as running: one that can never stop (for tests, as pykka's
    ``ActorRegistry.unregister``)."""
    _RUNNING.discard(ref)


class InstanceActor(InstanceShell, pykka.ThreadingActor):
    """One instance of a pool. Handles one message at a time, in its own thread."""

    # The interpreter joins non-daemon threads before atexit runs, so an open
    # runtime's actors would keep it alive forever; atexit closes the runtime instead.
    use_daemon_thread = True

    def __init__(self, spec: PoolSpec, cell: Cell, env: InstanceEnv, kill: KillFlag) -> None:
        InstanceShell.__init__(self, spec, cell, env)  # first: the inbox is its clock's
        pykka.ThreadingActor.__init__(self)
        self._kill = kill  # this incarnation's: a successor gets a fresh one
        self._inbox = cast(Inbox, self.actor_inbox)  # see _create_actor_inbox
        # ``ctx.sleep``: the clock's sleep, counted against this instance.
        self._sleep_in_handler = partial(self._clock.sleep, key=self._mailbox.key)
        # Sources asked to deliver again (a link went missing), until the link expected comes.
        self._asked: set[tuple[str, int]] = set()
        self._where = (spec.name, cell.index)  # its place in the runtime's slots
        self._worked = False  # this incarnation ran an attempt (see ``_yield_slot``)
        self._evicted = False
        self._resolve = partial(env.directory.resolve, own=spec.name)

    def _open_storage(self) -> Storage:
        """``ctx.storage`` for an attempt of this instance (made when a handler first
        uses it)."""
        return Storage(self._store.read, self._spec.name, self._index)

    @classmethod
    def launch(
        cls, spec: PoolSpec, cell: Cell, env: InstanceEnv, kill: KillFlag
    ) -> pykka.ActorRef[Any]:
        """Start an incarnation, as pykka's ``start`` does, but listed in this module's set
        of running instances (:func:`running_instances`), not pykka's ActorRegistry."""
        actor = cls(spec, cell, env, kill)
        ref = actor.actor_ref
        _RUNNING.add(ref)
        try:
            actor._start_actor_loop()
        except BaseException:
            _RUNNING.discard(ref)
            raise
        return ref

    # pykka's extension points for an actor's inbox, future and loop: the clock's
    # backend decides whether the loop runs on a thread or as a greenlet.
    def _create_actor_inbox(self) -> Inbox:  # type: ignore[override]  # pykka's is static
        return self._clock.backend.inbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return Future()  # a GreenInbox binds it to its scheduler

    def _start_actor_loop(self) -> None:
        runner = self._clock.backend.runner
        if runner is not None:
            runner.spawn(self._actor_loop, self._id)
            return
        try:
            super()._start_actor_loop()
        except RuntimeError as exc:  # "can't start new thread": the process's limit
            raise InstanceStartError(self._id, str(exc)) from exc

    def on_start(self) -> None:
        # The actor's own thread (or greenlet) always acts for its instance: this lets
        # the pool refuse calls from handlers and hooks that would wait on this actor.
        self._env.in_handler.instance = (self._spec.name, self._index)

    def on_receive(self, message: Any) -> None:
        memory = self._memory
        turn = memory.turn
        slots = self._env.slots
        counted = slots.limit is not None
        if counted:
            slots.idle.pop(self._where, None)
        turn.acquire()  # the instance acts on one thing at a time: a message or a caller
        try:
            self._fault_point("receive")  # a kill lands before any later message
            if memory.handed_off is not None:  # a caller started it: it runs first
                self._execute_attempts(memory.take_handed_off())
            handle = _HANDLERS.get(type(message))
            if handle is not None:
                handle(self, message)
            elif isinstance(message, Control):
                self._on_control(message)
            else:
                raise TypeError(f"an instance takes no {type(message).__name__} message")
            self._supervisor.handled(message)
            if type(message) is not Evict:  # (its own check is no activity)
                memory.last_active = self._clock.now()
        except Crash as crash:
            self._crash(crash.point, message)
        except Exception as exc:
            engine_failure = isinstance(exc, StorageError) or not isinstance(exc, DopoolError)
            if isinstance(exc, StoreClosedError):  # abandoned at exit, which was logged
                logger.info("instance %s: %r came after its store closed", self._id, message)
            elif isinstance(exc, DamagedRecordError):  # it names the record: no traceback
                logger.error("instance %s failed handling %r: %s", self._id, message, exc)
            elif engine_failure:
                logger.exception("instance %s failed handling %r", self._id, message)
            reply = getattr(message, "reply", None)
            if reply is not None:
                reply.fail(exc)  # unless it was answered before the failure
            self._fail_taken(exc if isinstance(exc, DopoolError) else None)
            if engine_failure:  # the in-memory state is suspect: restart from storage
                self._crash(f"{type(exc).__name__}: {exc}", message)
        except BaseException as exc:  # not to pykka, which would stop every actor
            # SystemExit & co. from user code the engine calls: an engine failure too.
            logger.exception("instance %s failed handling %r", self._id, message)
            self._crash(f"{type(exc).__name__}: {exc}", message)
        finally:
            turn.release()
            if counted and self._inbox.empty() and self._cell.mailbox.idle():
                # Idle in its slot: asked to give it up when instances begin to wait for
                # one (registered before the check, so that the first to wait sees it
                # here or it sees the line), and at once if some wait already.
                slots.idle[self._where] = self._cell.idle_timer
                if slots.crowded and type(message) is not Evict:
                    self._cell.idle_timer.fire_alarm()
            self._mailbox.finished()

    def on_stop(self) -> None:
        """Run an attempt a caller started just before the runtime closed: it was committed.
        An evicted incarnation gives its slot to the first instance in line instead."""
        _RUNNING.discard(self.actor_ref)
        if self._evicted:
            key = self._mailbox.key
            try:
                self._env.slots.give_back()
            finally:
                self._clock.activity.done(key)  # the stop ``_evict`` counted
            # Its cell is dropped, and nothing acts for it again (a caller's direct path
            # finds its mailbox retired): freed at once, not by the cyclic collector.
            cell = self._cell
            self.dismantle()
            if cell.direct is not None:
                cell.direct.dismantle()
                cell.direct = None
            cell.supervisor.dismantle()
            return
        if self._kill.raised:
            return  # a crash: the successor's recovery settles it
        with self._memory.turn:
            started = self._memory.take_handed_off()
            if started is None:
                return
            # A crash leaves the attempt started: the next open's recovery settles it.
            with suppress(Crash):
                self._execute_attempts(started)

    def _may_continue(self) -> bool:
        """Whether due work may start in this message: nothing else is waiting for us.

        A waiting message or caller (a stop, an enqueue) goes first; the alarm,
        set due now, then queues behind it. A closing runtime starts nothing more.
        """
        return (
            self._inbox.empty()
            and not self._memory.turn.contended()
            and not self._kill.raised
            and not self._mailbox.closed
            and not self._env.slots.crowded  # it yields its slot after this attempt
        )

    # -- crashes -------------------------------------------------------------
    def _on_kill(self, _message: Kill) -> None:
        """Nothing to do: ``on_receive``'s fault point already crashed a killed instance."""

    def _on_handed_off(self, _message: HandedOff) -> None:
        """Nothing more to do: ``on_receive`` ran the attempt the caller started."""

    def _crash(self, reason: str, message: Any) -> None:
        """Die: hand the address to a fresh incarnation, fail the caller, stop quietly.

        The successor is in place before the caller hears of the crash, so the
        caller's next call reaches it; ``crashed`` is emitted before the
        successor can emit ``recovered``. If the restart must wait out a backoff,
        ``restart_delayed`` says so before its timer is set.
        """
        supervisor = self._supervisor
        self._env.emit(self._machine.event("crashed", self._clock.now(), error=reason))
        self._memory.forget()
        delay = supervisor.crashed(self._inbox, message)
        if delay is not None:
            streak = supervisor.crash_streak
            why = f"{streak} crashes in a row, the last: {reason}; restart in {delay:g} s"
            self._env.emit(
                self._machine.event("restart_delayed", self._clock.now(), None, streak, why)
            )
            supervisor.arm_restart()
        fail_reply(message, InstanceCrashedError(self._id))
        self._fail_taken(None)
        logs.instance_crashed(self._id, reason, delay)
        self.stop()  # after the message in hand; the drained inbox holds nothing else

    # -- enqueue -----------------------------------------------------------
    def _on_enqueue(self, message: Enqueue) -> None:
        self._taken.append(message)
        effects = Effects()
        meta, started = self._transact(self._enqueue_body(effects, self._take_and_continue))
        self._publish(meta, effects)
        self._execute_attempts(started)

    def _take_and_continue(self, *, alarms: bool = False) -> bool:
        """In a transaction body: take the enqueues waiting now, then ``_may_continue()``.
        With ``alarms``, for a body that starts the due work if this says it may go on
        (an outcome's), the alarms among them too.

        A body waits its turn in the group commit; taking at the last moment lets
        callers that sent meanwhile share this commit instead of waiting for the
        next. The actor is blocked in the commit meanwhile, so its inbox and
        taken list are not touched by its own thread.
        """
        # Only a run of enqueues (and alarms) at the head of the inbox is taken, so no
        # message overtakes another kind sent before it (a pause, say). The actor is
        # the inbox's only reader, so what it sees at the head is still there to take.
        more = self._inbox.take_leading(_TAKEN_WITH_ALARMS if alarms else _TAKEN)
        if not more:
            return self._may_continue()
        enqueues = [message for message in more if type(message) is Enqueue]
        self._taken.extend(enqueues)
        go_on = self._may_continue()
        if len(enqueues) < len(more):
            # An alarm only says "read the store and start what is due", which this
            # transaction does if it may go on: a busy instance's outcome starts its next
            # event, however many producers' wake-ups came meanwhile, in one commit.
            memory = self._memory
            memory.woken = False  # as ``_on_alarm``: the next wake-up needs an alarm
            memory.told_alarm = None  # a clock's alarm was consumed
            if not go_on:  # something else came first: the alarm goes behind it
                self._mailbox.fire_alarm()
        # The message in hand keeps this actor counted busy.
        self._mailbox.finished(len(more))
        return go_on

    # -- processing ----------------------------------------------------------
    def _on_alarm(self, _message: Alarm) -> None:
        self._memory.woken = False  # a wake-up from now on needs an alarm of its own
        if self._mailbox.closed:
            # A closing runtime starts nothing more (docs/api.md, "runtime.close()"):
            # the slot stays stored, and the next open re-arms it.
            return
        now = self._clock.now()
        self._memory.told_alarm = None  # the clock consumed it
        effects = Effects()

        def body(txn: Txn) -> tuple[Meta, Started | None]:
            meta = self._load_meta(txn)
            started = self._machine.take_alarm(txn, meta, now, effects)
            self._save_meta(txn, meta)
            return meta, started

        meta, started = self._transact(body)
        self._publish(meta, effects)
        self._execute_attempts(started)

    def _execute_attempts(self, started: Started | None) -> None:
        """Execute attempts whose start committed, one after another.

        Each outcome's transaction also starts the next due event while nothing
        else waits for this instance, so a busy queue costs one commit per event
        and no trip through the clock.
        """
        checkpoint = self._clock.backend.checkpoint
        while started is not None:
            checkpoint()  # a simulated clock's driver past its deadline takes over here
            self._worked = True
            key, record, attempt, started_at = started
            sequence = queue_key_sequence(key)
            if self._env.listening():
                self._env.emit(self._machine.event("started", started_at, sequence, attempt))
            self._fault_point("before_execute", "crash_before_execute")
            started = self._execute(key, sequence, record, attempt, started_at)

    def _execute(
        self, key: bytes, sequence: int, record: EventRecord, attempt: int, started_at: float
    ) -> Started | None:
        """Run the handler once and commit its outcome; returns the next attempt started."""
        failure: BaseException | None = None
        try:
            event = unpack(record.event)
        except Exception as exc:  # stored by another version, or crafted: never run
            event = record.event
            failure = UndecodableEventError(f"the stored event does not decode ({exc!r})")
        ctx = EventContext(
            event=event,
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
            _sleep=self._sleep_in_handler,
            _target=self._resolve,
            _wall=self._clock.wall,
            _now=self._clock.now,
            _open_storage=self._open_storage,
            _async=self._spec.options.is_async,
        )
        span = tracing.attempt(
            self._spec.name, self._id, f"{self._id}:{sequence}", attempt, record.trace, started_at
        )
        chain = self._spec.middleware
        entered = 0  # the middleware whose ``before`` returned: they see the outcome
        if failure is None:
            with nullcontext() if span is None else span.running():
                if chain:
                    entered, failure = middleware.enter(chain, ctx)
                if failure is None:
                    failure = self._run_handler(ctx)
                if failure is not None and entered:
                    failure = middleware.failed(chain, entered, ctx, failure)
        follow_ups, writes, rows = ctx._end()  # a context kept for later adds nothing now
        self._fault_point("after_execute", "crash_after_execute")
        now = self._clock.now()
        effects = Effects()
        machine = self._machine

        retry_at: list[float | None] = [None]  # a failure's: when it is retried (None: dead)
        trace = None if failure is None else failure_traceback(failure)  # outside the lock

        def body(txn: Txn) -> tuple[Meta, Started | None]:
            # Callers that waited for the handler commit with its outcome.
            go_on = self._take_and_continue(alarms=True)
            meta = self._load_meta(txn)
            machine.finish_attempt(meta)
            if failure is None:
                machine.succeed(
                    txn,
                    meta,
                    key,
                    attempt,
                    follow_ups,
                    now,
                    effects,
                    record.dedup_key,
                    writes,
                    rows,
                )
            else:
                read = None if rows is None else rows.read
                machine.fail(txn, meta, key, record, failure, now, effects, read, trace)
                retry_at[0] = meta.retry_at if meta.current == key else None
            self._accept(txn, meta, now, effects)
            machine.rearm(meta, now)
            started = machine.take_alarm(txn, meta, now, effects) if go_on else None
            self._save_meta(txn, meta)
            return meta, started

        meta, started = self._transact(body)
        self._supervisor.progressed()
        self._publish(meta, effects)
        if failure is None:
            logs.attempt_succeeded(self._id, sequence, attempt)
        else:
            assert trace is not None
            logs.attempt_failed(self._id, sequence, attempt, failure, retry_at[0], trace)
        if span is not None or entered:
            state: OutcomeState = "succeeded" if failure is None else "retried"
            if failure is not None and retry_at[0] is None:
                state = "dead_lettered"
            if span is not None:
                span.end(failure, state, now)
            if entered:
                error = None if failure is None else failed(failure)
                outcome = Outcome(state, error, retry_at[0], now - started_at)
                middleware.finished(chain, entered, ctx, outcome)
        return started

    def _run_handler(self, ctx: EventContext) -> BaseException | None:
        """Call the handler (an async one: run its coroutine to its end in the clock's
        time, :mod:`dopool._clock.loops`); what it raised, its traceback from its own
        frame on."""
        options = self._spec.options
        try:
            if options.is_async:
                returned, error = self._clock.run_coroutine(
                    partial(options.execute, ctx), self._mailbox.key
                )
                if error is not None:  # its traceback starts in the handler already
                    return error
            else:
                returned = options.execute(ctx)
            if returned is not None:  # (the usual handler returns None: no call)
                ran(returned, "the handler", PermanentError)
        except BaseException as exc:  # SystemExit too: a handler never takes the actor down
            if exc.__traceback__ is not None:  # from the handler's frame on, not ours
                exc.__traceback__ = exc.__traceback__.tb_next
            return exc
        return None

    # -- recovery ------------------------------------------------------------
    def _on_recover(self, message: Recover) -> None:
        """Settle an attempt a crash interrupted, re-arm the alarm, resend the outbox."""
        now = self._clock.now()
        effects = Effects()
        if message.restarts:  # said first, published only if the recovery commits
            # (placed before the transition's events, not inserted after them: the
            # position of an ``empty`` among them is recorded as they are made)
            effects.events.append(self._machine.event("recovered", now))
        elif message.start and self._env.listening():  # started on demand
            effects.events.append(self._machine.event("activated", now))

        def body(txn: Txn) -> Meta:
            meta = self._load_meta(txn)
            # Its bytes, as stored if it is (a deep copy of the meta cost 30 times more).
            before = self._ns.sealed(meta) if self._raw is None else self._raw
            self._machine.recover(txn, meta, message.restarts, now, effects)
            # A recovery that changes nothing writes nothing: an instance never used (no
            # meta stored) costs no write, nor does starting an evicted one again.
            if self._ns.sealed(meta) != before:
                self._save_meta(txn, meta)
            return meta

        meta = self._transact(body)
        memory = self._memory
        if memory.meta is None and memory.raw is not None:
            # Nothing written: the meta read is the one stored, whose bytes memory.raw
            # holds, and the next transaction starts from it (``_load_meta``).
            memory.meta = meta
        memory.told_alarm = UNTOLD  # the clock must be told again
        self._supervisor.recovered(message.restarts)
        self._publish(meta, effects)
        self._arm_idle_timer(now)
        if message.reply is not None:
            message.reply.set(None)

    # -- eviction ------------------------------------------------------------------
    def _arm_idle_timer(self, now: float) -> None:
        """Have the clock fire this incarnation's idle timer ``idle_timeout`` from now. It
        is armed once, and re-armed only when it fires: activity in between moves the
        deadline (``memory.last_active``), not the timer. It keeps no simulated clock busy."""
        timeout = self._spec.options.idle_timeout
        # (Near the largest float there is no later time left: no timer, and no eviction.)
        if timeout is not None and now < now + timeout < math.inf:
            self._clock.set_alarm(self._cell.idle_timer, now + timeout, recurring=True)

    def _on_evict(self, _message: Evict) -> None:
        """The idle timer fired: stop the actor if the instance has had nothing to do for
        ``idle_timeout``, else wait again. Nothing is written: the store already holds all
        an instance is (docs/guarantees.md, "Instances started when first used"). While
        instances wait for a slot, it need not have been idle that long, and one with
        work may go too (:meth:`_yield_slot`)."""
        if self._mailbox.closed:
            return
        now = self._clock.now()
        if self._env.slots.crowded and self._yield_slot(now):
            return
        timeout = self._spec.options.idle_timeout
        if timeout is None:
            return
        deadline = self._memory.last_active + timeout
        if now < deadline:
            self._clock.set_alarm(self._cell.idle_timer, deadline, recurring=True)
            return
        idle, alarm = self._evictable(now + timeout)
        if not idle or not self._evict(alarm):
            self._arm_idle_timer(now)

    def _yield_slot(self, now: float) -> bool:
        """Give the instance's slot to the first instance waiting for one: evicted now if it
        has nothing to do before ``now``; if it has (an event due: its alarm), only once it
        has run an attempt since it started, and then it goes to the back of the line. Not
        while a message or a caller waits for it, nor mid-attempt, nor while it keeps a
        recurring schedule's fires. Whether it went."""
        memory = self._memory
        if not self._inbox.empty() or memory.turn.contended() or memory.handed_off is not None:
            return False
        try:
            with self._store.read() as txn:
                meta = self._ns.load_meta(txn)
        except DamagedRecordError:
            return False
        running = meta.current is not None and meta.retry_at is None
        due = meta.alarm is not None and meta.alarm <= now
        if running or meta.next_fire is not None or (due and not self._worked):
            return False
        return self._evict(meta.alarm, due=due)

    def _evict(self, alarm: float | None, *, due: bool = False) -> bool:
        """Stop this incarnation and drop its cell, unless a message waits for it: its slot
        goes to the first in line, and the next message starts the instance again, as does
        its ``alarm`` when it comes due (at once, from the back of the line, if ``due``)."""
        if not self._env.cells.evict(self._cell):
            return False
        self._evicted = True  # its slot goes back once it has stopped (``on_stop``)
        # No actor answers at the old address any more: the clock forgets it, and the
        # runtime's timer of evicted instances starts this one when its alarm comes due.
        self._clock.set_alarm(self._mailbox, None)
        self._memory.told_alarm = None
        if due:
            self._env.slots.wait(self._spec.name, self._index)
        elif alarm is not None:
            self._env.evicted.note(self._spec.name, self._index, alarm)
        if self._env.listening():
            self._env.emit(self._machine.event("evicted", self._clock.now()))
        # The stop is work in hand until ``on_stop`` has handed the slot on: under a
        # simulated clock's threads the driver would find the system quiet before the
        # next instance in line starts, and nothing scheduled, and end its drive.
        activity = self._clock.activity
        activity.sent(self._mailbox.key)
        try:
            self.stop()
        except BaseException:
            activity.done(self._mailbox.key)
            raise
        return True

    def _evictable(self, horizon: float) -> tuple[bool, float | None]:
        """Whether the instance has nothing to do before ``horizon`` (no message or caller
        waiting, no attempt a caller handed it, no follow-ups to deliver or whose
        acknowledgement it waits for, no schedule to fire, no alarm due by then), and its
        alarm slot (None: not set), which the store's alarm index holds too."""
        memory = self._memory
        if (
            not self._inbox.empty()
            or memory.turn.contended()
            or memory.handed_off is not None
            or self._asked
            or self._held
        ):
            return False, None
        try:
            with self._store.read() as txn:
                meta = self._ns.load_meta(txn)
        except DamagedRecordError:  # the next message that needs it says so: an idle
            return False, None  # timer is not worth a crash
        running = meta.current is not None and meta.retry_at is None  # (not in a backoff)
        busy = meta.outbox or running or meta.next_fire is not None
        due = meta.alarm is not None and meta.alarm <= horizon
        return not (busy or due), meta.alarm

    # -- control -----------------------------------------------------------------
    def _on_control(self, message: Control) -> None:
        """A caller's request: its transition in one transaction, publish, answer."""
        now = self._clock.now()
        effects = Effects()

        def body(txn: Txn) -> tuple[Meta, Any]:
            meta = self._load_meta(txn)
            result = self._machine.control(txn, meta, message.request, now, effects)
            self._save_meta(txn, meta)
            return meta, result

        meta, result = self._transact(body)
        self._publish(meta, effects)
        message.reply.set(result)

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
        effects = Effects()
        record = message.record

        source_pool, source_index = message.source_pool, message.source

        def body(txn: Txn) -> tuple[Meta, int]:
            meta = self._load_meta(txn)
            expected = self._machine.deliver(
                txn, meta, source_pool, source_index, record, now, effects
            )
            if record.link == expected:
                self._save_meta(txn, meta)
            return meta, expected

        try:
            meta, expected = self._transact(body)
        except DamagedRecordError as damage:
            if damage.key != self._ns.mark_key(source_pool, source_index):
                raise
            # Which of this source's links were taken is unknown: take none. Nothing is
            # stored or acknowledged, so its follow-ups stay durable in its outbox, and
            # this instance goes on with its own work (docs/guarantees.md, "Damaged
            # records"; ``dopool check`` reports the mark).
            logger.error(
                "instance %s: the delivery mark of instance %s:%d is damaged (%s): its "
                "follow-ups stay in that instance's outbox",
                self._id,
                source_pool,
                source_index,
                damage.reason,
            )
            return
        source = self.cells_of(source_pool, source_index)
        if record.link > expected:
            logger.warning(
                "instance %s: follow-up link %d from instance %s:%d arrived before link %d; "
                "asking for them again",
                self._id,
                record.link,
                source_pool,
                source_index,
                expected,
            )
            self._ask_again(source_pool, source_index, source)
            return
        if record.link == expected:
            self._asked.discard((source_pool, source_index))
        self._publish(meta, effects)
        if source is None:  # not in this runtime: its recovery resends, and is acknowledged
            return
        self.send_later(source, source_index, Delivered(message.oseq))

    def _on_delivered(self, message: Delivered) -> None:
        def body(txn: Txn) -> None:
            if self._machine.delivered(txn, message.oseq):
                meta = self._load_meta(txn)
                meta.outbox -= 1
                self._save_meta(txn, meta)

        self._transact(body)

    def _ask_again(self, pool: str, index: int, source: Cells | None) -> None:
        """Ask the source to deliver its follow-ups for this instance again, once until the
        link expected comes (each later early link would ask again). A source not served
        here needs no asking: it delivers through the store, earlier links first."""
        if source is None or (pool, index) in self._asked:
            return
        if not source.serves(index):
            return
        self._asked.add((pool, index))
        self.send_later(source, index, Redeliver(self._spec.name, self._index))

    def _on_redeliver(self, message: Redeliver) -> None:
        """A target missed a link: deliver the outbox's follow-ups for it again, in link
        order (it acknowledges those it has as duplicates). Nothing to commit."""
        with self._store.read() as txn:
            entries = [
                (oseq, entry)
                for oseq, entry in self._ns.iter_outbox(txn)
                if isinstance(entry, OutboxRecord)
                and (entry.pool, entry.target) == (message.pool, message.target)
            ]
        for oseq, entry in sorted(entries, key=lambda item: item[1].link):
            self._deliver(oseq, entry)

    def _on_resend(self, message: Resend) -> None:
        """A pool was defined: send the follow-ups held for it (nothing to commit)."""
        self.resend_held(message.pool)


# What handles each message, by its type: one table for the class, where a table of bound
# methods made at each start cost a dict and ten methods, in a reference cycle with the actor.
_HANDLERS: dict[type, Callable[[InstanceActor, Any], None]] = {
    Enqueue: InstanceActor._on_enqueue,
    Alarm: InstanceActor._on_alarm,
    Recover: InstanceActor._on_recover,
    Deliver: InstanceActor._on_deliver,
    Delivered: InstanceActor._on_delivered,
    Kill: InstanceActor._on_kill,
    Evict: InstanceActor._on_evict,
    HandedOff: InstanceActor._on_handed_off,
    Resend: InstanceActor._on_resend,
    Redeliver: InstanceActor._on_redeliver,
}
