"""Producers in other processes: ``dopool.connect`` and the pools it hands out.

A :class:`Connection` opens a store's LMDB environment for writing without the
store lock, so any number of processes (and threads) may hold one while one
runtime owns the store, or while none does. It runs no actors and no handlers.
A :class:`ProducerPool`'s enqueue is the owning runtime's own enqueue transition
(:meth:`QueueMachine.enqueue`: the event's key, the meta's counters, the alarm
slot), made in the producer's LMDB write transaction, which LMDB serialises with
every other writer of the store; once it is durable the owner is told which
instance to wake (:mod:`dopool._watch`). The owner's instance reads the meta
anew when it finds another's bytes in the store (``InstanceShell._load_meta``).

Times are the wall clock's (epoch seconds): a store owned by a runtime on a
simulated clock is no place for a producer (docs/deployment.md).
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

from dopool._across import Share, producer_machine, settle, store_shares
from dopool._clock import RealClock
from dopool._control import cancel, control
from dopool._errors import (
    ConfigurationError,
    DopoolError,
    PoolClosedError,
    PoolNotFoundError,
    StorageError,
)
from dopool._filters import FilterOptions, Filters, listed
from dopool._layout import Meta, Namespace, get_pool, pool_records
from dopool._leases import lease_owner
from dopool._lifecycle import lookup, parse_event_id
from dopool._machine import QueueMachine
from dopool._messages import Item
from dopool._options import PoolOptions, Schema
from dopool._recurring import Recurring
from dopool._router import Positions, Router, RoutingTable
from dopool._schedules import ScheduleOptions, definition, read_schedules, schedule_info
from dopool._status import read_pool_status
from dopool._storage import Environment, Txn, open_shared, opened_before_fork
from dopool._types import DeadLetter, EnqueueResult, EventInfo, PoolStatus, ScheduleInfo
from dopool._validation import (
    check_path,
    check_pool_name,
    due_time,
    prepare,
    prepare_many,
    with_ttl,
)
from dopool._watch import Notifier

T = TypeVar("T")

DURABILITY_MODES = ("sync", "async")
#: Seconds a producer's write waits for another process's write (the store's writer
#: lock) before it raises :class:`StoreBusyError` (``connect(lock_timeout=)``).
DEFAULT_LOCK_TIMEOUT = 10.0
MAX_LOCK_TIMEOUT = 1e9  # (threads cannot wait much longer at once: threading.TIMEOUT_MAX)


def connect(
    path: str | Any, *, durability: str = "sync", lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT
) -> Connection:
    """Open the store at ``path`` to enqueue into its pools from this process.

    Args:
        path: a store directory a runtime created (``str`` or ``os.PathLike``).
        durability: ``"sync"`` (an enqueue is fsynced before it returns) or
            ``"async"`` (it survives a crash of the process, not of the OS).
        lock_timeout: seconds a write (an enqueue, a pause...) waits while another
            process writes, before it raises :class:`StoreBusyError`, having written
            nothing; None: as long as that takes.

    Raises:
        StoreNotFoundError: no store at ``path``.
        StoreFormatError: a store of another format, or one a runtime must migrate first.
        StorageError: the store cannot be opened, or is damaged.
        ConfigurationError: a bad argument.
    """
    return Connection(path, durability=durability, lock_timeout=lock_timeout)


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
    ) -> None:
        check_path(path)
        if durability not in DURABILITY_MODES:
            raise ConfigurationError(f"durability must be 'sync' or 'async', got {durability!r}")
        self.durability = durability
        self._lock_timeout = check_lock_timeout(lock_timeout)
        self._shared: Environment = open_shared(path, sync=durability == "sync")
        self.path: Path = Path(path)
        # An environment this process opened before, for a runtime, without fsync: sync
        # each commit here instead.
        self._fsync = durability == "sync" and not self._shared.sync
        self._clock = RealClock()  # no alarm is ever set on it: no thread
        self._notifier = Notifier(self.path)
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
                try:
                    env.sync(True)
                except lmdb.Error as exc:
                    raise StorageError(f"a write committed but failed to sync: {exc}") from exc
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


class ProducerPool:
    """A pool of a store, as a producer sees it: enqueue, control and read.

    Enqueues are the owning runtime's enqueue transaction, with the same routing,
    checks, limits and errors as :class:`WorkerPool`'s; pause, resume, drain and
    cancel its own transitions (:mod:`dopool._control`). Make one with
    :meth:`Connection.pool`.
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
        """Add one event; it is durable when this returns (see ``WorkerPool.enqueue``).

        Raises:
            EventValidationError: not msgpack-encodable, rejected by the schema, a bad key.
            ScheduleError: a bad ``delay``, ``not_before`` or ``ttl``, or delay and
                not_before both given.
            EventTooLargeError: over 128 KiB encoded, or a partition or dedup key over 2 KiB.
            QueueFullError: the chosen instance holds ``max_queue_depth`` events.
            PoolClosedError: the connection is closed.
        """
        self._connection.check_open(self._name)
        due = None if delay is None and not_before is None else self._due(delay, not_before)
        item = prepare(event, partition_key, priority, self._schema, due=due, dedup_key=dedup_key)
        items = with_ttl((item,), ttl, due, self._connection.now())
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
        """Add several events, validated first; each instance's share is stored atomically,
        all in one transaction. If an instance refuses its share, the error's ``stored``
        lists what the others stored."""
        self._connection.check_open(self._name)
        due = None if delay is None and not_before is None else self._due(delay, not_before)
        items = prepare_many(
            events, partition_key, priority, self._schema, due=due, dedup_keys=dedup_keys
        )
        if not items:
            return []
        return self._store(with_ttl(items, ttl, due, self._connection.now()), partition_key)

    def _due(
        self, delay: float | timedelta | None, not_before: float | datetime | None
    ) -> float | None:
        return due_time(delay, not_before, now=self._connection.now, wall=True)

    def _store(self, items: tuple[Item, ...], partition_key: str | None) -> list[EnqueueResult]:
        """One write transaction: route by the stored concurrency, then each instance's
        share as its own runtime would store it; then wake the instances written."""
        now = self._connection.now()
        keys = [item.dedup_key for item in items]

        def body(txn: Txn) -> list[Share]:
            table = self._table(txn)
            groups: dict[int, Positions]
            if len(items) == 1:
                groups = {self._router.choose(partition_key, table): range(1)}
            else:
                some = keys if any(keys) else None
                groups = self._router.split(len(items), partition_key, some, table)
            return store_shares(txn, self._name, self._machine, items, groups, now)

        shares = self._connection.write(self._name, body)
        results: list[Any] = [None] * len(items)
        failure = settle(shares, results, partial(self._connection.wake, self._name))
        if failure is not None:
            if len(items) > 1:
                failure.stored = [result for result in results if result is not None]
            raise failure
        return results

    def schedule(self, name: str, event: Any, **options: Unpack[ScheduleOptions]) -> ScheduleInfo:
        """Define a recurring schedule, as ``WorkerPool.schedule`` does."""
        spec = definition(name, event, options, self._schema)
        return schedule_info(self._schedules_write(lambda r, t, m, now: r.define(t, m, spec, now)))

    def unschedule(self, name: str) -> bool:
        """Remove the recurring schedule ``name``; whether there was one."""
        return bool(self._schedules_write(lambda r, t, m, now: r.remove(t, m, name, now)))

    def _schedules_write(self, change: Callable[[Recurring, Txn, Meta, float], T]) -> T:
        """Instance 0's schedules changed in one write transaction; then its owner woken."""
        now = self._connection.now()

        def body(txn: Txn) -> T:
            self._table(txn)  # PoolNotFoundError for a store replaced
            machine = self._machine(0)
            meta = machine.namespace.load_meta(txn)
            result = change(machine.recurring, txn, meta, now)
            machine.namespace.save_meta(txn, meta)
            return result

        result = self._connection.write(self._name, body)  # (PoolClosedError if closed)
        self._connection.notify(self._name, 0)
        return result

    def schedules(self) -> list[ScheduleInfo]:
        """The recurring schedules as committed, sorted by name."""
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
            machine = self._machines[index] = producer_machine(self._name, index, self._options)
        return machine

    # -- control, from this process (dopool._control) ---------------------------------
    def pause(self, index: int | None = None) -> None:
        """Stop starting events on the pool, or on instance ``index``, as ``WorkerPool.pause``."""
        control(self._connection, self._name, "pause", index)

    def resume(self, index: int | None = None) -> None:
        """Undo :meth:`pause`; the owner starts the due events at once."""
        control(self._connection, self._name, "resume", index)

    def drain(self, index: int | None = None) -> int:
        """Remove every pending event but a running one; returns how many were removed."""
        return sum(
            changed.drained for changed in control(self._connection, self._name, "drain", index)
        )

    def cancel(self, event_id: str) -> bool:
        """Cancel an event that has not started, or waits in backoff; whether it was (see
        ``WorkerPool.cancel``; the owner emits no ``cancelled`` pool event for it).

        Raises:
            EventIdError: not an event id of this pool.
        """
        return cancel(self._connection, self._name, event_id)

    # -- reading committed state -------------------------------------------------------
    def status(self) -> PoolStatus:
        """Counters and state as committed (no restart state: that is the owner's memory)."""
        with self._connection.reading(self._name) as txn:
            concurrency = self._table(txn).concurrency  # PoolNotFoundError if none
            return read_pool_status(txn, self._name, concurrency)

    def event(self, event_id: str) -> EventInfo | None:
        """An event by its id, as committed: as ``WorkerPool.event``, finished events kept
        for the ``keep_finished`` this handle was given (on the wall clock).

        Raises:
            EventIdError: not an event id of this pool.
            DamagedRecordError: the event's stored record is damaged.
        """
        with self._connection.reading(self._name) as txn:
            concurrency = self._table(txn).concurrency  # PoolNotFoundError if none
            index, sequence = parse_event_id(event_id, self._name, concurrency)
            ns = Namespace(self._name, index)
            keep, now = self._options.keep_finished, self._connection.now()
            return lookup(txn, ns, ns.load_meta(txn), self._name, index, sequence, keep, now)

    def dead_letters(
        self, index: int | None = None, **filters: Unpack[FilterOptions]
    ) -> list[DeadLetter]:
        """The dead letters of the pool or of one instance that match the filters, by
        instance then sequence: as ``WorkerPool.dead_letters`` (ages on the wall clock).

        Raises:
            FilterError: a bad filter, or ``where`` raised.
        """
        matching = Filters.of(filters)
        with self._connection.reading(self._name) as txn:
            concurrency = self._table(txn).concurrency  # PoolNotFoundError if none
        if index is None:
            indices: Iterable[int] = range(concurrency)
        elif isinstance(index, bool) or not isinstance(index, int):
            raise ConfigurationError(f"instance index must be an int, got {index!r}")
        elif not 0 <= index < concurrency:
            raise ConfigurationError(
                f"pool {self._name!r} has no instance {index} (concurrency {concurrency})"
            )
        else:
            indices = [index]
        namespaces = [Namespace(self._name, i) for i in range(concurrency)]
        read = partial(self._connection.reading, self._name)
        return listed(read, namespaces, indices, matching, self._connection.now())


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
