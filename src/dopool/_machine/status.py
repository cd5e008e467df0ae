"""Public records built from stored ones: an instance's status, a dead letter (one rule each)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import Any, NamedTuple

from dopool._errors import ConfigurationError, shown
from dopool._machine.alarm import stalled
from dopool._store.layout import (
    DeadRecord,
    Meta,
    Namespace,
    pool_paused,
    queue_key_due,
    started_event,
    unpack,
    used_instances,
)
from dopool._types import DeadLetter, InstanceState, InstanceStatus, PoolStatus


def instance_status(
    pool: str,
    index: int,
    meta: Meta,
    crash_streak: int = 0,
    restart_at: float | None = None,
    head: bytes | None = None,
) -> InstanceStatus:
    """An instance's status from its committed meta, and from its mailbox in memory;
    ``head``: the first key of its queue, if an event is due and none has started.

    ``state`` is the first of restarting, paused, processing, stalled, backoff, throttled,
    idle.
    """
    state: InstanceState
    started = started_event(meta.current)  # (priority, sequence)
    if restart_at is not None:
        state = "restarting"
    elif meta.paused:
        state = "paused"
    elif meta.running:
        state = "processing"
    elif stalled(meta):
        state = "stalled"  # its alarm was given up: nothing starts, not even a retry
    elif meta.current is not None and meta.retry_at is not None:
        state = "backoff"
    elif meta.throttled_until is not None and meta.pending > meta.scheduled:
        state = "throttled"  # due work waits for a token of the pool's rate limit
    else:
        state = "idle"
    return InstanceStatus(
        index=index,
        instance_id=f"{pool}:{index}",
        state=state,
        enqueued=meta.enqueued,
        pending=meta.pending,
        scheduled=meta.scheduled,
        processed=meta.succeeded + meta.dead_lettered,
        succeeded=meta.succeeded,
        dead_lettered=meta.dead_lettered,
        drained=meta.drained,
        current_sequence=None if started is None else started[1],
        attempt=meta.attempt,
        next_alarm_at=meta.alarm,
        restarts=meta.restarts,
        crash_streak=crash_streak,
        restart_at=restart_at,
        duplicates=meta.duplicates,
        cancelled=meta.cancelled,
        expired=meta.expired,
        schedules=meta.schedules,
        key=meta.key,
        stored=meta.stored,
        dead_letters_held=meta.held_dead_letters,
        head_due_at=_due(meta.current if meta.current is not None else head),
    )


def _due(key: bytes | None) -> float | None:
    """When the event under queue key ``key`` fell due (None: no key, or a key migrated
    from format 2, whose due time is unknown)."""
    if key is None:
        return None
    due = queue_key_due(key)
    return due if math.isfinite(due) else None


#: The counters of :class:`InstanceStatus` that a :class:`PoolStatus` sums.
_SUMMED = (
    "enqueued",
    "pending",
    "scheduled",
    "processed",
    "succeeded",
    "dead_lettered",
    "drained",
    "duplicates",
    "cancelled",
    "expired",
    "schedules",
    "stored",
    "dead_letters_held",
)

_NO_RESTART = (0, None)  # the restart state of an instance not running: none


class Listing(NamedTuple):
    """Which instances a pool's status lists (``status(instances=, limit=)``): those ever
    used among ``instances`` (None: all of them), by index, at most ``limit`` (None: no
    bound). The sums are over the whole pool whatever is listed."""

    instances: Iterable[int] | None = None
    limit: int | None = None

    def check(self, concurrency: int) -> Listing:
        """This listing, its values checked against a pool of ``concurrency``.

        Raises:
            ConfigurationError: ``limit`` not an int >= 0; ``instances`` not an iterable
                of instance indices of the pool (a ``range`` is taken as it is).
        """
        limit, chosen = self.limit, self.instances
        if limit is not None and (not _count(limit)):
            raise ConfigurationError(f"limit must be an int >= 0 or None, got {shown(limit)}")
        if chosen is None or isinstance(chosen, range):
            return self
        if isinstance(chosen, str | bytes) or not isinstance(chosen, Iterable):
            raise ConfigurationError(
                f"instances must be a range or an iterable of instance indices, got {shown(chosen)}"
            )
        picked = frozenset(chosen)
        for index in picked:
            if not _count(index) or index >= concurrency:
                raise ConfigurationError(
                    f"instances names {shown(index)}, which is no instance of a pool of "
                    f"{concurrency} (0 to {concurrency - 1})"
                )
        return Listing(picked, limit)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_pool_status(
    txn: Any,
    name: str,
    concurrency: int,
    listing: Listing = Listing(),  # noqa: B008  (immutable)
    restarts: Mapping[int, tuple[int, float | None]] | None = None,
    active: int | None = None,
    waiting: int | None = None,
) -> PoolStatus:
    """A pool's status as committed: the counters of every instance ever used, summed (one
    meta read each; an instance never used counts nothing), and those ``listing`` chooses.
    ``restarts``: the crash streak and restart time of the instances running, by index,
    from the runtime's memory (none when read from outside it); ``active``: how many run
    here, ``waiting``: how many wait for a slot to."""
    restarts = restarts or {}
    used = used_instances(txn, name)
    chosen, limit = listing.instances, listing.limit
    rows: list[InstanceStatus] = []
    sums = dict.fromkeys(_SUMMED, 0)
    heads: list[float] = []
    for index in used:
        restart = restarts.get(index, _NO_RESTART)
        ns = Namespace(name, index)
        meta = ns.load_meta(txn)
        due = meta.current is None and meta.pending > meta.scheduled
        head = ns.first_queue_key(txn) if due else None  # (one seek, no record read)
        status = instance_status(name, index, meta, *restart, head=head)
        for counter in _SUMMED:
            sums[counter] += getattr(status, counter)
        if status.head_due_at is not None:
            heads.append(status.head_due_at)
        if (chosen is None or index in chosen) and (limit is None or len(rows) < limit):
            rows.append(status)
    return PoolStatus(
        name=name,
        concurrency=concurrency,
        instances=rows,
        used=len(used),
        paused=pool_paused(txn, name),
        active=active,
        waiting=waiting,
        head_due_at=min(heads, default=None),
        **sums,
    )


def dead_letter_from_record(index: int, sequence: int, dead: DeadRecord) -> DeadLetter:
    """The public record of a dead letter; its event as stored bytes if it does not decode."""
    event: Any = dead.event
    if not dead.damaged:
        with suppress(Exception):
            event = unpack(dead.event)
    return DeadLetter(
        sequence=sequence,
        instance_index=index,
        event=event,
        error=dead.error,
        attempts=dead.attempts,
        enqueued_at=dead.enqueued_at,
        failed_at=dead.failed_at,
        partition_key=dead.partition_key,
        priority=dead.priority,
        damaged=dead.damaged,
        dedup_key=dead.dedup_key,
        traceback=dead.traceback,
    )


def position(meta: Meta, priority: int) -> int:
    """How many events due now will run before a new one of ``priority``.

    Exact for an event due now; for a scheduled one a lower bound (these run before
    it, and others may fall due or arrive ahead of it meanwhile).
    """
    counts = meta.priorities
    if not counts:
        return 0  # nothing pending
    if len(counts) == 1 and priority in counts:
        return counts[priority]  # all pending are of this level, the started one too
    ahead = sum(count for level, count in counts.items() if level >= priority)
    started = started_event(meta.current)  # (priority, sequence)
    if started is not None and started[0] < priority:
        ahead += 1  # the started event keeps its place whatever its priority
    return ahead
