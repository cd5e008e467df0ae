"""What a pool handle offers, whoever holds it: :class:`Pool`, the protocol that
:class:`~dopool.WorkerPool` (a runtime's) and :class:`~dopool.ProducerPool` (a
connection's) share, and the keywords of its calls.

Each handle writes every blocking call itself; the awaitable ones (``enqueue_async``
and the others a web handler makes) are written once, here, from the blocking ones.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Protocol, TypedDict, TypeVar, Unpack

from dopool._types import DeadLetter, EnqueueResult, EventInfo, PoolStatus, ScheduleInfo

T = TypeVar("T")


class ScheduleOptions(TypedDict, total=False):
    """The keywords of ``schedule`` (docs/api.md, "Recurring schedules")."""

    every: float | timedelta | None
    cron: str | None
    partition_key: str | None
    priority: int


class FilterOptions(TypedDict, total=False):
    """The filter keywords of ``dead_letters``, ``redrive`` and ``purge_dead_letters``."""

    error: str | re.Pattern[str] | None
    older_than: float | timedelta | None
    partition_key: str | None
    where: Callable[[DeadLetter], object] | None


class StorageView(Protocol):
    """An instance's own stored values, read-only: what ``pool.storage(...)`` returns
    (and what ``ctx.storage`` offers besides its writes). Values come back decoded (tuples
    as lists), a fresh copy at each read; keys are listed in order.

    Raises (every method):
        StorageItemError: a key that is not a str or is over 2 KiB of UTF-8.
        DamagedRecordError: a stored value on the way failed its checks.
    """

    def get(self, key: str, default: Any = None) -> Any:
        """The value under ``key``, or ``default`` if there is none."""
        ...

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """The values under ``keys`` that have one, by key, in the order asked."""
        ...

    def list(
        self,
        *,
        prefix: str = "",
        start: str | None = None,
        end: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """The values whose keys start with ``prefix``, from ``start`` (included) to
        ``end`` (excluded), at most ``limit`` of them, in key order (of the keys' UTF-8
        bytes, which is their code points' order).

        Raises:
            ConfigurationError: a bound that is not a str, a ``limit`` not an int >= 0.
        """
        ...


class Pool(Protocol):
    """A pool's handle: enqueue, control, recurring schedules and committed state.

    :class:`~dopool.WorkerPool` and :class:`~dopool.ProducerPool` both are one, with
    these signatures exactly (tests/handles/test_pool_protocol.py); code typed with ``Pool``
    takes either. Times are the pool's clock: the runtime's for a ``WorkerPool``, the
    wall clock for a ``ProducerPool``. Every method raises ``PoolClosedError`` once the
    runtime or the connection is closed.
    """

    @property
    def name(self) -> str:
        """The pool's name."""
        ...

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
        """Add one event; it is durable when this returns.

        Args:
            event: a msgpack-encodable value.
            partition_key: routes every event of the key to one instance.
            priority: higher runs first.
            delay: seconds (or a timedelta) from now before it is due.
            not_before: the clock time it is due at: a float of the pool's clock, or,
                under a real clock, a timezone-aware datetime. Not with ``delay``.
            dedup_key: while an event of the pool with this key is unfinished or finished
                within ``dedup_window``, store nothing: answer its result, ``duplicate``.
            ttl: seconds (or a timedelta) from its enqueue: not started by then, it is
                dead-lettered as expired instead of run. Longer than the delay.

        Raises:
            EventValidationError: not msgpack-encodable, rejected by the schema, a bad key.
            ScheduleError: a bad ``delay``, ``not_before`` or ``ttl``, or delay and
                not_before both given.
            EventTooLargeError: over 128 KiB encoded, or a partition or dedup key over 2 KiB.
            QueueFullError: the chosen instance holds ``max_queue_depth`` events.
        """
        ...

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
        """Add several events: validate all, then each instance stores its share atomically.

        ``partition_key``, ``priority``, ``delay``, ``not_before`` and ``ttl`` apply to
        every event, as in :meth:`enqueue`; ``dedup_keys`` holds one key (or None) per event.
        If an instance refuses its share, the error's ``stored`` lists what the other
        instances stored.
        """
        ...

    async def enqueue_async(
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
        """:meth:`enqueue`, awaited: the event is durable when the await returns, and the
        event loop runs meanwhile (the call waits for its commit in another thread; see
        :meth:`_off_loop`)."""
        call = partial(
            self.enqueue,
            event,
            partition_key=partition_key,
            priority=priority,
            delay=delay,
            not_before=not_before,
            dedup_key=dedup_key,
            ttl=ttl,
        )
        return await self._off_loop(call)

    async def enqueue_many_async(
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
        """:meth:`enqueue_many`, awaited, as :meth:`enqueue_async`."""
        call = partial(
            self.enqueue_many,
            events,
            partition_key=partition_key,
            priority=priority,
            delay=delay,
            not_before=not_before,
            dedup_keys=dedup_keys,
            ttl=ttl,
        )
        return await self._off_loop(call)

    async def event_async(self, event_id: str) -> EventInfo | None:
        """:meth:`event`, awaited, as :meth:`enqueue_async`."""
        return await self._off_loop(partial(self.event, event_id))

    async def cancel_async(self, event_id: str) -> bool:
        """:meth:`cancel`, awaited, as :meth:`enqueue_async`."""
        return await self._off_loop(partial(self.cancel, event_id))

    async def status_async(
        self, *, instances: Iterable[int] | None = None, limit: int | None = None
    ) -> PoolStatus:
        """:meth:`status`, awaited, as :meth:`enqueue_async`."""
        return await self._off_loop(partial(self.status, instances=instances, limit=limit))

    def _calls_on_loop_thread(self) -> bool:
        """Whether an awaited call is made on the event loop's own thread (a runtime on a
        simulated clock); else in a thread of its executor."""
        return False

    async def _off_loop(self, call: Callable[[], T]) -> T:
        """Make a blocking call for a coroutine.

        In a thread of the running loop's default executor (``asyncio.to_thread``), so
        the loop goes on while the call waits for its commit, an fsync included. The
        thread runs in a copy of the caller's context variables: an OpenTelemetry span
        current in the coroutine is the one ``dopool.tracing`` sees. Concurrent awaits
        are concurrent threads, and a runtime's committer takes every write waiting when
        it begins a commit, so they share an fsync (group commit) as threads do; at most
        the executor's threads are in flight (``loop.set_default_executor`` sets more).

        On the loop's thread under a simulated clock (:meth:`_calls_on_loop_thread`):
        virtual time never waits for real time, and a simulated run repeats only if
        its calls come from the thread that drives it.
        """
        if self._calls_on_loop_thread():
            return call()
        return await asyncio.to_thread(call)

    def pause(self, index: int | None = None) -> None:
        """Stop starting events on the pool, or on instance ``index``. Enqueues are still
        accepted.

        Raises:
            ConfigurationError: an index of no instance.
        """
        ...

    def resume(self, index: int | None = None) -> None:
        """Undo :meth:`pause`. A retry waiting on its backoff still waits for it."""
        ...

    def drain(self, index: int | None = None) -> int:
        """Remove every pending event of the pool, or of instance ``index`` (an attempt
        running finishes); returns how many were removed."""
        ...

    def cancel(self, event_id: str) -> bool:
        """Cancel an event that has not started, or waits in backoff; whether it was.

        False for an event that is running (its handler is not interrupted), finished
        or unknown. One transaction on the event's instance, which it is counted in
        (``cancelled``); a retry's backoff cancelled lets the next event start.

        Raises:
            EventIdError: not an event id of this pool.
        """
        ...

    def schedule(self, name: str, event: Any, **options: Unpack[ScheduleOptions]) -> ScheduleInfo:
        """Define a recurring schedule (``every`` seconds, or ``cron``: 5 fields, UTC), durable
        when this returns; instance 0 stores it and enqueues ``event`` at each fire. The same
        definition again changes nothing (docs/api.md, "Recurring schedules").

        Raises:
            ScheduleDefinitionError: a bad name, ``every`` or ``cron``; both or neither.
            EventValidationError, EventTooLargeError: the event, as ``enqueue``'s.
        """
        ...

    def unschedule(self, name: str) -> bool:
        """Remove the recurring schedule ``name``; whether there was one."""
        ...

    def schedules(self) -> list[ScheduleInfo]:
        """The recurring schedules as committed, by name; never waits for an instance."""
        ...

    def status(
        self, *, instances: Iterable[int] | None = None, limit: int | None = None
    ) -> PoolStatus:
        """Counters and state from committed storage; never waits for an instance.

        The counters are summed over the whole pool. ``instances`` lists the status of
        every instance ever used (any record stored: an instance never used is idle, with
        every counter 0), by index; ``instances=`` chooses among them (a ``range``, or
        any iterable of indices), and ``limit`` lists at most that many, so that a large
        pool is read a page at a time: ``status(instances=range(last + 1, concurrency),
        limit=100)``. The cost is one read per instance ever used.

        Raises:
            ConfigurationError: ``limit`` not an int >= 0, or ``instances`` naming an
                index the pool does not have.
        """
        ...

    def event(self, event_id: str) -> EventInfo | None:
        """An event by its id (``EnqueueResult.event_id``), from committed storage; None
        if it is unknown, or finished more than the pool's ``keep_finished`` ago.

        Raises:
            EventIdError: not an event id of this pool.
            DamagedRecordError: the event's stored record is damaged.
        """
        ...

    def storage(
        self, *, partition_key: str | None = None, instance: int | None = None
    ) -> StorageView:
        """The stored values (``ctx.storage``) of one instance, read-only: the one
        ``partition_key`` routes to, or ``instance`` (an index). Each read sees what is
        committed when it is made; nothing runs or waits for an instance.

        Raises:
            ConfigurationError: neither or both given, or no such instance.
        """
        ...

    def dead_letters(
        self, index: int | None = None, **filters: Unpack[FilterOptions]
    ) -> list[DeadLetter]:
        """The dead letters of the pool or of one instance, by instance then sequence.

        Read from committed storage; never waits for an instance. Only those that
        match every filter given are returned: ``error`` (text the error contains, or
        a compiled pattern found in it), ``older_than`` (seconds or a timedelta: failed
        before the clock's now minus this), ``partition_key`` (exactly), ``where`` (a
        predicate ``DeadLetter -> bool``, run in the caller's thread).

        Raises:
            FilterError: a bad filter, or ``where`` raised.
        """
        ...

    def redrive(
        self,
        dead_letters: Iterable[DeadLetter] | None = None,
        *,
        index: int | None = None,
        **filters: Unpack[FilterOptions],
    ) -> int:
        """Re-enqueue dead letters on their own instance, as new events; how many (a
        damaged one never is).

        All, or those that match everything given: the records in ``dead_letters``,
        instance ``index``, the filters of :meth:`dead_letters`. One transaction per
        instance.

        Raises:
            FilterError: a bad filter, or ``where`` raised; nothing was redriven.
            ConfigurationError: not DeadLetter records, or an index of no instance.
        """
        ...

    def purge_dead_letters(
        self,
        dead_letters: Iterable[DeadLetter] | None = None,
        *,
        index: int | None = None,
        **filters: Unpack[FilterOptions],
    ) -> int:
        """Delete dead letters chosen as :meth:`redrive` chooses; how many. Counters stay."""
        ...
