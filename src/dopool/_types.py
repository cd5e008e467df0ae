"""Plain result records returned by the public API."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Literal

InstanceState = Literal[
    "restarting", "paused", "processing", "stalled", "backoff", "throttled", "idle"
]

EventKind = Literal[
    "enqueued",
    "started",
    "succeeded",
    "retry_scheduled",
    "dead_lettered",
    "alarm_given_up",
    "crashed",
    "restart_delayed",
    "recovered",
    "activated",
    "evicted",
    "paused",
    "resumed",
    "drained",
    "empty",
    "cancelled",
]

#: An event's state, as :class:`EventInfo` reports it (docs/api.md's order of checks).
EventState = Literal[
    "scheduled",
    "pending",
    "running",
    "backoff",
    "succeeded",
    "dead_lettered",
    "cancelled",
    "expired",
    "drained",
]


@dataclass(frozen=True, slots=True, init=False)
class EnqueueResult:
    """Where an accepted event went. ``position`` 0 means it runs next.

    ``duplicate``: the enqueue's dedup key was held, so nothing was stored; the other
    fields are those of the event that holds it (``position`` as its own enqueue
    answered it, or 0 once it finished).
    """

    sequence: int
    instance_index: int
    instance_id: str
    position: int
    duplicate: bool = False

    def __init__(
        self,
        sequence: int,
        instance_index: int,
        instance_id: str,
        position: int,
        duplicate: bool = False,
    ) -> None:
        # One per event enqueued: its slots set directly, as PoolEvent's are.
        _set_result_sequence(self, sequence)
        _set_result_index(self, instance_index)
        _set_result_id(self, instance_id)
        _set_result_position(self, position)
        _set_result_duplicate(self, duplicate)

    @property
    def event_id(self) -> str:
        """The event's id, unique within its store and stable: treat it as opaque."""
        return f"{self.instance_id}:{self.sequence}"


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """Committed state of one instance. Counters are lifetime totals."""

    index: int
    instance_id: str
    state: InstanceState
    enqueued: int
    pending: int
    scheduled: int  # of ``pending``, the events not due yet
    processed: int
    succeeded: int
    dead_lettered: int
    drained: int
    current_sequence: int | None
    attempt: int
    next_alarm_at: float | None
    restarts: int
    crash_streak: int = 0
    restart_at: float | None = None
    duplicates: int = 0  # enqueues routed here that a dedup key answered, storing nothing
    cancelled: int = 0
    expired: int = 0  # of ``dead_lettered``, the events not started within their ttl
    schedules: int = 0  # recurring schedules stored here (instance 0's only)
    key: str | None = None  # a per-key pool's instance: its partition key
    stored: int = 0  # values in its own storage (``ctx.storage``)
    dead_letters_held: int = 0  # of ``dead_lettered``, those held now (not redriven, purged)
    # When the event at the head of its queue fell due (the one running or in backoff, or
    # the next to start); None with no event due. The clock's time, as next_alarm_at.
    head_due_at: float | None = None


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """Committed state of a pool: the sums of its instances' counters, and the status of
    the instances listed (those ever used, or those ``status(instances=, limit=)`` chose
    among them), by index."""

    name: str
    concurrency: int
    enqueued: int
    pending: int
    scheduled: int  # of ``pending``, the events not due yet
    processed: int
    succeeded: int
    dead_lettered: int
    drained: int
    instances: list[InstanceStatus]
    duplicates: int = 0  # enqueues that a dedup key answered, storing nothing
    cancelled: int = 0
    expired: int = 0  # of ``dead_lettered``, the events not started within their ttl
    schedules: int = 0  # recurring schedules (``pool.schedules()``)
    stored: int = 0  # values in its instances' own storage (``ctx.storage``)
    dead_letters_held: int = 0  # dead letters held now (not redriven nor purged)
    # The earliest ``head_due_at`` of its instances: how long its most delayed queue's
    # head has been due (None: no event due anywhere).
    head_due_at: float | None = None
    used: int = 0  # instances ever used (any record stored), listed or not
    # Paused as a whole (``pause()``, no ``resume()`` since): an instance never used is paused.
    paused: bool = False
    # Instances running in this runtime (started, not evicted); None when read from the
    # store alone (a producer's ``status()``, ``dopool status``). The runtime's memory, not
    # committed state: two statuses of the same committed state compare equal.
    active: int | None = field(default=None, compare=False)
    # Instances waiting in line for one of the runtime's slots (``Runtime(max_active=)``);
    # None when read from the store alone. Memory too, not compared.
    waiting: int | None = field(default=None, compare=False)

    def instance(self, index: int) -> InstanceStatus:
        """Instance ``index``'s status: as listed, or, for one not listed, that of an
        instance never used (idle, or paused if the pool is, every counter 0). So it is
        exact for a status that lists every instance ever used (``status()`` with neither
        ``instances`` nor ``limit``)."""
        listed = self.instances
        at = bisect.bisect_left(listed, index, key=_index_of)
        if at < len(listed) and listed[at].index == index:
            return listed[at]
        return InstanceStatus(
            index=index,
            instance_id=f"{self.name}:{index}",
            state="paused" if self.paused else "idle",
            enqueued=0,
            pending=0,
            scheduled=0,
            processed=0,
            succeeded=0,
            dead_lettered=0,
            drained=0,
            current_sequence=None,
            attempt=0,
            next_alarm_at=None,
            restarts=0,
        )


def _index_of(status: InstanceStatus) -> int:
    return status.index


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A recurring schedule, as committed (``pool.schedule``, ``pool.schedules``).

    Exactly one of ``every`` (seconds) and ``cron`` (a 5-field expression, UTC) is set.
    ``next_at`` is the next fire time on the runtime's clock (None: a cron expression
    with no time left); ``fired`` counts the occurrences enqueued, ``coalesced`` the
    fire times that passed while it could not fire (folded into the next occurrence);
    ``last_fired_at`` is when the last occurrence was enqueued. ``event`` is the stored
    bytes when they do not decode.
    """

    name: str
    event: Any
    every: float | None
    cron: str | None
    partition_key: str | None
    priority: int
    next_at: float | None
    fired: int
    last_fired_at: float | None
    coalesced: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event that exhausted its attempts or failed permanently.

    ``event`` is the stored bytes when the event does not decode; ``damaged``
    marks a record that failed its checksum or layout (never redriven).
    """

    sequence: int
    instance_index: int
    event: Any
    error: str
    attempts: int
    enqueued_at: float
    failed_at: float
    partition_key: str | None
    priority: int = 0
    damaged: bool = False
    dedup_key: str | None = None
    traceback: str | None = None  # the last failure's, as Python printed it (cut: its end)


@dataclass(frozen=True, slots=True)
class EventInfo:
    """One event, from committed storage (``pool.event``): unfinished, or finished and
    remembered (``keep_finished``), or dead-lettered and still held.

    ``due`` is when it was due to start (None for a dead letter not remembered);
    ``started_at`` when its last attempt started; ``retry_at`` when a retry in backoff
    is due; ``error`` its last failure; ``attempts`` the attempts started.
    """

    event_id: str
    pool: str
    instance_index: int
    sequence: int
    state: EventState
    attempts: int
    enqueued_at: float
    due: float | None
    started_at: float | None
    finished_at: float | None
    retry_at: float | None
    error: str | None
    partition_key: str | None
    priority: int
    dedup_key: str | None
    traceback: str | None = None  # the last failure's, while in backoff or dead-lettered


#: What came of an attempt (:class:`Outcome`).
OutcomeState = Literal["succeeded", "retried", "dead_lettered"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What came of an attempt, committed: what a middleware's ``after`` is given.

    ``state`` is ``succeeded``, ``retried`` (it waits for a retry at ``retry_at``) or
    ``dead_lettered``; ``error`` the failure as recorded (None for a success);
    ``duration`` the clock's seconds from the attempt's start to its outcome.
    """

    state: OutcomeState
    error: str | None
    retry_at: float | None
    duration: float


@dataclass(frozen=True, slots=True)
class EmptyInfo:
    """Passed to ``on_empty`` when an instance's last pending event was processed."""

    pool_name: str
    instance_index: int
    instance_id: str
    processed: int


@dataclass(frozen=True, slots=True, init=False)
class PoolEvent:
    """One observable step of a pool, delivered to subscribers and to the trace."""

    kind: EventKind
    pool: str
    instance_index: int
    sequence: int | None = None
    attempt: int | None = None
    time: float = 0.0
    error: str | None = None
    due: float | None = None  # an ``enqueued`` event not due when stored: its due time
    # An attempt's outcome whose handler used ``ctx.storage``: the rows it read, and
    # (a success) the rows committed with it, as Cloudflare bills them (StorageRows).
    rows_read: int | None = None
    rows_written: int | None = None

    def __init__(
        self,
        kind: EventKind,
        pool: str,
        instance_index: int,
        sequence: int | None = None,
        attempt: int | None = None,
        time: float = 0.0,
        error: str | None = None,
        due: float | None = None,
        rows_read: int | None = None,
        rows_written: int | None = None,
    ) -> None:
        # The dataclass's own __init__ for a frozen class sets each field through
        # object.__setattr__, twice the cost of setting the slots directly, and
        # an engine makes a few of these per event.
        _set_kind(self, kind)
        _set_pool(self, pool)
        _set_index(self, instance_index)
        _set_sequence(self, sequence)
        _set_attempt(self, attempt)
        _set_time(self, time)
        _set_error(self, error)
        _set_due(self, due)
        _set_rows_read(self, rows_read)
        _set_rows_written(self, rows_written)

    def to_json_dict(self) -> dict[str, Any]:
        """The fields as a dict, in declaration order, for the JSON-lines trace: ``due``,
        ``rows_read`` and ``rows_written`` only where they are set."""
        fields = {
            "kind": self.kind,
            "pool": self.pool,
            "instance_index": self.instance_index,
            "sequence": self.sequence,
            "attempt": self.attempt,
            "time": self.time,
            "error": self.error,
        }
        if self.due is not None:
            fields["due"] = self.due
        if self.rows_read is not None:
            fields["rows_read"] = self.rows_read
        if self.rows_written is not None:
            fields["rows_written"] = self.rows_written
        return fields


# Each field's slot, set directly (see PoolEvent.__init__).
(
    _set_result_sequence,
    _set_result_index,
    _set_result_id,
    _set_result_position,
    _set_result_duplicate,
) = (
    EnqueueResult.__dict__[name].__set__
    for name in ("sequence", "instance_index", "instance_id", "position", "duplicate")
)
(
    _set_kind,
    _set_pool,
    _set_index,
    _set_sequence,
    _set_attempt,
    _set_time,
    _set_error,
    _set_due,
    _set_rows_read,
    _set_rows_written,
) = (
    PoolEvent.__dict__[name].__set__
    for name in (
        *("kind", "pool", "instance_index", "sequence", "attempt", "time", "error", "due"),
        *("rows_read", "rows_written"),
    )
)
