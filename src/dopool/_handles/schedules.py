"""Recurring schedules as callers see them: a definition checked before anything is
stored, and the schedules read from committed state.

:class:`~dopool.WorkerPool` and :class:`~dopool.ProducerPool` share both: a definition
is checked here (name, ``every`` or ``cron``, the event as an enqueue checks it), then
stored by instance 0's transition (:mod:`dopool._machine.recurring`), through its actor or a
producer's transaction.
"""

from __future__ import annotations

import math
from contextlib import suppress
from datetime import timedelta
from typing import Any

from dopool._engine.options import Schema
from dopool._errors import DamagedRecordError, ScheduleDefinitionError
from dopool._machine.recurring import cron_problem
from dopool._machine.validation import prepare
from dopool._pools import ScheduleOptions
from dopool._store.layout import (
    MIN_EVERY,
    PER_KEY,
    Namespace,
    ScheduleBook,
    ScheduleRecord,
    unpack,
)
from dopool._store.txn import Txn
from dopool._types import ScheduleInfo

#: The longest schedule name, in characters.
MAX_NAME = 200


def definition(
    name: Any, event: Any, options: ScheduleOptions, schema: Schema | None, concurrency: int
) -> ScheduleRecord:
    """A schedule's definition for a pool of ``concurrency``, checked, as the record to
    store (no fire time yet).

    Raises:
        ScheduleDefinitionError: a bad name, not exactly one of ``every`` and ``cron``,
            an ``every`` that is not seconds > 0, a bad cron expression, no partition key
            for a pool with an instance per key.
        EventValidationError, EventTooLargeError: the event or its partition key, as
            an enqueue's (the pool's ``schema`` applies).
    """
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not name.isprintable():
        reason = f"a name is 1-{MAX_NAME} printable characters (str.isprintable)"
        raise ScheduleDefinitionError(schedule=name, argument="name", value=name, reason=reason)
    unknown = set(options) - set(ScheduleOptions.__annotations__)
    if unknown:
        raise TypeError(f"schedule() got unexpected keyword arguments: {sorted(unknown)}")
    every, cron = options.get("every"), options.get("cron")
    partition_key, priority = options.get("partition_key"), options.get("priority", 0)
    if (every is None) == (cron is None):
        raise ScheduleDefinitionError(
            schedule=name, argument="every", value=every, reason="give every or cron, not both"
        )
    seconds = None if every is None else _every(name, every)
    if cron is not None:
        problem = "not a str" if not isinstance(cron, str) else cron_problem(cron)
        if problem is not None:
            raise ScheduleDefinitionError(
                schedule=name, argument="cron", value=cron, reason=problem
            )
    if partition_key is None and concurrency == PER_KEY:
        raise ScheduleDefinitionError(
            schedule=name,
            argument="partition_key",
            value=None,
            reason="the pool has an instance per partition key: its events need one",
        )
    item = prepare(event, partition_key=partition_key, priority=priority, schema=schema)
    return ScheduleRecord(name, item.event, seconds, cron, partition_key, priority, None)


def _every(name: str, every: Any) -> float:
    if isinstance(every, timedelta):
        seconds = every.total_seconds()
    elif isinstance(every, bool) or not isinstance(every, int | float):
        raise ScheduleDefinitionError(
            schedule=name, argument="every", value=every, reason="not seconds or a timedelta"
        )
    else:
        try:
            seconds = float(every)
        except OverflowError:
            seconds = math.inf
    if not (math.isfinite(seconds) and seconds >= MIN_EVERY):
        raise ScheduleDefinitionError(
            schedule=name,
            argument="every",
            value=every,
            reason=f"every is finite seconds, at least {MIN_EVERY:g}",
        )
    return seconds


def schedule_info(record: ScheduleRecord) -> ScheduleInfo:
    """The public record of a stored schedule; its event as stored bytes if it does not
    decode."""
    event: Any = record.event
    with suppress(Exception):
        event = unpack(record.event)
    return ScheduleInfo(
        name=record.name,
        event=event,
        every=record.every,
        cron=record.cron,
        partition_key=record.partition_key,
        priority=record.priority,
        next_at=record.next_at,
        fired=record.fired,
        last_fired_at=record.last_fired_at,
        coalesced=record.coalesced,
    )


def read_schedules(txn: Txn, pool: str) -> list[ScheduleInfo]:
    """A pool's schedules as committed, sorted by name.

    Raises:
        DamagedRecordError: a schedule's record is damaged.
    """
    infos = []
    for record in ScheduleBook(Namespace(pool, 0)).records(txn):
        if isinstance(record, DamagedRecordError):
            raise record
        infos.append(schedule_info(record))
    return sorted(infos, key=lambda info: info.name)
