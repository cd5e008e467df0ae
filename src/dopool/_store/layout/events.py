"""An instance's event index and its remembered finished events, read and written in a
transaction.

Every unfinished event has an index entry, ``n <seq:8>``, holding its key's rank and due
time: both keys the event can have (its queue key, or its scheduled key until it falls
due) are built from it and the sequence, so an event is found from its id without a
scan. :class:`~.namespace.Namespace` writes an entry with each event and deletes it with
the event (the hot path); promotion leaves it alone, since the rank and due time stay.

A finished event is remembered, for the pool's ``keep_finished`` seconds, by a record
``f <seq:8>`` (its state, attempts, times, last error) and an expiry key
``e <finished:8> <seq:8>``, so that the records past their time are found oldest first
and swept as finishes go (:meth:`EventIndex.sweep`). ``docs/store-format.md``
documents the three records.
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

from dopool._errors import DamagedRecordError
from dopool._store.layout.keys import (
    _DUE_RANK_SEQ,
    _DUE_SEQ,
    _FINISHED_TAG,
    _FORGET_TAG,
    _INDEX_TAG,
    _QUEUE_TAG,
    _RANK_DUE_SEQ,
    _U64,
    _WAIT_TAG,
    RecordKind,
    decode_due,
    delayed_key_due,
    encode_due,
    queue_key_priority,
)
from dopool._store.layout.namespace import Namespace, _delete_prefix, _iter_prefix
from dopool._store.layout.records import (
    EventRecord,
    Layout,
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
    read_event,
    seal,
)
from dopool._store.txn import Txn

logger = logging.getLogger("dopool")

_SUFFIX = 12  # an entry's body: a queue key's rank:4 and due:8


class FinishedRecord(NamedTuple):
    """A finished event, remembered: what :class:`~dopool.EventInfo` reports of it."""

    state: str
    attempts: int
    enqueued_at: float
    due: float
    started_at: float | None
    finished_at: float
    error: str | None
    partition_key: str | None
    priority: int
    dedup_key: str | None


#: The states a finished event is remembered in.
FINISHED_STATES = ("succeeded", "dead_lettered", "cancelled", "expired", "drained")


def _due(value: Any) -> bool:
    """A due time: a float, ``-inf`` included (a migrated event's), never NaN."""
    return type(value) is float and not math.isnan(value) and value != math.inf


_FINISHED_LAYOUT: Layout = (
    ("state", _text),
    ("attempts", _count),
    ("enqueued_at", _time),
    ("due", _due),
    ("started_at", _time_or_none),
    ("finished_at", _time),
    ("error", _text_or_none),
    ("partition_key", _text_or_none),
    ("priority", _priority),
    ("dedup_key", _text_or_none),
)


def seal_entry(key: bytes, event_key: bytes) -> bytes:
    """An index entry's value for the event under ``event_key`` (a queue key's layout)."""
    return seal(key, pack((event_key[-20:-8],)))


def read_lifecycle(kind: RecordKind, key: bytes, value: bytes) -> None:
    """Check an index entry, a remembered event or its expiry key (``dopool check``).

    Raises:
        DamagedRecordError: the record fails its checks.
    """
    if kind is RecordKind.INDEX:
        (suffix,) = _fields(key, value, 1)
        if type(suffix) is not bytes or len(suffix) != _SUFFIX:
            raise damaged(key, value, f"key suffix is {suffix!r}")
    elif kind is RecordKind.FINISHED:
        state = _laid_out(key, value, _FINISHED_LAYOUT)[0]
        if state not in FINISHED_STATES:
            raise damaged(key, value, f"state {state!r}")
    else:
        _fields(key, value, 0)


class Located(NamedTuple):
    """An unfinished event found by its sequence: its key, and whether it is scheduled."""

    key: bytes
    scheduled: bool


class EventIndex:
    """One instance's event index and remembered events (see the module docstring)."""

    __slots__ = ("_entries", "_finished", "_forget", "_queue", "_wait")

    def __init__(self, namespace: Namespace) -> None:
        prefix = namespace.prefix
        self._entries = prefix + _INDEX_TAG
        self._finished = prefix + _FINISHED_TAG
        self._forget = prefix + _FORGET_TAG
        self._queue = prefix + _QUEUE_TAG
        self._wait = prefix + _WAIT_TAG

    # -- unfinished events ------------------------------------------------------------
    def locate(self, txn: Txn, sequence: int) -> Located | None:
        """Where the unfinished event ``sequence`` is stored; None if it is not.

        A damaged entry, or one that names no stored event, is passed over: the
        event is looked for among the instance's pending keys instead (a scan,
        logged), so that damage never names the wrong event nor hides a stored one.
        """
        key = self._entries + _U64.pack(sequence)
        raw = txn.get(key)
        if raw is None:
            return None
        try:
            (suffix,) = _fields(key, raw, 1)
            if type(suffix) is not bytes or len(suffix) != _SUFFIX:
                raise damaged(key, raw, f"key suffix is {suffix!r}")
        except DamagedRecordError as damage:
            logger.warning("%s; looked for by a scan", damage)
            return self._search(txn, sequence)
        rank, bits = suffix[:4], suffix[4:]
        seq = _U64.pack(sequence)
        queue_key = self._queue + rank + bits + seq
        if txn.get(queue_key) is not None:
            return Located(queue_key, False)
        delayed_key = self._wait + bits + rank + seq
        if txn.get(delayed_key) is not None:
            return Located(delayed_key, True)
        logger.warning("the event index entry of %d names no event; looked for by a scan", sequence)
        return self._search(txn, sequence)

    def _search(self, txn: Txn, sequence: int) -> Located | None:
        """The unfinished event ``sequence`` found by a scan (a damaged entry's fallback)."""
        seq = _U64.pack(sequence)
        for prefix, size, scheduled in (
            (self._queue, _RANK_DUE_SEQ.size, False),
            (self._wait, _DUE_RANK_SEQ.size, True),
        ):
            for key, _ in _iter_prefix(txn, prefix, len(prefix) + size):
                if key.endswith(seq):
                    return Located(bytes(key), scheduled)
        return None

    def read(self, txn: Txn, located: Located) -> EventRecord:
        """The record of an event :meth:`locate` found.

        Raises:
            DamagedRecordError: the record is damaged.
        """
        return read_event(located.key, txn.get(located.key))

    def is_delayed(self, key: bytes) -> bool:
        """Whether ``key`` is a scheduled event's (else a queue key)."""
        return key.startswith(self._wait)

    def first_due(self, txn: Txn) -> float | None:
        """The first scheduled key's due time; None if none is stored."""
        length = len(self._wait) + _DUE_RANK_SEQ.size
        for key, _ in _iter_prefix(txn, self._wait, length):
            return delayed_key_due(key)
        return None

    def lost(self, txn: Txn) -> list[tuple[int, bytes]]:
        """The unfinished events stored nowhere: for each index entry that reads but whose
        event :meth:`locate` does not find, its sequence and the queue key it names.

        Only damage to the event's key does that: its record is then under a key of no
        event, which ``dopool check`` names. A damaged entry is passed over: its checksum
        covers its key, so its sequence may be damaged too. A scan of the index (and,
        for each such entry, of the pending keys): for a damaged store only.
        """
        start = len(self._entries)
        unfound: list[tuple[int, bytes]] = []
        for key, raw in _iter_prefix(txn, self._entries, start + 8):
            try:
                (suffix,) = _fields(key, raw, 1)
            except DamagedRecordError:
                continue
            if type(suffix) is not bytes or len(suffix) != _SUFFIX:
                continue
            seq = bytes(key[start:])
            queue_key = self._queue + suffix + seq
            delayed_key = self._wait + suffix[4:] + suffix[:4] + seq  # due, then rank
            if txn.get(queue_key) is None and txn.get(delayed_key) is None:
                unfound.append((int.from_bytes(seq, "big"), queue_key))
        return [(sequence, key) for sequence, key in unfound if self._search(txn, sequence) is None]

    def tally(self, txn: Txn) -> tuple[dict[int, int], int, float | None]:
        """What the pending keys hold, as a meta counts it: the queue keys per priority,
        how many scheduled keys there are, and the first one's due time (a scan: for a
        meta that counts events no key holds)."""
        priorities: dict[int, int] = {}
        for key, _ in _iter_prefix(txn, self._queue, len(self._queue) + _RANK_DUE_SEQ.size):
            priority = queue_key_priority(key)
            priorities[priority] = priorities.get(priority, 0) + 1
        scheduled, first = 0, None
        for key, _ in _iter_prefix(txn, self._wait, len(self._wait) + _DUE_RANK_SEQ.size):
            first = delayed_key_due(key) if first is None else first
            scheduled += 1
        return priorities, scheduled, first

    def entries(self, txn: Txn) -> list[int]:
        """Every index entry's sequence, in order (checkers and the migration)."""
        start = len(self._entries)
        return [
            int.from_bytes(key[start:], "big")
            for key, _ in _iter_prefix(txn, self._entries, start + 8)
        ]

    def put_entry(self, txn: Txn, event_key: bytes) -> None:
        """Index the event stored under ``event_key`` (a queue or scheduled key)."""
        if event_key.startswith(self._wait):  # due:8 rank:4 seq:8 → rank, due
            event_key = event_key[:-20] + event_key[-12:-8] + event_key[-20:-12] + event_key[-8:]
        key = self._entries + event_key[-8:]
        txn.put(key, seal_entry(key, event_key))

    def delete_entries(self, txn: Txn) -> int:
        """Delete every index entry (a drain's); how many."""
        return _delete_prefix(txn, self._entries)

    # -- finished events ----------------------------------------------------------------
    def remember(self, txn: Txn, sequence: int, record: FinishedRecord) -> None:
        """Remember a finished event until it is swept: its record and its expiry key."""
        key = self._finished + _U64.pack(sequence)
        txn.put(key, seal(key, pack(record)))
        expiry = self._forget + _DUE_SEQ.pack(encode_due(record.finished_at), sequence)
        txn.put(expiry, seal(expiry, pack(())))

    def finished(self, txn: Txn, sequence: int) -> FinishedRecord | None:
        """The remembered record of finished event ``sequence``, if it is still stored.

        Raises:
            DamagedRecordError: the record is damaged.
        """
        key = self._finished + _U64.pack(sequence)
        raw = txn.get(key)
        if raw is None:
            return None
        read_lifecycle(RecordKind.FINISHED, key, raw)
        return FinishedRecord(*_laid_out(key, raw, _FINISHED_LAYOUT))

    def sweep(self, txn: Txn, cutoff: float, limit: int = 2) -> int:
        """Forget up to ``limit`` events finished by ``cutoff``, oldest first; how many.

        An expiry key of the wrong length is deleted too (it names nothing), so a
        damaged key never stops the sweep.
        """
        prefix, length = self._forget, len(self._forget) + _DUE_SEQ.size
        doomed: list[bytes] = []
        with txn.cursor() as cursor:
            found = cursor.set_range(prefix)
            while found and len(doomed) < limit:
                key = bytes(cursor.key())
                if not key.startswith(prefix):
                    break
                if len(key) == length:
                    bits, _ = _DUE_SEQ.unpack_from(key, len(prefix))
                    if decode_due(bits) > cutoff:
                        break
                doomed.append(key)
                found = cursor.next()
        forgotten = 0
        for key in doomed:
            txn.delete(key)
            if len(key) == length:
                forgotten += bool(txn.delete(self._finished + key[-8:]))
        return forgotten

    def count_finished(self, txn: Txn) -> int:
        """How many remembered records exist (the meta's ``remembered``)."""
        return sum(1 for _ in _iter_prefix(txn, self._finished, len(self._finished) + 8))
