"""Producers in other processes: ``dopool.connect`` and the pools it hands out.

A :class:`Connection` opens a store's LMDB environment for writing without the
store lock, so any number of processes (and threads) may hold one while one
runtime owns the store, or while none does. It runs no actors and no handlers.
A :class:`ProducerPool`'s enqueue is the owning runtime's own enqueue transition
(:meth:`QueueMachine.enqueue`: the event's key, the meta's counters, the alarm
slot), made in the producer's LMDB write transaction, which LMDB serialises with
every other writer of the store; once it is durable the owner is told which
instance to wake (:mod:`dopool._engine.wakeups`). The owner's instance reads the meta
anew when it finds another's bytes in the store (``InstanceShell._load_meta``).

Times are the wall clock's (epoch seconds): a store owned by a runtime on a
simulated clock is no place for a producer (docs/deployment.md).

Live control through a connection (:func:`control`, :func:`cancel`): ``dopool
pause``, ``resume`` and ``drain`` act on a store whether or not a runtime owns it,
as a :class:`ProducerPool`'s ``pause``, ``resume``, ``drain`` and ``cancel`` do.
Each instance's change is the queue machine's own transition
(:meth:`QueueMachine.set_paused`, :meth:`QueueMachine.drain`), made in one LMDB
write transaction of a :class:`~dopool.Connection`, like a producer's enqueue:
LMDB serialises it with the owner's transactions, so it lands in order with the
instance's other changes, and it is durable when the call returns. Then the owner
is woken (:mod:`dopool._engine.wakeups`), whose next transaction on the instance reads the
changed meta anew (its cached one no longer matches the stored bytes).

A producer's :meth:`~dopool.ProducerPool.cancel` is the same: the queue machine's
:meth:`QueueMachine.cancel`, in one transaction of the connection, then the owner woken.
An event whose attempt is running is not cancelled: the meta's ``running`` is committed
before its handler starts, so it is seen here.

A drained or cancelled event's dedup key is released as the owner's own drain releases
it, stamped with the finish (:data:`STAMP_WINDOW`); a cancelled event is remembered the
same way, for the owner's ``keep_finished`` (its lookups and sweeps judge the age).

What the owner keeps in memory needs nothing more. Every start of an attempt is
decided inside one of its write transactions from the meta as committed, so none
starts on an instance paused before (an attempt already running finishes, and its
outcome starts nothing after it). An alarm the owner set for an older slot fires,
reads the meta and does only what it says. A resume sets the slot due now, and
the wake-up (or, if lost, the poll) has the owner start the due work at once.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, NoReturn, TypeVar, Unpack

import lmdb

from dopool import tracing
from dopool._clock.clocks import RealClock
from dopool._cluster.leases import lease_owner
from dopool._cluster.owner_wire import Call, Full
from dopool._cluster.remote import (
    Changed,
    Share,
    Verb,
    cancel_in,
    producer_machine,
    settle,
    store_shares,
    transition,
)
from dopool._cluster.routing import Positions, Router, RoutingTable, place
from dopool._engine.options import PoolOptions, Schema
from dopool._engine.storage import ReadOnlyStorage
from dopool._engine.wakeups import Notifier
from dopool._errors import (
    ConfigurationError,
    DamagedRecordError,
    DopoolError,
    PoolClosedError,
    PoolNotFoundError,
    QueueFullError,
    StorageError,
    shown,
)
from dopool._handles.filters import Filters, by_instance, chosen, listed
from dopool._handles.owner_link import OwnerLinks
from dopool._handles.schedules import definition, read_schedules, schedule_info
from dopool._machine.lifecycle import lookup, parse_event_id
from dopool._machine.machine import QueueMachine
from dopool._machine.status import Listing, read_pool_status
from dopool._machine.types import (
    DefineSchedule,
    Effects,
    Item,
    Purge,
    QueueRules,
    Redrive,
    Unschedule,
)
from dopool._machine.validation import (
    check_keyed,
    check_path,
    check_pool_name,
    due_time,
    prepare,
    prepare_many,
    with_ttl,
)
from dopool._pools import FilterOptions, Pool, ScheduleOptions, StorageView
from dopool._store.commit import sync_meta
from dopool._store.environment import Environment, open_shared, opened_before_fork
from dopool._store.layout import (
    Namespace,
    forget_calls,
    get_pool,
    pool_records,
    record_call,
    set_pool_paused,
    stored_call,
    used_instances,
)
from dopool._store.txn import Txn
from dopool._types import DeadLetter, EnqueueResult, EventInfo, PoolStatus, ScheduleInfo

T = TypeVar("T")

DURABILITY_MODES = ("sync", "async")
#: Seconds a producer's write waits for another process's write (the store's writer
#: lock) before it raises :class:`StoreBusyError` (``connect(lock_timeout=)``).
DEFAULT_LOCK_TIMEOUT = 10.0
MAX_LOCK_TIMEOUT = 1e9  # (threads cannot wait much longer at once: threading.TIMEOUT_MAX)
MAX_WAIT = 1e9  # the longest connect(wait=) waits for a store to be created


def connect(
    path: str | Any,
    *,
    durability: str = "sync",
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    wait: float = 0.0,
    via_owner: bool | None = None,
) -> Connection:
    """Open the store at ``path`` to enqueue into its pools from this process.

    Args:
        path: a store directory a runtime created (``str`` or ``os.PathLike``).
        wait: seconds to wait for that store to be created, by a worker starting
            beside this process (a web container up first, say); 0: not at all.
        durability: ``"sync"`` (an enqueue is fsynced before it returns) or
            ``"async"`` (it survives a crash of the process, not of the OS).
        lock_timeout: seconds a write (an enqueue, a pause...) waits while another
            process writes, before it raises :class:`StoreBusyError`, having written
            nothing; None: as long as that takes.
        via_owner: send each enqueue into one instance to the process serving it, which
            stores it in its own commit (shared with its other work), and store it here
            only if that process does not answer; False: store every enqueue here. None
            (the default): under ``"sync"``, where sharing the owner's fsync pays, and not
            under ``"async"``, where the owner would spend its own CPU on every producer's
            enqueue (docs/benchmarks.md measures both).

    Raises:
        StoreNotFoundError: no store at ``path`` (after ``wait`` seconds): the message
            says what creates one.
        StoreFormatError: a store of another format, or one a runtime must migrate first.
        StorageError: the store cannot be opened, or is damaged.
        ConfigurationError: a bad argument.
    """
    return Connection(
        path, durability=durability, lock_timeout=lock_timeout, wait=wait, via_owner=via_owner
    )


class Connection:
    """A producer's handle on a store: its pools, by name; see :func:`connect`.

    Use it as a context manager, or call :meth:`close`. Thread-safe.
    """

    def __init__(
        self,
        path: str | Any,
        *,
        durability: str = "sync",
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
        wait: float = 0.0,
        via_owner: bool | None = None,
    ) -> None:
        check_path(path)
        if via_owner is not None and type(via_owner) is not bool:
            raise ConfigurationError(
                f"via_owner must be True, False or None, got {shown(via_owner)}"
            )
        if durability not in DURABILITY_MODES:
            raise ConfigurationError(f"durability must be 'sync' or 'async', got {durability!r}")
        self.durability = durability
        self._lock_timeout = check_lock_timeout(lock_timeout)
        wait = _check_wait(wait)
        self._shared: Environment = open_shared(path, sync=durability == "sync", wait=wait)
        self.path: Path = Path(path)
        # Each durable commit flushes its meta page after it (see sync_meta); in an
        # environment this process opened before without fsync, for a runtime, the
        # whole commit.
        self._fsync = durability == "sync"
        self._clock = RealClock()  # no alarm is ever set on it: no thread
        self._notifier = Notifier(self.path)
        # The owners this connection sends its enqueues to (None: it stores every one).
        if via_owner is None:
            via_owner = durability == "sync"
        self.owners = OwnerLinks(self.path, sync=durability == "sync") if via_owner else None
        self._cond = threading.Condition()
        self._active = 0  # calls using the environment, which close() waits for
        self._closed = False
        self._pid = os.getpid()  # LMDB's environment is this process's: not a forked child's

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def lock_timeout(self) -> float | None:
        """Seconds a write waits for another process's (``connect(lock_timeout=)``)."""
        return self._lock_timeout

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Connection {str(self.path)!r} {state}>"

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def pool(
        self,
        name: str,
        *,
        schema: Schema | None = None,
        max_queue_depth: int | None = None,
        dedup_window: float = 0.0,
        keep_finished: float = 0.0,
    ) -> ProducerPool:
        """A producer's handle on pool ``name``, which a runtime defined in this store.

        ``schema``, ``max_queue_depth``, ``dedup_window`` and ``keep_finished`` are the
        pool's ``define`` options of the same names, which the store does not hold: the
        handle applies what it is given, so pass the owner's to refuse what the owner
        would (and to forget finished events when it does).

        Raises:
            PoolNotFoundError: no runtime ever defined the pool in this store.
            ConfigurationError: a bad name or option.
            PoolClosedError: the connection is closed.
        """
        check_pool_name(name)
        options = PoolOptions(
            execute=_no_handler,
            schema=schema,
            max_queue_depth=max_queue_depth,
            dedup_window=dedup_window,
            keep_finished=keep_finished,
        )
        with self.reading(name) as txn:
            if get_pool(txn, name) is None:
                known = sorted(pool_records(txn))
                raise PoolNotFoundError(path=str(self.path), pool=name, known=known)
        return ProducerPool(self, name, options)

    def close(self) -> None:
        """Wait for the calls in progress, then close; later calls raise ``PoolClosedError``.

        In a child forked from the process that connected, it only marks the connection
        closed: the environment is the parent's.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            while self._active:
                self._cond.wait()
        if os.getpid() != self._pid:
            return
        if self.owners is not None:
            self.owners.close()
        self._notifier.close()
        self._clock.close()
        self._shared.release()

    # -- what its pools use ------------------------------------------------------------
    @contextmanager
    def _using(self, pool: str) -> Iterator[Any]:
        self.check_open(pool)
        with self._cond:
            if self._closed:
                raise PoolClosedError(pool, closed="connection")
            self._active += 1
        try:
            yield self._shared.env
        finally:
            with self._cond:
                self._active -= 1
                if not self._active:
                    self._cond.notify_all()

    def check_open(self, pool: str) -> None:
        """Refuse a call once closed, or from a child forked after the connection was made
        (LMDB's environment must not cross a fork: connect again in the child)."""
        if self._closed:
            raise PoolClosedError(pool, closed="connection")
        if os.getpid() != self._pid:
            raise ConfigurationError(opened_before_fork("a connection", self.path, self._pid))

    def now(self) -> float:
        return self._clock.now()

    def write(self, pool: str, body: Callable[[Txn], T]) -> T:
        """Run ``body`` in one write transaction, durable (as the connection's durability
        says) when this returns; one that raises is rolled back."""
        with self._using(pool) as env:
            writer = self._shared.writer
            writer.acquire(self._lock_timeout)  # StoreBusyError: nothing begun
            try:
                with env.begin(write=True) as txn:
                    result = body(txn)
            except lmdb.Error as exc:
                raise StorageError(f"write failed and was rolled back: {exc}") from exc
            finally:
                writer.release()
            if self._fsync:
                sync_meta(env)  # outside the writer lock (see sync_meta)
        return result

    @contextmanager
    def reading(self, pool: str) -> Iterator[Txn]:
        """A read-only snapshot of committed state."""
        with self._using(pool) as env:
            try:
                with env.begin(write=False, buffers=False) as txn:
                    yield txn
            except lmdb.Error as exc:
                raise StorageError(f"read failed: {exc}") from exc

    def notify(self, pool: str, index: int) -> None:
        """Tell the worker serving an instance (its lease says which), if one listens, to
        wake it."""
        owner = None
        with suppress(DopoolError), self.reading(pool) as txn:
            owner = lease_owner(txn, pool, index)
        self.wake(pool, index, owner)

    def wake(self, pool: str, index: int, owner: str | None) -> None:
        """Tell worker ``owner`` (None: whoever listens on ``wake.sock``) to wake an instance."""
        self._notifier.wake(pool, index, owner)


class ProducerPool(Pool):
    """A pool of a store, as a producer sees it: enqueue, control and read.

    Enqueues are the owning runtime's enqueue transaction, with the same routing,
    checks, limits and errors as :class:`WorkerPool`'s; pause, resume, drain and
    cancel its own transitions (:func:`control`, :func:`cancel`). Make one with
    :meth:`Connection.pool`. Its methods are :class:`~dopool.Pool`'s, documented
    there; what differs is noted here.
    """

    def __init__(self, connection: Connection, name: str, options: PoolOptions) -> None:
        self._connection = connection
        self._name = name
        self._options = options
        self._schema = options.schema
        # For the concurrency read last; its table is replaced, never published to.
        self._router = Router(0, table=RoutingTable.elsewhere(0))
        self._machines: dict[int, QueueMachine] = {}  # by instance index

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<ProducerPool {self._name!r} of {str(self._connection.path)!r}>"

    # -- enqueue -----------------------------------------------------------------------
    def enqueue(
        self,
        event: Any,
        *,
        partition_key: str | None = None,
        priority: int = 0,
        delay: float | timedelta | None = None,
        not_before: float | datetime | None = None,
        dedup_key: str | None = None,
        ttl: float | timedelta | None = None,
    ) -> EnqueueResult:
        self._connection.check_open(self._name)
        due = None if delay is None and not_before is None else self._due(delay, not_before)
        item = prepare(
            event,
            partition_key=partition_key,
            priority=priority,
            schema=self._schema,
            due=due,
            dedup_key=dedup_key,
        )
        now = self._connection.now
        with tracing.sending(self._name, with_ttl((item,), ttl, due, now()), now) as items:
            return self._store(items, partition_key)[0]

    def enqueue_many(
        self,
        events: Iterable[Any],
        *,
        partition_key: str | None = None,
        priority: int = 0,
        delay: float | timedelta | None = None,
        not_before: float | datetime | None = None,
        dedup_keys: Iterable[str | None] | None = None,
        ttl: float | timedelta | None = None,
    ) -> list[EnqueueResult]:
        """As :meth:`Pool.enqueue_many`, all the instances' shares in one transaction."""
        self._connection.check_open(self._name)
        due = None if delay is None and not_before is None else self._due(delay, not_before)
        items = prepare_many(
            events, partition_key, priority, self._schema, due=due, dedup_keys=dedup_keys
        )
        if not items:
            return []
        now = self._connection.now
        with tracing.sending(self._name, with_ttl(items, ttl, due, now()), now) as items:
            return self._store(items, partition_key)

    def _due(
        self, delay: float | timedelta | None, not_before: float | datetime | None
    ) -> float | None:
        return due_time(delay, not_before, now=self._connection.now, wall=True)

    def _store(self, items: tuple[Item, ...], partition_key: str | None) -> list[EnqueueResult]:
        """Sent to the owner of the one instance the items go to, if it answers
        (:mod:`dopool._handles.owner_link`); else stored here."""
        owners = self._connection.owners
        if owners is None:
            return self._store_here(items, partition_key)
        with self._connection.reading(self._name) as txn:
            groups = self._groups(txn, items, partition_key)
            if len(groups) != 1:  # several instances: one transaction here stores them all
                return self._store_here(items, partition_key, routed=groups)
            (index,) = groups
            owner = lease_owner(txn, self._name, index)
        number = owners.numbers.begin()
        try:
            results = owners.call(owner, Call(number, self._name, index, items))
            if results is None:
                return self._store_here(items, partition_key, routed=groups, call=number)
            if isinstance(results, Full):  # the owner's max_queue_depth: nothing stored
                refusal = QueueFullError(
                    pool=self._name,
                    instance_index=index,
                    depth=results.depth,
                    max_depth=results.max_depth,
                    incoming=results.incoming,
                )
                if len(items) > 1:
                    refusal.stored = []
                raise refusal
            return [
                EnqueueResult(sequence, instance, f"{self._name}:{instance}", position, duplicate)
                for instance, sequence, position, duplicate in results
            ]
        finally:
            owners.numbers.end(number)

    def _groups(
        self,
        txn: Txn,
        items: tuple[Item, ...],
        partition_key: str | None,
        routed: dict[int, Positions] | None = None,
    ) -> dict[int, Positions]:
        """Which instance each item goes to, by the concurrency stored now: ``routed`` (a
        snapshot's routing of the same call, the round-robin cursor moved once) unless the
        concurrency changed since."""
        concurrency = self._router.table.concurrency
        table = self._table(txn)
        if routed is not None and table.concurrency == concurrency:
            return routed
        check_keyed(self._name, table.concurrency, partition_key)
        if len(items) == 1:
            return {self._router.choose(partition_key, table): range(1)}
        keys = [item.dedup_key for item in items]
        return self._router.split(len(items), partition_key, keys if any(keys) else None, table)

    def _store_here(
        self,
        items: tuple[Item, ...],
        partition_key: str | None,
        *,
        routed: dict[int, Positions] | None = None,
        call: int | None = None,
    ) -> list[EnqueueResult]:
        """One write transaction: route by the stored concurrency, then each instance's
        share as its own runtime would store it; then wake the instances written.

        ``routed``: the call's routing, made in a snapshot just before. ``call``: the
        number of the call an owner was sent and did not answer. If the
        owner stored it after all, its record is the answer and nothing is stored again;
        else the call's record is written with its events, so that an owner still
        holding it finds it stored."""
        now = self._connection.now()
        owners = self._connection.owners if call is not None else None

        def body(txn: Txn) -> tuple[list[EnqueueResult] | None, list[Share]]:
            if owners is not None and call is not None:
                numbers = owners.numbers
                forget_calls(txn, numbers.producer, numbers.done_below())
                record = stored_call(txn, numbers.producer, call)
                if record is not None:
                    return record.answer(self._name), []
            groups = self._groups(txn, items, partition_key, routed)
            shares = store_shares(txn, self._name, self._machine, items, groups, now)
            if owners is not None and call is not None:
                answered: list[Any] = [None] * len(items)
                for share in shares:
                    if isinstance(share.answer, DopoolError):
                        break  # refused: nothing of the call is recorded, as nothing stored
                    place(answered, share.positions, share.answer)
                else:
                    record_call(txn, owners.numbers.producer, call, now, answered)
            return None, shares

        recorded, shares = self._connection.write(self._name, body)
        if recorded is not None:
            return recorded
        results: list[Any] = [None] * len(items)
        failure = settle(shares, results, partial(self._connection.wake, self._name))
        if failure is not None:
            if len(items) > 1:
                failure.stored = [result for result in results if result is not None]
            raise failure
        return results

    def schedule(self, name: str, event: Any, **options: Unpack[ScheduleOptions]) -> ScheduleInfo:
        with self._connection.reading(self._name) as txn:
            concurrency = self._table(txn).concurrency  # PoolNotFoundError if none
        spec = definition(name, event, options, self._schema, concurrency)
        return schedule_info(self._control_in(0, DefineSchedule(spec)))

    def unschedule(self, name: str) -> bool:
        return bool(self._control_in(0, Unschedule(name)))

    def _control_in(
        self, index: int, request: DefineSchedule | Unschedule | Redrive | Purge
    ) -> Any:
        """``request`` made on instance ``index`` (its transition, as its owner would make
        it) in one write transaction; then its owner woken; its answer."""
        now = self._connection.now()

        def body(txn: Txn) -> Any:
            self._table(txn)  # PoolNotFoundError for a store replaced
            machine = self._machine(index)
            meta = machine.namespace.load_meta(txn)
            result = machine.control(txn, meta, request, now, Effects())
            machine.namespace.save_meta(txn, meta)
            return result

        result = self._connection.write(self._name, body)  # (PoolClosedError if closed)
        self._connection.notify(self._name, index)
        return result

    def schedules(self) -> list[ScheduleInfo]:
        with self._connection.reading(self._name) as txn:
            self._table(txn)  # PoolNotFoundError for a store replaced
            return read_schedules(txn, self._name)

    def _table(self, txn: Txn) -> RoutingTable:
        """The routing table for the pool's concurrency as stored now (a runtime may
        change it while the pool holds nothing): no instance is served here, and each
        one's owner is read from its lease when it is written."""
        concurrency = get_pool(txn, self._name)
        if concurrency is None:  # pool records are never removed: a store replaced
            self._not_found(txn)
        table = self._router.table
        if table.concurrency != concurrency:
            table = RoutingTable.elsewhere(concurrency)
            # Round-robin starts at a random instance, so that short-lived producers,
            # each enqueuing a few events, spread them evenly.
            start = secrets.randbelow(concurrency)
            self._router = Router(concurrency, start=start, table=table)
        return table

    def _not_found(self, txn: Txn) -> NoReturn:
        known = sorted(pool_records(txn))
        raise PoolNotFoundError(path=str(self._connection.path), pool=self._name, known=known)

    def _machine(self, index: int) -> QueueMachine:
        machine = self._machines.get(index)
        if machine is None:
            machine = self._machines[index] = producer_machine(
                self._name, index, self._options.rules
            )
        return machine

    # -- control, from this process (control(), cancel() below) ---------------------------
    def pause(self, index: int | None = None) -> None:
        control(self._connection, self._name, "pause", index)

    def resume(self, index: int | None = None) -> None:
        """As :meth:`Pool.resume`; the owner starts the due events at once."""
        control(self._connection, self._name, "resume", index)

    def drain(self, index: int | None = None) -> int:
        return sum(
            changed.drained for changed in control(self._connection, self._name, "drain", index)
        )

    def cancel(self, event_id: str) -> bool:
        """As :meth:`Pool.cancel`; the owner emits no ``cancelled`` pool event for it."""
        return cancel(self._connection, self._name, event_id)

    def redrive(
        self,
        dead_letters: Iterable[DeadLetter] | None = None,
        *,
        index: int | None = None,
        **filters: Unpack[FilterOptions],
    ) -> int:
        """As :meth:`Pool.redrive`, beside the owner: one write transaction per instance,
        then its owner woken to run what was re-enqueued."""
        return self._act_on_dead_letters(Redrive, dead_letters, index, Filters.of(filters))

    def purge_dead_letters(
        self,
        dead_letters: Iterable[DeadLetter] | None = None,
        *,
        index: int | None = None,
        **filters: Unpack[FilterOptions],
    ) -> int:
        """As :meth:`Pool.purge_dead_letters`, beside the owner, as :meth:`redrive` is."""
        return self._act_on_dead_letters(Purge, dead_letters, index, Filters.of(filters))

    def _act_on_dead_letters(
        self,
        verb: type[Redrive | Purge],
        dead_letters: Iterable[DeadLetter] | None,
        index: int | None,
        filters: Filters,
    ) -> int:
        """Choose (in read snapshots), then act on each instance's in its own transaction."""
        self._connection.check_open(self._name)
        with self._connection.reading(self._name) as txn:
            concurrency = self._table(txn).concurrency  # PoolNotFoundError if none
            if index is None:
                indices = used_instances(txn, self._name)  # (one never used holds none)
                holding = [i for i in indices if _holds_dead_letters(txn, self._name, i)]
            else:
                indices = holding = [_checked(self._name, concurrency, index)]
        among = None
        if dead_letters is not None:
            name = "redrive" if verb is Redrive else "purge_dead_letters"
            among = by_instance(dead_letters, partial(_checked, self._name, concurrency), name)
        if among is None and not filters.given:
            requests = {i: verb(None) for i in holding}
        else:
            read = partial(self._connection.reading, self._name)
            now = self._connection.now()
            picked = chosen(read, self._name, indices, filters, now, among)
            requests = {i: verb(picked[i]) for i in sorted(picked)}
        return sum(int(self._control_in(i, request)) for i, request in requests.items())

    # -- reading committed state -------------------------------------------------------
    def status(
        self, *, instances: Iterable[int] | None = None, limit: int | None = None
    ) -> PoolStatus:
        """As :meth:`Pool.status`, with no restart state (that is the owner's memory)."""
        with self._connection.reading(self._name) as txn:
            concurrency = self._table(txn).concurrency  # PoolNotFoundError if none
            listing = Listing(instances, limit).check(concurrency)
            return read_pool_status(txn, self._name, concurrency, listing)

    def event(self, event_id: str) -> EventInfo | None:
        """As :meth:`Pool.event`, finished events kept for the ``keep_finished`` this
        handle was given."""
        with self._connection.reading(self._name) as txn:
            concurrency = self._table(txn).concurrency  # PoolNotFoundError if none
            index, sequence = parse_event_id(event_id, self._name, concurrency)
            ns = Namespace(self._name, index)
            keep, now = self._options.keep_finished, self._connection.now()
            return lookup(txn, ns, ns.load_meta(txn), self._name, index, sequence, keep, now)

    def storage(
        self, *, partition_key: str | None = None, instance: int | None = None
    ) -> StorageView:
        """As :meth:`Pool.storage`; each read is a read transaction of the connection's."""
        with self._connection.reading(self._name) as txn:
            concurrency = self._table(txn).concurrency  # PoolNotFoundError if none
        read = partial(self._connection.reading, self._name)
        return ReadOnlyStorage.of(read, self._name, concurrency, partition_key, instance)

    def dead_letters(
        self, index: int | None = None, **filters: Unpack[FilterOptions]
    ) -> list[DeadLetter]:
        matching = Filters.of(filters)
        with self._connection.reading(self._name) as txn:
            concurrency = self._table(txn).concurrency  # PoolNotFoundError if none
            used = used_instances(txn, self._name) if index is None else []
        if index is None:
            indices: Iterable[int] = used  # (one never used holds none)
        elif isinstance(index, bool) or not isinstance(index, int):
            raise ConfigurationError(f"instance index must be an int, got {index!r}")
        elif not 0 <= index < concurrency:
            raise ConfigurationError(
                f"pool {self._name!r} has no instance {index} (concurrency {concurrency})"
            )
        else:
            indices = [index]
        read = partial(self._connection.reading, self._name)
        return listed(read, self._name, indices, matching, self._connection.now())


# -- live control ------------------------------------------------------------------

#: The dedup window a drain here releases keys with. The owner's is not stored, so the
#: drained events' keys are stamped with their finish rather than removed (what a window
#: of 0 does): the owner's lookups then hold each for its own window, whatever it is, and
#: its sweeps remove them after. This window only keeps this drain from sweeping any.
#: A cancel remembers its event with it as ``keep_finished``, for the same reason: the
#: record's finish is stamped, the owner forgets it after its own ``keep_finished``, and
#: no record the owner remembers is swept from here.
STAMP_WINDOW = 1e9
VERBS: tuple[Verb, ...] = ("pause", "resume", "drain")


def control(
    connection: Connection, pool: str, verb: Verb, index: int | None = None
) -> list[Changed]:
    """Pause, resume or drain ``pool``'s instance ``index`` (all when None) of the store.

    One transaction for all of them, durable when this returns; then the owner, if
    one listens, is told to wake each instance changed. All of them are those ever used
    (the others hold nothing), and a pause or resume of the whole pool is stored for it,
    so that an instance first used later starts paused, or not, as it says.

    Raises:
        PoolNotFoundError: no runtime ever defined the pool in this store.
        ConfigurationError: a bad verb, or an index of no instance.
        PoolClosedError: the connection is closed.
    """
    if verb not in VERBS:
        raise ConfigurationError(f"verb must be one of {', '.join(VERBS)}, got {verb!r}")
    connection.pool(pool)  # PoolNotFoundError if never defined
    rules = QueueRules(dedup_window=STAMP_WINDOW)
    now = connection.now()

    def body(txn: Txn) -> list[Changed]:
        if index is None:
            if verb != "drain":
                set_pool_paused(txn, pool, verb == "pause")
            indices = used_instances(txn, pool)
        else:
            indices = [_checked(pool, get_pool(txn, pool) or 0, index)]
        answers = []
        for i in indices:
            answers.append(transition(txn, producer_machine(pool, i, rules), i, verb, now))
        return answers

    answers = connection.write(pool, body)
    for answer in answers:
        if answer.changed:
            connection.notify(pool, answer.index)
    return answers


def cancel(connection: Connection, pool: str, event_id: str) -> bool:
    """Cancel event ``event_id`` of ``pool`` unless it is running or finished; whether it
    was. One transaction, durable when this returns; then the owner is woken.

    Raises:
        EventIdError: not an event id of this pool.
        PoolClosedError: the connection is closed.
    """
    rules = QueueRules(dedup_window=STAMP_WINDOW, keep_finished=STAMP_WINDOW)
    now = connection.now()

    def body(txn: Txn) -> tuple[int, bool]:
        concurrency = get_pool(txn, pool)
        if concurrency is None:  # pool records are never removed: a store replaced
            known = sorted(pool_records(txn))
            raise PoolNotFoundError(path=str(connection.path), pool=pool, known=known)
        index, sequence = parse_event_id(event_id, pool, concurrency)
        return index, cancel_in(txn, producer_machine(pool, index, rules), sequence, now)

    index, cancelled = connection.write(pool, body)
    if cancelled:
        connection.notify(pool, index)
    return cancelled


def _holds_dead_letters(txn: Txn, pool: str, index: int) -> bool:
    """Whether instance ``index``'s meta says it holds dead letters (or is damaged: its
    transition then says what is wrong)."""
    try:
        return Namespace(pool, index).load_meta(txn).held_dead_letters > 0
    except DamagedRecordError:
        return True


def _checked(pool: str, concurrency: int, index: int) -> int:
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigurationError(f"instance index must be an int, got {index!r}")
    if not 0 <= index < concurrency:
        raise ConfigurationError(
            f"pool {pool!r} has no instance {index} (concurrency {concurrency})"
        )
    return index


def check_lock_timeout(seconds: object) -> float | None:
    """``seconds`` as a float (or None), if it is a lock timeout: > 0 and <= ``MAX_LOCK_TIMEOUT``.

    Raises:
        ConfigurationError: anything else.
    """
    if seconds is None:
        return None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= MAX_LOCK_TIMEOUT
    ):
        raise ConfigurationError(
            f"lock_timeout must be seconds > 0 and <= {MAX_LOCK_TIMEOUT:g}, or None to wait "
            f"as long as it takes; got {seconds!r}"
        )
    return float(seconds)


def _no_handler(_ctx: Any) -> None:
    raise AssertionError("a producer runs no handler")  # pragma: no cover


def _check_wait(wait: object) -> float:
    """``connect``'s ``wait``: seconds, at least 0 and at most ``MAX_WAIT``."""
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= MAX_WAIT:
        raise ConfigurationError(
            f"wait must be a number of seconds from 0 to {MAX_WAIT:g}, got {shown(wait)}"
        )
    return float(wait)
