"""The shell around one instance's queue machine, shared by its actor and direct enqueues.

Every message is handled as: one write transaction in which the queue machine
(:mod:`dopool._machine.machine`) makes its transition, commit, then (and only then) the
clock, subscribers, callbacks and the caller learn of it. Nothing in memory is
needed for correctness; each message starts from the stored meta (or from the
copy of it that the instance's last commit saved, which is the same).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from dopool._clock.clocks import Clock
from dopool._clock.threads import Local
from dopool._cluster.leases import lease_owner
from dopool._cluster.remote import producer_machine
from dopool._cluster.routing import Router
from dopool._engine.cells import Cell, Cells
from dopool._engine.directory import Directory
from dopool._engine.evicted import EvictedAlarms
from dopool._engine.mailbox import fail_reply
from dopool._engine.messages import Deliver, Enqueue
from dopool._engine.middleware import Middleware
from dopool._engine.options import PoolOptions
from dopool._engine.slots import Slots
from dopool._errors import (
    DamagedRecordError,
    DopoolError,
    InstanceCrashedError,
    PermanentError,
)
from dopool._machine.machine import QueueMachine
from dopool._machine.types import Effects, Item, Started
from dopool._store.environment import Store
from dopool._store.layout import Meta, OutboxRecord, forget_calls, record_call, stored_call
from dopool._store.txn import Txn
from dopool._types import EmptyInfo, PoolEvent
from dopool._usercode import ran

logger = logging.getLogger("dopool")

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    """A defined pool, as its instances need it: name, options, and the follow-up check."""

    name: str
    options: PoolOptions
    prepare: Callable[[Any, str | None, int], Item]
    # What wraps each attempt: the runtime's middleware, then the pool's.
    middleware: tuple[Middleware, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceEnv:
    """What an instance shares with the rest of its runtime."""

    store: Store
    clock: Clock
    seed: int | str | None
    emit: Callable[[PoolEvent], None]
    listening: Callable[[], bool]  # whether anyone takes events: if not, none are made
    router: Router
    directory: Directory  # the runtime's defined pools, where follow-ups into them go
    in_handler: Local  # .instance: (pool, index) whose thread this is, mid-message
    cells: Cells  # the pool's instances, each made when first used
    evicted: EvictedAlarms  # the runtime's timer for evicted instances' alarms
    slots: Slots  # the runtime's slots for instance actors, and the line waiting for one
    # A shared runtime's fencing check (``LeaseBook.holds``): whether the store's lease
    # of (pool, index) is still this worker's; None where no other worker can write.
    holds: Callable[[Txn, str, int], bool] | None = None
    # A shared runtime's wake-up of the worker serving an instance: (pool, index, owner).
    wake: Callable[[str, int, str | None], None] | None = None


class UndecodableEventError(PermanentError):
    """A stored event does not decode: it is dead-lettered without running the handler."""


class _LeaseLost(Exception):
    """The instance's lease names another worker now: its transaction must not commit."""


class Crash(Exception):
    """Unwinds an instance from a fault point; it never leaves the actor."""

    def __init__(self, point: str) -> None:
        self.point = point
        super().__init__(f"crashed at fault point {point!r}")


class InstanceShell:
    """The queue state machine of one instance, run by whichever thread holds its turn.

    Its actor runs it for every message; a caller enqueuing from its own thread
    (:class:`DirectEnqueue`) runs it too, holding the instance's turn, so the
    instance still acts on one thing at a time.
    """

    def __init__(self, spec: PoolSpec, cell: Cell, env: InstanceEnv) -> None:
        index = cell.index
        self._cell = cell
        self._faults = cell.faults
        self._spec = spec
        self._index = index
        self._id = f"{spec.name}:{index}"
        self._env = env
        self._store = env.store
        self._clock = env.clock
        self._machine = QueueMachine(
            pool=spec.name,
            index=index,
            rules=spec.options.rules,
            seed=env.seed,
            route=env.router.choose,
            faults=self._faults,
            fault_point=self._fault_point,
            listening=env.listening,
        )
        self._ns = self._machine.namespace
        self._mailbox = cell.mailbox
        self._supervisor = cell.supervisor
        # The kill flag of the incarnation this acts for: raised, it must crash at
        # its next fault point. The actor's is its own; a caller acting for the
        # instance (``DirectEnqueue``) takes the current one's each time.
        self._kill = self._supervisor.kill_flag
        self._memory = cell.memory
        # Enqueues to commit in the next transaction; answered after it commits,
        # or failed if the instance dies first.
        self._taken: list[Enqueue] = []
        self._saved: Meta | None = None  # the meta the running transaction saved
        self._raw: bytes | None = None  # its stored bytes as the running transaction left them
        # Follow-ups for pools not defined in this runtime: they wait in the outbox, and
        # are sent (before any later one to that pool) once the pool is defined.
        self._held: dict[str, list[tuple[int, OutboxRecord]]] = {}

    def dismantle(self) -> None:
        """Break the cycle of this shell and its queue machine, once nothing acts for the
        instance through it again (see :meth:`QueueMachine.dismantle`)."""
        self._machine.dismantle()

    def _fault_point(self, point: str, fault: str | None = None) -> None:
        """Crash here if this incarnation was killed, or if the fault plan says so.

        Whatever was not committed yet is lost with the actor.
        """
        if self._kill.raised:
            raise Crash(self._supervisor.kill_reason or point)
        if fault is not None and self._faults.active and self._faults.fires(fault):
            raise Crash(fault)

    def _transact(self, body: Callable[[Txn], T]) -> T:
        """Run ``body`` in a write transaction that may fail (``storage_error``) before commit.

        The store may commit it together with other instances' transactions
        (group commit); it returns only once the commit is durable. Then the
        meta it saved is the committed one, and the next transaction starts
        from it instead of decoding it again (if the store still holds its bytes).
        """
        try:
            result = self._store.transact(self._guarded(body))
        except BaseException as exc:
            self._rolled_back(exc)
            raise
        self._committed()
        return result

    def _guarded(self, body: Callable[[Txn], T]) -> Callable[[Txn], T]:
        """``body`` as a transaction of this instance runs it: fenced by its lease, and
        failing at the storage fault point once it has written."""
        holds, pool, index = self._env.holds, self._spec.name, self._index

        def guarded(txn: Txn) -> T:
            # Fencing: checked in the transaction, so no other worker can have taken
            # the lease between the check and the commit (LMDB serialises writers).
            if holds is not None and not holds(txn, pool, index):
                raise _LeaseLost
            result = body(txn)
            if self._saved is not None:  # a storage error fails a write: this one wrote
                self._fault_point("storage_write", "storage_error")
            return result

        return guarded

    def _rolled_back(self, exc: BaseException) -> None:
        """A guarded body's transaction was rolled back with ``exc``: the store still holds
        the meta before it (``memory.raw``). Raises :class:`Crash` if the lease was lost."""
        self._saved = self._raw = None
        if isinstance(exc, _LeaseLost):
            logger.warning(
                "instance %s: its lease was taken over by another worker; nothing of "
                "this transaction committed, and the instance stops here",
                self._id,
            )
            self._supervisor.close(vacant=True)  # no successor: the lease's holder serves it
            raise Crash("lease lost") from None

    def _committed(self) -> None:
        """A guarded body's transaction committed: the meta it saved is the stored one."""
        saved, self._saved = self._saved, None
        raw, self._raw = self._raw, None
        if raw is not None:
            self._memory.raw = raw
        if saved is not None:
            self._memory.meta = saved

    def _load_meta(self, txn: Txn) -> Meta:
        """The committed meta, which this transaction now owns and may change.

        It is the one the instance's last commit saved, if that is known and the
        store still holds the bytes that commit wrote; else it is decoded from
        the store. The bytes are read in this write transaction, which LMDB
        serialises with every other writer, those of producer processes
        (``dopool.connect``) included: a meta one of them changed is read
        anew, so its events and counters are never overwritten. Taking the
        meta leaves none known: if this transaction fails, the next one reads
        the store, where its changes never landed.
        """
        memory = self._memory
        raw = self._raw = self._ns.meta_bytes(txn)
        meta = memory.meta
        if meta is not None:
            memory.meta = None
            # Nobody else wrote it since. (A meta is kept only once saved: one never
            # stored, whose pause its pool's record decides, is always read anew.)
            if raw == memory.raw:
                return meta
        return self._ns.decode_meta(txn, raw)

    def _save_meta(self, txn: Txn, meta: Meta) -> None:
        self._raw = self._ns.save_meta(txn, meta)
        self._saved = meta

    def _accept(self, txn: Txn, meta: Meta, now: float, effects: Effects) -> None:
        """Store the taken enqueues; each gets its answer in ``effects``."""
        if not self._taken:
            return  # most outcomes take none: the hot path skips the call
        taken = self._taken
        if any(message.call is not None for message in taken):
            taken = self._unrecorded(txn, taken, effects)
        batches = [(message, message.items) for message in taken]
        self._machine.accept(txn, meta, batches, now, effects)
        if taken is not self._taken:
            self._record_calls(txn, effects, now)

    def _enqueue_body(
        self, effects: Effects, idle: Callable[[], bool]
    ) -> Callable[[Txn], tuple[Meta, Started | None]]:
        """The transaction of the taken enqueues.

        If ``idle()`` says the instance is idle when the body runs, and the clock
        runs due work at once, it also starts the first due event: one commit, no
        trip through the clock.
        """
        now = self._clock.now()
        starts = self._clock.starts_due_work_at_once

        def body(txn: Txn) -> tuple[Meta, Started | None]:
            start_now = idle() and starts
            meta = self._load_meta(txn)
            taken = self._taken
            if any(message.call is not None for message in taken):
                taken = self._unrecorded(txn, taken, effects)
            batches = [(message, message.items) for message in taken]
            self._machine.enqueue(txn, meta, batches, now, effects)
            if taken is not self._taken:
                self._record_calls(txn, effects, now)
            started = self._machine.take_alarm(txn, meta, now, effects) if start_now else None
            self._save_meta(txn, meta)
            return meta, started

        return body

    def _unrecorded(self, txn: Txn, taken: list[Enqueue], effects: Effects) -> list[Enqueue]:
        """The taken enqueues to store: a producer's call stored before (by the producer,
        which gave up waiting for this owner) is answered from its record instead."""
        fresh: list[Enqueue] = []
        for message in taken:
            call = message.call
            record = None if call is None else stored_call(txn, call.producer, call.number)
            if record is None:
                fresh.append(message)
            else:
                effects.answers.append((message, record.answer(self._spec.name)))
        return fresh

    def _record_calls(self, txn: Txn, effects: Effects, now: float) -> None:
        """Record each producer's call this transaction stored, with its answer, and forget
        the records its producer needs no more."""
        for message, answer in effects.answers:
            call = getattr(message, "call", None)
            if call is not None and isinstance(answer, list):  # (a refusal stored nothing)
                record_call(txn, call.producer, call.number, now, answer)
                forget_calls(txn, call.producer, call.done_below)

    def _fail_taken(self, error: DopoolError | None) -> None:
        """Fail the taken enqueues not answered yet: nothing of theirs committed."""
        taken, self._taken = self._taken, []
        for message in taken:
            fail_reply(message, error or InstanceCrashedError(self._id))

    def _sync_alarm(self, meta: Meta) -> None:
        memory = self._memory
        # Only a schedule's next fire (instance 0's): it keeps no simulated clock busy.
        recurring = not meta.pending and meta.alarm is not None and meta.alarm == meta.next_fire
        if meta.alarm != memory.told_alarm or recurring != memory.told_recurring:
            memory.told_alarm = meta.alarm
            memory.told_recurring = recurring
            self._clock.set_alarm(self._mailbox, meta.alarm, recurring=recurring)

    def _publish(self, meta: Meta, effects: Effects) -> None:
        """Tell the clock, callers, subscribers, callbacks and other instances what committed."""
        # (``_sync_alarm``'s test: most agree, and have no schedule)
        if meta.alarm != self._memory.told_alarm or meta.next_fire is not None:
            self._sync_alarm(meta)
        self._taken = []
        emit = self._env.emit
        events, emptied = effects.events, effects.empty
        if emptied is None:
            for event in events:
                emit(event)
        else:  # ``empty`` where the queue emptied: before what this transaction enqueued after
            for event in events[:emptied]:
                emit(event)
            emit(self._machine.event("empty", self._clock.now()))
            for event in events[emptied:]:
                emit(event)
        for oseq, record in effects.deliveries:
            self._deliver(oseq, record)
        if self._spec.options.on_dead_letter is not None:
            for dead in effects.dead:
                _call_hook("on_dead_letter", self._spec.options.on_dead_letter, dead)
        if emptied is not None and self._spec.options.on_empty is not None:
            info = EmptyInfo(
                self._spec.name, self._index, self._id, meta.succeeded + meta.dead_lettered
            )
            _call_hook("on_empty", self._spec.options.on_empty, info)
        for message, answer in effects.answers:  # last: a caller sees its events emitted
            if isinstance(answer, DopoolError):
                fail_reply(message, answer)
            else:
                message.reply.set(answer)

    # -- follow-ups leaving the outbox ---------------------------------------------------
    def _deliver(self, oseq: int, record: OutboxRecord) -> None:
        """Send follow-up ``oseq`` (committed in the outbox) to its instance, via the clock.

        One for a pool that is not defined in this runtime stays in the outbox, held
        until the pool is defined (a ``Resend``); one to a pool with held ones goes
        after them, since a target takes one source's links only in order.
        """
        pool = record.pool
        if pool == self._spec.name:
            self._send(self._env.cells, oseq, record)
            return
        address = self._env.directory.address_or_wait(pool, self._mailbox)
        if address is None:
            if pool not in self._held:
                logger.warning(
                    "instance %s: follow-ups for pool %r wait in the outbox until it is defined",
                    self._id,
                    pool,
                )
            self._held.setdefault(pool, []).append((oseq, record))
            return
        self.resend_held(pool)
        self._send(address.cells, oseq, record)

    def resend_held(self, pool: str) -> None:
        """Send the follow-ups held for ``pool``, which is defined now, in outbox order."""
        held = self._held.pop(pool, None)
        address = self._env.directory.get(pool)
        if held is None or address is None:
            return
        for oseq, record in held:
            self._send(address.cells, oseq, record)

    def _send(self, cells: Cells, oseq: int, record: OutboxRecord) -> None:
        if record.target >= cells.concurrency:  # a crafted record: reported, never lost
            logger.error(
                "instance %s: follow-up %d is for instance %d of pool %r, which has %d: "
                "kept in the outbox",
                self._id,
                oseq,
                record.target,
                record.pool,
                cells.concurrency,
            )
            return
        if not cells.serves(record.target):
            self._deliver_across(oseq, record)  # another worker serves it
            return
        deliver = Deliver(self._spec.name, self._index, oseq, record)
        self.send_later(cells, record.target, deliver)

    def send_later(self, cells: Cells, index: int, message: Any) -> None:
        """Send ``message`` to instance ``index`` of ``cells`` via the clock, its address
        looked up when it is delivered: an instance not running is started then (or put
        in line for a slot, the message kept for it), not before it has anything to do."""
        self._clock.deliver((cells.name, index), partial(_send_to, cells, index, message))

    def _deliver_across(self, oseq: int, record: OutboxRecord) -> None:
        """Deliver a follow-up into an instance another worker process serves, in one
        transaction of this instance: the target's side of the delivery as a producer
        makes an enqueue (its meta read anew, the link order checked), and this side's
        acknowledgement. Links this target has not had yet, waiting earlier in the
        outbox (sent to the target's actor here before another worker took it over),
        go first, in order. Then the worker serving the target is woken."""
        if record.pool == self._spec.name:
            options = self._spec.options
        else:
            address = self._env.directory.get(record.pool)
            if address is None:
                return
            options = address.options
        target = producer_machine(record.pool, record.target, options.rules)
        source, index, now = self._spec.name, self._index, self._clock.now()

        def body(txn: Txn) -> str | None:
            tmeta = target.namespace.load_meta(txn)
            expected = target.namespace.last_delivered(txn, source, index) + 1
            pending = [(oseq, record)]  # a duplicate (link < expected): acknowledged
            if record.link >= expected:
                pending = sorted(
                    (
                        (seq, entry)
                        for seq, entry in self._ns.iter_outbox(txn)
                        if isinstance(entry, OutboxRecord)
                        and (entry.pool, entry.target) == (record.pool, record.target)
                        and expected <= entry.link <= record.link
                    ),
                    key=lambda item: item[1].link,
                )
            taken = []
            for seq, entry in pending:
                if entry.link > target.deliver(txn, tmeta, source, index, entry, now, Effects()):
                    break  # a link missing from the outbox: the target takes none after it
                taken.append(seq)
            if any(entry.link >= expected for _, entry in pending):
                target.namespace.save_meta(txn, tmeta)
            meta = self._load_meta(txn)
            for seq in taken:
                if self._machine.delivered(txn, seq):
                    meta.outbox -= 1
            self._save_meta(txn, meta)
            return lease_owner(txn, record.pool, record.target)

        try:
            owner = self._transact(body)
        except DamagedRecordError as damage:  # the target's mark, say: the entry stays
            logger.error(
                "instance %s: follow-up %d for %s:%d not delivered: %s",
                self._id,
                oseq,
                record.pool,
                record.target,
                damage,
            )
            return
        if self._env.wake is not None:
            self._env.wake(record.pool, record.target, owner)

    def cells_of(self, pool: str, index: int) -> Cells | None:
        """The instances of ``pool`` (this pool, or another defined one), if it has an
        instance ``index``."""
        if pool == self._spec.name:
            cells = self._env.cells
        else:
            address = self._env.directory.get(pool)
            if address is None:
                return None
            cells = address.cells
        return cells if 0 <= index < cells.concurrency else None


def _send_to(cells: Cells, index: int, message: Any) -> None:
    cells[index].mailbox.send(message)


def _call_hook(name: str, hook: Callable[[Any], Any], argument: Any) -> None:
    """Call a user hook; whatever it raises, SystemExit included, is logged and ignored."""
    try:
        ran(hook(argument), name)
    except BaseException:  # from an actor, pykka would stop every actor
        logger.exception("%s hook raised; ignored", name)
