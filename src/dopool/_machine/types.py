"""What the queue machine's transitions take and give, as data.

The engine's messages carry these, and its shell reads them, without importing the
machine itself: an :class:`Item` to store, a :class:`Request` (one caller's
transition: pause, resume, drain, redrive, purge, cancel, a recurring schedule
defined or removed, made by :meth:`QueueMachine.control
<dopool._machine.machine.QueueMachine.control>`), the :class:`Effects` a
transaction must publish once it commits, and what a started attempt hands over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from dopool._errors import DopoolError
from dopool._rates import RateLimit
from dopool._retry import RetryPolicy
from dopool._store.layout import EventRecord, OutboxRecord, ScheduleRecord
from dopool._types import DeadLetter, EnqueueResult, PoolEvent


class Item(NamedTuple):
    """A validated event on its way to an instance."""

    event: bytes  # msgpack-encoded, size-checked
    partition_key: str | None
    priority: int
    due: float | None = None  # not to run before this clock time (None: at once)
    dedup_key: str | None = None  # stored once per pool while it is held (see .dedup)
    ttl: float | None = None  # seconds from its enqueue to start it in, or it expires
    delay: float | None = None  # a follow-up's: seconds after its outcome commits (then ``due``)
    trace: dict[str, str] | None = None  # the enqueuer's trace context (dopool.tracing)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueRules:
    """What the machine reads of a pool's options (``PoolOptions.rules``, checked there)."""

    retry: RetryPolicy | None = None
    max_queue_depth: int | None = None
    alarm_retries: int | None = None
    dedup_window: float = 0.0
    keep_finished: float = 0.0  # seconds a finished event stays known to ``event()``
    per_key: bool = False  # an instance per partition key: its meta keeps the key
    rate_limit: RateLimit | None = None  # the attempts the pool may start, all together
    rate_limit_per_key: RateLimit | None = None  # and those of each partition key

    @property
    def max_attempts(self) -> int:
        """Executions an event gets at most: one without a retry policy."""
        return 1 if self.retry is None else self.retry.max_attempts


class StorageRows(NamedTuple):
    """What an attempt's handler did with its instance's storage, in rows as Cloudflare
    bills a Durable Object's storage: read, each key a get or get_many asked for and each
    value a list returned (at least one a call); written, each key a put, put_many or
    delete named. The simulator's cost model sums them (docs/simulate.md, "What a design
    costs")."""

    read: int
    written: int


# What a transition that started an attempt hands to the code that executes it.
Started = tuple[bytes, EventRecord, int, float]  # queue key, record, attempt, started_at
Batches = Iterable[tuple[Any, tuple[Item, ...]]]  # (the caller's token, its items) each
# Called at each fault point inside a transition: raises to crash the instance there.
FaultPoint = Callable[[str, str], None]


class Effects:
    """What a committed transaction must tell the world, in order."""

    __slots__ = ("answers", "dead", "deliveries", "empty", "events")

    def __init__(self) -> None:
        # (token, answer) per batch accept() took: its results, or why it was refused
        self.answers: list[tuple[Any, list[EnqueueResult] | DopoolError]] = []
        self.events: list[PoolEvent] = []
        self.dead: list[DeadLetter] = []
        self.deliveries: list[tuple[int, OutboxRecord]] = []
        # The last pending event was processed: where in ``events`` that happened (its
        # ``empty`` goes there, before what the same transaction enqueued after it).
        self.empty: int | None = None


# -- a caller's requests: each one transition, answered with its result --------------------


@dataclass(frozen=True, slots=True)
class Pause:
    """Start nothing more; enqueues are still accepted. Answers nothing."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Undo a pause. Answers nothing."""


@dataclass(frozen=True, slots=True)
class Drain:
    """Remove every pending event, answering how many."""


@dataclass(frozen=True, slots=True)
class Redrive:
    """Re-enqueue the given dead letters (by sequence), or all when None, answering how many."""

    sequences: frozenset[int] | None


@dataclass(frozen=True, slots=True)
class Purge:
    """Delete the given dead letters (by sequence), or all when None, answering how many."""

    sequences: frozenset[int] | None


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel event ``sequence`` unless it is running or finished, answering whether it was."""

    sequence: int


@dataclass(frozen=True, slots=True)
class DefineSchedule:
    """Store a recurring schedule (instance 0's), answering the record stored."""

    spec: ScheduleRecord


@dataclass(frozen=True, slots=True)
class Unschedule:
    """Remove a recurring schedule (instance 0's), answering whether there was one."""

    name: str


Request = Pause | Resume | Drain | Redrive | Purge | Cancel | DefineSchedule | Unschedule
