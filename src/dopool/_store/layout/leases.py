"""The store's leases and presences, read and written in a transaction.

A lease names the worker serving a unit of a pool's instances (:class:`LeaseRecord`;
one instance per unit in a pool of up to 4,096, see :mod:`dopool._cluster.units`); a
worker's presence says it is alive (:class:`PresenceRecord`). What they mean, and who
writes them when, is :mod:`dopool._cluster.leases`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from dopool._errors import DamagedRecordError
from dopool._store.layout.keys import (
    lease_key,
    lease_prefix,
    parse_lease_key,
    presence_key,
    presence_owner,
    presence_prefix,
)
from dopool._store.layout.namespace import _iter_prefix
from dopool._store.layout.records import (
    Layout,
    _count,
    _laid_out,
    _text,
    _time,
    damaged,
    pack,
    seal,
)
from dopool._store.txn import Txn


class LeaseRecord(NamedTuple):
    """Which worker serves a lease unit's instances, until when (docs/deployment.md, "Leases").

    ``owner`` is the worker's id (unique per process), ``epoch`` counts the takeovers
    of the unit, ``expires_at`` is the host's lease clock's seconds (docs/store-format.md).
    """

    owner: str
    pid: int
    host: str
    epoch: int
    expires_at: float


_LEASE_LAYOUT: Layout = (
    ("owner", _text),
    ("pid", _count),
    ("host", _text),
    ("epoch", _count),
    ("expires_at", _time),
)


def seal_lease(key: bytes, record: LeaseRecord) -> bytes:
    return seal(key, pack(list(record)))


def read_lease(key: bytes, value: bytes) -> LeaseRecord:
    return LeaseRecord(*_laid_out(key, value, _LEASE_LAYOUT))


class PresenceRecord(NamedTuple):
    """A live worker: its process, and until when it counts as live (epoch seconds)."""

    pid: int
    host: str
    expires_at: float


_PRESENCE_LAYOUT: Layout = (("pid", _count), ("host", _text), ("expires_at", _time))


def seal_presence(key: bytes, record: PresenceRecord) -> bytes:
    return seal(key, pack(list(record)))


def read_presence(key: bytes, value: bytes) -> PresenceRecord:
    return PresenceRecord(*_laid_out(key, value, _PRESENCE_LAYOUT))


def get_lease(txn: Txn, pool: str, unit: int) -> LeaseRecord | None:
    """The lease of ``pool``'s lease unit ``unit``, or None if nobody holds one."""
    key = lease_key(pool, unit)
    raw = txn.get(key)
    return None if raw is None else read_lease(key, raw)


def put_lease(txn: Txn, pool: str, unit: int, record: LeaseRecord) -> bytes:
    """Write the lease of ``pool``'s ``unit``; returns its stored bytes."""
    key = lease_key(pool, unit)
    sealed = seal_lease(key, record)
    txn.put(key, sealed)
    return sealed


def delete_lease(txn: Txn, pool: str, unit: int) -> None:
    txn.delete(lease_key(pool, unit))


def all_leases(txn: Txn) -> Iterator[tuple[str, int, LeaseRecord]]:
    """Every lease in the store that reads: ``(pool, unit, record)``, by pool and unit.

    A damaged one (its key or its record) is passed over: it names no worker, and
    ``dopool check`` reports it.
    """
    for key, raw in _iter_prefix(txn, lease_prefix()):
        where = parse_lease_key(key)
        if where is None:
            continue
        try:
            record = read_lease(key, raw)
        except DamagedRecordError:
            continue
        yield where[0], where[1], record


def put_presence(txn: Txn, owner: str, record: PresenceRecord) -> None:
    key = presence_key(owner)
    txn.put(key, seal_presence(key, record))


def delete_presence(txn: Txn, owner: str) -> None:
    txn.delete(presence_key(owner))


def all_presences(txn: Txn) -> Iterator[tuple[str, PresenceRecord]]:
    """Every worker's presence that reads: ``(owner, record)``.

    A damaged one (its key or its record) is passed over: :func:`damaged_presences`
    names it, and ``dopool check`` reports it.
    """
    for key, raw in _iter_prefix(txn, presence_prefix()):
        owner = presence_owner(key)
        if owner is None:
            continue
        try:
            record = read_presence(key, raw)
        except DamagedRecordError:
            continue
        yield owner, record


def damaged_presences(txn: Txn) -> list[DamagedRecordError]:
    """The presences that fail their checks (their key or their record), each as its error."""
    found = []
    for key, raw in _iter_prefix(txn, presence_prefix()):
        if presence_owner(key) is None:
            found.append(damaged(key, raw, "the presence key names no worker"))
            continue
        try:
            read_presence(key, raw)
        except DamagedRecordError as exc:
            found.append(exc)
    return found
