"""The argument a handler receives."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dopool import tracing
from dopool._engine.storage import Storage, Writes
from dopool._errors import ConfigurationError, as_seconds, shown
from dopool._machine.followups import FollowUp, Target
from dopool._machine.types import Item, StorageRows
from dopool._machine.validation import due_time
from dopool._pools import Pool


@dataclass(slots=True, kw_only=True)
class EventContext:
    """The event being executed and what the handler may do from inside it.

    Attributes:
        event: the decoded event (tuples come back as lists).
        sequence: its sequence on this instance, consecutive from 0.
        attempt: 1 for the first execution.
        is_retry: ``attempt > 1``.
        enqueued_at, started_at: clock times (virtual under a simulated clock).
        storage: the instance's own storage (:class:`~dopool.Storage`): its writes
            commit with this event's success and are discarded if the attempt fails.
    """

    event: Any
    sequence: int
    attempt: int
    enqueued_at: float
    started_at: float
    instance_index: int
    instance_id: str
    pool_name: str
    partition_key: str | None
    priority: int
    _prepare: Callable[[Any, str | None, int], Item] = field(repr=False)
    _sleep: Callable[[float], None] = field(repr=False)
    # The pool ``ctx.enqueue(pool=...)`` names, or None for this one (raises if none).
    _target: Callable[[object], Target | None] = field(repr=False)
    _now: Callable[[], float] = field(repr=False)  # the clock's now (a not_before's limit)
    _open_storage: Callable[[], Storage] = field(repr=False)  # made on first use
    _storage: Storage | None = field(default=None, repr=False)
    _follow_ups: list[FollowUp] = field(default_factory=list, repr=False)
    _wall: bool = field(default=False, repr=False)  # the clock reads wall time
    _async: bool = field(default=False, repr=False)  # the handler is an async def
    _ended: bool = field(default=False, repr=False)  # the attempt's outcome is being settled

    @property
    def is_retry(self) -> bool:
        return self.attempt > 1

    @property
    def storage(self) -> Storage:
        storage = self._storage
        if storage is None:
            storage = self._storage = self._open_storage()
            if self._ended:
                storage._end()  # read-only now, as any context's after its attempt
        return storage

    def enqueue(
        self,
        event: Any,
        *,
        partition_key: str | None = None,
        priority: int = 0,
        delay: float | timedelta | None = None,
        not_before: float | datetime | None = None,
        pool: str | Pool | None = None,
    ) -> None:
        """Add a follow-up event to this pool, or to ``pool`` (a name or a
        :class:`~dopool.WorkerPool` of this runtime; a ``ProducerPool`` is refused).

        It is validated now, with that pool's schema, becomes durable in the same
        transaction that completes this event, and is discarded if this attempt
        fails. It is routed by that pool's router when it commits. Follow-ups are
        delivered at least once and are never refused by ``max_queue_depth``.
        ``delay`` counts from the commit of this event's success (that transaction's
        clock time); ``not_before`` is a clock time, as ``WorkerPool.enqueue``'s. It is
        due then, wherever it is delivered; delivered later, it is due at once.

        Raises:
            ConfigurationError: ``pool`` is not defined in this runtime, or is a
                WorkerPool of another runtime; the attempt has ended.
            EventValidationError, EventTooLargeError, ScheduleError: as ``WorkerPool.enqueue``.
        """
        self._check_running("enqueue")
        due = None
        if not_before is not None:  # a clock time: at most MAX_DELAY after now
            due = due_time(delay, not_before, now=self._now, wall=self._wall)
        elif delay is not None:
            due = due_time(delay, None, now=_zero, wall=self._wall)
        target = None if pool is None else self._target(pool)
        prepare = self._prepare if target is None else target.prepare
        item = prepare(event, partition_key, priority)
        if due is not None:  # a delay: seconds from the commit, which sets the due time
            item = item._replace(delay=due) if delay is not None else item._replace(due=due)
        if tracing.instrumented():  # the attempt's span is the follow-up's parent
            item = item._replace(trace=tracing.carrier())
        self._follow_ups.append((item, target))

    def sleep(self, seconds: float | timedelta) -> None:
        """Wait ``seconds`` (or a timedelta) of clock time: real time, or virtual under a
        simulated clock; zero or less returns at once.

        Raises:
            ConfigurationError: not seconds, or not finite (NaN would never wake, and
                infinity would move a simulated clock to it); the attempt has ended; the
                handler is an ``async def`` (it would block every handler on its loop:
                ``await ctx.sleep_async(...)``).
        """
        if self._async:
            raise ConfigurationError(
                f"ctx.sleep called from the async handler of {self.instance_id}: it would "
                "block the event loop every async handler runs on; await ctx.sleep_async(...)"
            )
        self._sleep(self._seconds(seconds, "sleep"))

    async def sleep_async(self, seconds: float | timedelta) -> None:
        """``ctx.sleep`` for an ``async def`` handler: awaits ``asyncio.sleep``, which runs in
        the clock's time on the loop the handler runs on (virtual under a simulated clock).

        Raises:
            ConfigurationError: as ``ctx.sleep``'s, but for an async handler.
        """
        await asyncio.sleep(self._seconds(seconds, "sleep_async"))

    def _seconds(self, seconds: float | timedelta, verb: str) -> float:
        """``seconds`` checked, as a float, for ``ctx.sleep``."""
        if self._ended:
            self._check_running(verb)
        if type(seconds) is not float or not math.isfinite(seconds):  # (a float passes here)
            value = as_seconds(seconds, f"ctx.{verb}")
            if not math.isfinite(value):
                raise ConfigurationError(f"ctx.{verb} needs a finite time, got {shown(seconds)}")
            seconds = value
        return seconds

    def _end(self) -> tuple[list[FollowUp], Writes, StorageRows | None]:
        """End the attempt (its handler returned): its follow-ups and storage writes, which
        no call adds to now, and what it did with the storage (None: it never used it)."""
        self._ended = True
        storage = self._storage
        if storage is None:
            return self._follow_ups, {}, None
        return self._follow_ups, storage._end(), storage._rows()

    def _check_running(self, verb: str) -> None:
        if self._ended:
            raise ConfigurationError(
                f"ctx.{verb} called after the attempt it belongs to ended (event "
                f"{self.sequence} of {self.instance_id}, attempt {self.attempt}): its "
                "follow-ups were committed or discarded with its outcome; a context is "
                "for its handler's own call only"
            )


def _zero() -> float:
    """The time a follow-up's delay counts from, until its commit gives the real one."""
    return 0.0
