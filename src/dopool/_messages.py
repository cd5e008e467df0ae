"""The messages actors exchange: one small frozen record per verb."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import pykka

from dopool._storage import OutboxRecord

Reply = pykka.Future[Any]


class Item(NamedTuple):
    """A validated event on its way to an instance."""

    event: bytes  # msgpack-encoded, size-checked
    partition_key: str | None
    priority: int


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Append items atomically (all or none), answering a list of EnqueueResult."""

    items: tuple[Item, ...]
    reply: Reply


@dataclass(frozen=True, slots=True)
class Recover:
    """Sent first to a started instance: settle a crashed attempt, re-arm the alarm.

    ``restarts`` counts the supervisor restarts not yet recorded: more than one
    when an earlier recovery crashed before its write committed.
    """

    reply: Reply | None
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class Kill:
    """Crash now (``runtime.kill`` on an instance that is not inside its handler)."""


@dataclass(frozen=True, slots=True)
class Run:
    """A caller started an attempt on this idle instance: run it (see ``Mailbox.start_run``)."""


@dataclass(frozen=True, slots=True)
class Alarm:
    """The clock says the alarm slot is due."""


@dataclass(frozen=True, slots=True)
class Pause:
    reply: Reply


@dataclass(frozen=True, slots=True)
class Resume:
    reply: Reply


@dataclass(frozen=True, slots=True)
class Drain:
    reply: Reply


@dataclass(frozen=True, slots=True)
class Redrive:
    """Re-enqueue the given dead letters (by sequence), or all when None."""

    sequences: frozenset[int] | None
    reply: Reply


@dataclass(frozen=True, slots=True)
class Purge:
    reply: Reply


@dataclass(frozen=True, slots=True)
class Deliver:
    """Source instance → target: a follow-up from the source's outbox."""

    source: int
    oseq: int
    record: OutboxRecord


@dataclass(frozen=True, slots=True)
class Delivered:
    """Target → source: the follow-up ``oseq`` is durable in the target's queue."""

    oseq: int
