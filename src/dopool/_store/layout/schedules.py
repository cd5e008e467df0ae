"""A pool's recurring schedules: their records, read and written in a transaction.

Every schedule of a pool lives in instance 0's namespace (``docs/store-format.md``):
its record under ``r <name>``, and its next fire time under ``t <at:8> <name>``, so
that the first ``t`` key is always the next fire and the meta's ``next_fire`` can
name it. ``name`` is :func:`~.keys.schedule_name`'s bytes; the record holds the name
itself. A schedule that will never fire again (a cron expression past its last
match) keeps its record and has no ``t`` key.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from dopool._errors import DamagedRecordError
from dopool._store.layout.keys import _FIRE_TAG, _RECURRING_TAG, _U64, encode_due, fire_time
from dopool._store.layout.keys import schedule_name as _name_of
from dopool._store.layout.limits import MIN_EVERY
from dopool._store.layout.namespace import Namespace, _iter_prefix
from dopool._store.layout.records import (
    Layout,
    _blob,
    _count,
    _fields,
    _laid_out,
    _priority,
    _text,
    _text_or_none,
    _time,
    _time_or_none,
    damaged,
    pack,
    seal,
)
from dopool._store.txn import Txn


class ScheduleRecord(NamedTuple):
    """A recurring schedule as stored (exactly one of ``every`` and ``cron`` is set).

    ``next_at`` is its next fire time (None: it never fires again); ``fired`` counts
    the occurrences enqueued, ``coalesced`` the fire times that passed without one
    of their own (folded into a later fire's occurrence), ``last_fired_at`` the time
    of the last occurrence's enqueue.
    """

    name: str
    event: bytes
    every: float | None
    cron: str | None
    partition_key: str | None
    priority: int
    next_at: float | None
    fired: int = 0
    coalesced: int = 0
    last_fired_at: float | None = None

    def same_definition(self, other: ScheduleRecord) -> bool:
        """Whether ``other`` defines the same schedule (its times and counts aside)."""
        return self[:6] == other[:6]


def _every(value: object) -> bool:
    return value is None or (type(value) is float and _time(value) and value >= MIN_EVERY)


_SCHEDULE_LAYOUT: Layout = (
    ("name", _text),
    ("event", _blob),
    ("every", _every),
    ("cron", _text_or_none),
    ("partition_key", _text_or_none),
    ("priority", _priority),
    ("next_at", _time_or_none),
    ("fired", _count),
    ("coalesced", _count),
    ("last_fired_at", _time_or_none),
)


def read_schedule(key: bytes, value: bytes) -> ScheduleRecord:
    record = ScheduleRecord(*_laid_out(key, value, _SCHEDULE_LAYOUT))
    if (record.every is None) == (record.cron is None):
        raise damaged(key, value, "not exactly one of every and cron")
    if not key.endswith(_RECURRING_TAG + _name_of(record.name)):
        raise damaged(key, value, f"name {record.name!r} is not its key's")
    return record


def read_fire(key: bytes, value: bytes) -> None:
    """Check a fire key's value (``dopool check``).

    Raises:
        DamagedRecordError: it is not an empty array, sealed under its key.
    """
    _fields(key, value, 0)


def seal_fire(key: bytes) -> bytes:
    """A fire key's value: an empty array, sealed (its key says everything)."""
    return seal(key, pack([]))


class ScheduleBook:
    """One pool's schedules, in its instance 0's namespace (see the module docstring)."""

    __slots__ = ("_fires", "_records")

    def __init__(self, namespace: Namespace) -> None:
        self._records = namespace.prefix + _RECURRING_TAG
        self._fires = namespace.prefix + _FIRE_TAG

    def record_key(self, name: str) -> bytes:
        return self._records + _name_of(name)

    def fire_key(self, at: float, name: str) -> bytes:
        return self._fires + _U64.pack(encode_due(at)) + _name_of(name)

    def get(self, txn: Txn, name: str) -> ScheduleRecord | None:
        """The schedule named ``name``, if stored.

        Raises:
            DamagedRecordError: its record is damaged.
        """
        key = self.record_key(name)
        raw = txn.get(key)
        if raw is None:
            return None
        record = read_schedule(key, raw)
        if record.name != name:  # two long names with one digest: never in practice
            raise damaged(key, raw, f"holds schedule {record.name!r}, not {name!r}")
        return record

    def put(self, txn: Txn, record: ScheduleRecord, old: ScheduleRecord | None) -> None:
        """Store ``record`` (replacing ``old``, the one stored under its name, if any)."""
        if old is not None and old.next_at is not None:
            txn.delete(self.fire_key(old.next_at, old.name))
        key = self.record_key(record.name)
        txn.put(key, seal(key, pack(record)))
        if record.next_at is not None:
            fire = self.fire_key(record.next_at, record.name)
            txn.put(fire, seal_fire(fire))

    def delete(self, txn: Txn, record: ScheduleRecord) -> None:
        """Remove a stored schedule and its fire key."""
        txn.delete(self.record_key(record.name))
        if record.next_at is not None:
            txn.delete(self.fire_key(record.next_at, record.name))

    def first_fire(self, txn: Txn) -> tuple[float, bytes, bytes] | None:
        """The earliest fire key: its time, its schedule's name (as keyed), the key itself."""
        for key, _ in _iter_prefix(txn, self._fires):
            if len(key) > len(self._fires) + 8:
                at, name = fire_time(key[len(self._fires) :])
                return at, name, key
        return None

    def next_fire(self, txn: Txn) -> float | None:
        """The earliest fire time stored (the meta's ``next_fire``)."""
        first = self.first_fire(txn)
        return None if first is None else first[0]

    def record_by_name_key(self, txn: Txn, name: bytes) -> ScheduleRecord | None:
        """The schedule whose keys are named ``name`` (:func:`schedule_name`'s bytes).

        Raises:
            DamagedRecordError: its record is damaged.
        """
        key = self._records + name
        raw = txn.get(key)
        return None if raw is None else read_schedule(key, raw)

    def records(self, txn: Txn) -> Iterator[ScheduleRecord | DamagedRecordError]:
        """Every schedule, in key order; a damaged one comes as its error, not raised."""
        for key, raw in _iter_prefix(txn, self._records):
            try:
                yield read_schedule(key, raw)
            except DamagedRecordError as exc:
                yield exc

    def fires(self, txn: Txn) -> Iterator[tuple[float, bytes]]:
        """Every fire key's time and name (as keyed), in time order (for checkers)."""
        start = len(self._fires)
        for key, _ in _iter_prefix(txn, self._fires):
            if len(key) > start + 8:
                yield fire_time(key[start:])

    def name_key(self, name: str) -> bytes:
        """What names ``name`` in its keys."""
        return _name_of(name)
