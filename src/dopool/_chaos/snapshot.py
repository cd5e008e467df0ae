"""Committed storage as the checker reads it: each instance's state and the events it holds."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dopool._machine.invariants import InstanceState, counter_violations, read_instance
from dopool._store.layout import (
    Meta,
    Namespace,
    delayed_key_due,
    delayed_key_priority,
    queue_key_priority,
    queue_key_sequence,
    unpack,
)
from dopool._store.txn import Txn


@dataclass
class InstanceSnapshot:
    """One instance's committed state, read in one transaction.

    ``state`` is what the storage invariants read (:mod:`dopool._machine.invariants`); the
    rest is the checker's own: which event each pending entry (due or scheduled) and dead
    letter holds, and when each scheduled one is due.
    """

    state: InstanceState
    queue: dict[int, tuple[int, str | None]]  # sequence -> (priority, id)
    dead: dict[int, tuple[str | None, int]]  # sequence -> (id, attempts)
    bad_keys: list[str]
    scheduled: dict[int, float]  # sequence -> due time, of those not moved into the queue
    stored: bool  # its meta is (the instance was used)
    counted: list[str]  # its handler's success counter against its meta (guarantee 6)

    @property
    def meta(self) -> Meta:
        return self.state.meta


def read_store(txn: Txn, pool: str, indices: Iterable[int]) -> dict[int, InstanceSnapshot]:
    """Read the state of the instances ``indices`` of ``pool``, and the events each holds,
    in one read transaction, by index."""
    snapshots = {}
    for index in indices:
        ns = Namespace(pool, index)
        queue: dict[int, tuple[int, str | None]] = {}
        scheduled: dict[int, float] = {}
        bad: list[str] = []
        keys = [(key, queue_key_priority(key)) for key in ns.iter_event_keys(txn)]
        for key in ns.iter_delayed_keys(txn):
            keys.append((key, delayed_key_priority(key)))
            scheduled[queue_key_sequence(key)] = delayed_key_due(key)
        for key, priority in keys:
            record = ns.get_event(txn, key)
            sequence = queue_key_sequence(key)
            if record is None:
                bad.append(f"queue key for sequence {sequence} has no record")
                continue
            if priority != record.priority:
                bad.append(f"queue key for sequence {sequence} has the wrong priority")
            queue[sequence] = (record.priority, _event_id(unpack(record.event)))
        dead = {
            sequence: (_event_id(unpack(record.event)), record.attempts)
            for sequence, record in ns.iter_dead_letters(txn)
        }
        state = read_instance(txn, pool, index)
        snapshots[index] = InstanceSnapshot(
            state=state,
            queue=queue,
            dead=dead,
            bad_keys=bad,
            scheduled=scheduled,
            stored=ns.meta_bytes(txn) is not None,
            counted=counter_violations(txn, pool, index, state.meta),
        )
    return snapshots


def _event_id(event: Any) -> str | None:
    return event.get("id") if isinstance(event, dict) else None


def stored_id(txn: Txn, pool: str, index: int, sequence: int) -> str | None:
    """The id of the event pending at ``sequence`` of instance ``index`` of ``pool`` (due
    or scheduled), None if none is."""
    ns = Namespace(pool, index)
    for key in [*ns.iter_event_keys(txn), *ns.iter_delayed_keys(txn)]:
        if queue_key_sequence(key) == sequence:
            record = ns.get_event(txn, key)
            return None if record is None else _event_id(unpack(record.event))
    return None
