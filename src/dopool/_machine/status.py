"""Public records built from stored ones: an instance's status, a dead letter (one rule each)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from dopool._machine.alarm import stalled
from dopool._store.layout import DeadRecord, Meta, Namespace, started_event, unpack
from dopool._types import DeadLetter, InstanceState, InstanceStatus, PoolStatus


def instance_status(
    pool: str, index: int, meta: Meta, crash_streak: int = 0, restart_at: float | None = None
) -> InstanceStatus:
    """An instance's status from its committed meta, and from its mailbox in memory.

    ``state`` is the first of restarting, paused, processing, stalled, backoff, idle.
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
    )


def pool_status(
    name: str, instances: Sequence[InstanceStatus], active: int | None = None
) -> PoolStatus:
    """A pool's status: its instances' counters summed; ``active``: how many run here."""
    return PoolStatus(
        name=name,
        concurrency=len(instances),
        enqueued=sum(s.enqueued for s in instances),
        pending=sum(s.pending for s in instances),
        scheduled=sum(s.scheduled for s in instances),
        processed=sum(s.processed for s in instances),
        succeeded=sum(s.succeeded for s in instances),
        dead_lettered=sum(s.dead_lettered for s in instances),
        drained=sum(s.drained for s in instances),
        instances=list(instances),
        duplicates=sum(s.duplicates for s in instances),
        cancelled=sum(s.cancelled for s in instances),
        expired=sum(s.expired for s in instances),
        schedules=sum(s.schedules for s in instances),
        active=active,
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
    )


def read_pool_status(txn: Any, name: str, concurrency: int) -> PoolStatus:
    """A pool's status as committed, read from outside its runtime (no restart in memory)."""
    instances = [
        instance_status(name, index, Namespace(name, index).load_meta(txn))
        for index in range(concurrency)
    ]
    return pool_status(name, instances)


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
