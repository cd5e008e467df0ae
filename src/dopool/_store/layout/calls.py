"""Producers' calls stored by an owner: each one's answer, kept until its producer is done.

A producer (``dopool.connect``) sends an enqueue to the process that serves its instance,
which stores it in a transaction of its own (``_engine/owner_calls.py``). When the answer
does not come back (the owner died after its commit, the connection broke, the wait ran
out), the producer stores the call itself, and must not store it twice. So every
transaction that stores such a call, the owner's or the producer's, looks for the call's
record first and answers from it if there is one, and otherwise writes it beside the
events: ``C <producer:16> <call:8>``, holding when and the answer. Whichever comes second
finds the first's record: LMDB runs one write transaction at a time.

Each later call of the producer carries the number below which it needs none of its
records any more, and the transaction that stores it deletes those (:func:`forget_calls`);
the records of a producer that died are swept once older than :data:`RETAIN` seconds
(:func:`sweep_calls`). A producer stopped longer than that in the middle of a call could
store it twice: docs/guarantees.md says so.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from dopool._errors import DamagedRecordError
from dopool._store.layout.keys import PRODUCER_ID_BYTES, call_key, call_prefix
from dopool._store.layout.namespace import _iter_prefix
from dopool._store.layout.records import (
    Layout,
    _count,
    _flag,
    _instance,
    _laid_out,
    _time,
    pack,
    seal,
)
from dopool._store.txn import Txn
from dopool._types import EnqueueResult

#: Seconds a call record outlives its producer's last word on it.
RETAIN = 3600.0
#: The stale call records one sweep removes at most.
SWEEP = 64


class CallRecord(NamedTuple):
    """A producer's call as stored: when, and each event's ``(instance, sequence,
    position, duplicate)``, in the order of the call's events."""

    at: float
    results: list[tuple[int, int, int, bool]]

    def answer(self, pool: str) -> list[EnqueueResult]:
        """The call's answer, as its first transaction gave it."""
        return [
            EnqueueResult(sequence, index, f"{pool}:{index}", position, duplicate)
            for index, sequence, position, duplicate in self.results
        ]


def _results(value: Any) -> bool:
    return type(value) is list and all(
        type(result) is list
        and len(result) == 4
        and _instance(result[0])
        and _count(result[1])
        and _count(result[2])
        and _flag(result[3])
        for result in value
    )


_CALL_LAYOUT: Layout = (("at", _time), ("results", _results))


def read_call(key: bytes, value: bytes) -> CallRecord:
    """A call record, checked (``DamagedRecordError`` naming what is wrong)."""
    at, results = _laid_out(key, value, _CALL_LAYOUT)
    return CallRecord(at, [tuple(result) for result in results])


def stored_call(txn: Txn, producer: bytes, call: int) -> CallRecord | None:
    """The record of ``producer``'s call ``call``, if a transaction stored it.

    Raises:
        DamagedRecordError: its record is damaged: whether the call was stored is not
            known, so it is neither answered nor stored again.
    """
    key = call_key(producer, call)
    value = txn.get(key)
    return None if value is None else read_call(key, value)


def record_call(
    txn: Txn, producer: bytes, call: int, at: float, results: list[EnqueueResult]
) -> None:
    """Write the record of a call whose events ``txn`` stored, answered ``results``."""
    key = call_key(producer, call)
    fields = [[r.instance_index, r.sequence, r.position, r.duplicate] for r in results]
    txn.put(key, seal(key, pack([at, fields])))


def forget_calls(txn: Txn, producer: bytes, below: int) -> int:
    """Delete ``producer``'s call records numbered below ``below``; how many."""
    prefix = call_prefix(producer)
    end = call_key(producer, below)
    doomed = [key for key, _ in _iter_prefix(txn, prefix, len(end)) if key < end]
    for key in doomed:
        txn.delete(key)
    return len(doomed)


def sweep_calls(txn: Txn, before: float) -> int:
    """Delete up to :data:`SWEEP` call records written before ``before`` (their producers
    are gone); how many. A damaged one stays (its age is not known), for ``dopool check``
    to report."""
    doomed: list[bytes] = []
    for key, value in _iter_prefix(txn, call_prefix(), 1 + PRODUCER_ID_BYTES + 8):
        try:
            stale = read_call(key, value).at < before
        except DamagedRecordError:
            continue
        if stale:
            doomed.append(key)
            if len(doomed) >= SWEEP:
                break
    for key in doomed:
        txn.delete(key)
    return len(doomed)
