"""A pool's dedup index: its records, and the index read and written in a transaction.

One entry per dedup key, under ``K <pool> \\0 <name>`` (:func:`~.keys.dedup_name`): the
event that holds the key, and when it finished; and one expiry key per finished entry,
``E <pool> \\0 <finished:8> <name>``, so that the entries past their window are found
oldest first. The index is the pool's, not an instance's: every instance's transaction
reads and writes the same entries. ``docs/store-format.md`` documents both records.
Last, the events that hold keys, read from an instance's namespace: whether one is still
stored, and every pending one's key (a drain's).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Collection, Iterable, Iterator
from typing import NamedTuple

from dopool._errors import DamagedRecordError
from dopool._store.layout.keys import (
    _U64,
    DIRECT_NAME,
    decode_due,
    dedup_name,
    dedup_prefix,
    encode_due,
    expiry_key,
    expiry_prefix,
    queue_key_sequence,
)
from dopool._store.layout.limits import PER_KEY, PRIORITY_MAX, PRIORITY_MIN
from dopool._store.layout.namespace import Namespace, _count_prefix, _iter_prefix
from dopool._store.layout.records import (
    Layout,
    _count,
    _fields,
    _instance,
    _laid_out,
    _priority,
    _text,
    _time,
    _time_or_none,
    damaged,
    pack,
    packer,
    seal,
    unpack,
)
from dopool._store.txn import Txn

# -- the records ---------------------------------------------------------------------------


class DedupRecord(NamedTuple):
    """A dedup key's index entry: the event that holds the key, and when it finished.

    ``instance`` and ``sequence`` name the event; ``priority`` and ``due`` are those
    of its key, so that a lookup finds whether it is still stored (under its queue
    key or its scheduled key) without a scan. ``position`` is what its enqueue
    answered. ``finished_at`` is None while the event is unfinished.
    """

    dedup_key: str
    instance: int
    sequence: int
    position: int
    priority: int
    due: float
    finished_at: float | None = None


_DEDUP_LAYOUT: Layout = (
    ("dedup_key", _text),
    ("instance", _instance),
    ("sequence", _count),
    ("position", _count),
    ("priority", _priority),
    ("due", _time),
    ("finished_at", _time_or_none),
)


def seal_dedup(key: bytes, record: DedupRecord) -> bytes:
    return seal(key, pack(record))


def read_dedup(key: bytes, value: bytes) -> DedupRecord:
    # The checks of _DEDUP_LAYOUT written out, as read_event's: this runs for every
    # duplicate. Anything they refuse goes the general way, which names why.
    body = value[4:]
    if int.from_bytes(value[:4], "big") == zlib.crc32(body, zlib.crc32(key)):
        try:
            fields = unpack(body)
        except Exception:
            fields = None
        if type(fields) is list and len(fields) == 7:
            dedup_key, instance, sequence, position, priority, due, finished_at = fields
            if (
                type(dedup_key) is str
                and type(instance) is int
                and 0 <= instance < PER_KEY
                and type(sequence) is int
                and 0 <= sequence < 2**63
                and type(position) is int
                and 0 <= position < 2**63
                and type(priority) is int
                and PRIORITY_MIN <= priority <= PRIORITY_MAX
                and type(due) is float
                and math.isfinite(due)
                and (
                    finished_at is None
                    or (type(finished_at) is float and math.isfinite(finished_at))
                )
            ):
                return DedupRecord(
                    dedup_key, instance, sequence, position, priority, due, finished_at
                )
    _laid_out(key, value, _DEDUP_LAYOUT)  # raises, naming what is wrong
    raise damaged(key, value, "fields of the wrong types")  # pragma: no cover


def seal_expiry(key: bytes) -> bytes:
    """An expiry key's value: an empty array (the key says everything), sealed."""
    return seal(key, pack(()))


def read_expiry(key: bytes, value: bytes) -> None:
    """Check an expiry key's value."""
    _fields(key, value, 0)


# -- the index ------------------------------------------------------------------------------

#: An unfinished event's claim of its key: its entry's fields but ``finished_at``.
DedupClaim = tuple[str, int, int, int, int, float]


class DedupIndex:
    """A pool's dedup keys: one index entry per key, and the finished ones by finish time.

    Methods take an open transaction; the index is the pool's, so every instance's
    transaction reads and writes the same entries.
    """

    __slots__ = ("_expiry", "_prefix", "pool")

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._prefix = dedup_prefix(pool)
        self._expiry = expiry_prefix(pool)

    def entry_key(self, dedup_key: str) -> bytes:
        data = dedup_key.encode()  # dedup_name's direct form written out: the usual one
        if len(data) <= DIRECT_NAME:
            return self._prefix + data
        return self._prefix + dedup_name(dedup_key)

    def get(self, txn: Txn, dedup_key: str, key: bytes | None = None) -> DedupRecord | None:
        """The entry of ``dedup_key`` (under ``key``, its entry key if known), if any.

        Raises:
            DamagedRecordError: the entry fails its checks, or holds another key.
        """
        if key is None:
            key = self.entry_key(dedup_key)
        raw = txn.get(key)
        if raw is None:
            return None
        record = read_dedup(key, raw)
        if record.dedup_key != dedup_key:
            raise damaged(key, raw, f"it holds the dedup key {record.dedup_key!r}")
        return record

    def put(self, txn: Txn, record: DedupRecord) -> None:
        key = self.entry_key(record.dedup_key)
        txn.put(key, seal_dedup(key, record))

    def held(self, txn: Txn, keys: Iterable[bytes]) -> set[bytes]:
        """Which of the entry keys ``keys`` have an entry (one call into LMDB for all)."""
        with txn.cursor() as cursor:
            return {key for key, _ in cursor.getmulti(keys)}

    def claim_free(
        self,
        txn: Txn,
        dedup_key: str,
        instance: int,
        sequence: int,
        position: int,
        priority: int,
        due: float,
    ) -> bool:
        """Write the entry of an unfinished event unless ``dedup_key`` has one (whatever it
        holds); whether it did. One call into LMDB both looks the key up and claims it:
        this runs for every event enqueued alone with a key."""
        data = dedup_key.encode()  # entry_key written out
        key = self._prefix + (data if len(data) <= DIRECT_NAME else dedup_name(dedup_key))
        body = pack((dedup_key, instance, sequence, position, priority, due, None))
        value = zlib.crc32(body, zlib.crc32(key)).to_bytes(4, "big") + body  # seal's
        added: bool = txn.put(key, value, overwrite=False)
        return added

    def entry_keys(self, dedup_keys: Iterable[str]) -> dict[str, bytes]:
        """The entry key of each of ``dedup_keys`` (:meth:`entry_key`), by key."""
        prefix, found = self._prefix, {}
        for dedup_key in dedup_keys:
            data = dedup_key.encode()  # entry_key written out: this runs for every key
            found[dedup_key] = prefix + (
                data if len(data) <= DIRECT_NAME else dedup_name(dedup_key)
            )
        return found

    def claim(self, txn: Txn, claims: list[DedupClaim], known: dict[str, bytes]) -> None:
        """Write the entries of unfinished events from their fields (:meth:`put` without
        records built: this runs for every keyed event stored), each under its entry key
        in ``known`` if there (else :meth:`entry_key`); a batch's in key order, through
        one cursor."""
        entries = []
        pack_one = packer().pack
        for dedup_key, instance, sequence, position, priority, due in claims:
            key = known.get(dedup_key) or self.entry_key(dedup_key)
            body = pack_one((dedup_key, instance, sequence, position, priority, due, None))
            entries.append((key, zlib.crc32(body, zlib.crc32(key)).to_bytes(4, "big") + body))
        if len(entries) == 1:
            txn.put(*entries[0])
            return
        entries.sort()
        with txn.cursor() as cursor:
            cursor.putmulti(entries)

    def finish(
        self,
        txn: Txn,
        dedup_key: str,
        instance: int,
        sequence: int,
        finished_at: float,
        window: float,
    ) -> bool:
        """Event ``sequence`` of ``instance`` finished: if the entry of ``dedup_key`` names
        it, unfinished, remove the entry (no window), or stamp it and queue its expiry;
        whether it did.

        Raises:
            DamagedRecordError: the entry fails its checks.
        """
        data = dedup_key.encode()  # entry_key written out: this runs for every keyed finish
        key = self._prefix + (data if len(data) <= DIRECT_NAME else dedup_name(dedup_key))
        raw = txn.get(key)
        if raw is None:
            return False
        # Only what is compared is checked here (the checksum, the key, the event); an
        # entry that does not match that way is read in full, which raises if damaged.
        fields = None
        body = raw[4:]
        if int.from_bytes(raw[:4], "big") == zlib.crc32(body, zlib.crc32(key)):
            try:
                fields = unpack(body)
            except Exception:
                fields = None
        if not (
            type(fields) is list
            and len(fields) == 7
            and fields[0] == dedup_key
            and type(fields[1]) is int
            and type(fields[2]) is int
            and (fields[1], fields[2]) == (instance, sequence)
            and fields[6] is None
        ):
            read_dedup(key, raw)
            return False  # it names another event, or a finished one
        if window <= 0:
            txn.delete(key)
            return True
        fields[6] = finished_at
        txn.put(key, seal(key, pack(fields)))
        expiry = expiry_key(self.pool, finished_at, key[len(self._prefix) :])
        txn.put(expiry, seal_expiry(expiry))
        return True

    def sweep(self, txn: Txn, now: float, window: float, limit: int) -> tuple[int, float | None]:
        """Remove up to ``limit`` entries finished ``window`` seconds or more before
        ``now``, oldest first; how many expiry keys went, and when the oldest one left
        finished, if the sweep read it (None: none is left, or the limit came first).

        An expiry key whose entry was taken over since (by a newer event of its key,
        or a newer finish) goes alone; a damaged entry is left for ``dopool check``. A key
        too short to hold a time and a name names nothing: it goes alone too, so that it
        never stops the sweep.
        """
        done: list[bytes] = []
        oldest = None
        limit_bits = encode_due(now - window)
        start = len(self._expiry)
        with txn.cursor() as cursor:
            found = cursor.set_range(self._expiry)
            while found and len(done) < limit:
                key = cursor.key()
                if not key.startswith(self._expiry):
                    break
                if len(key) > start + 8:
                    bits = _U64.unpack_from(key, start)[0]
                    if bits > limit_bits:
                        oldest = decode_due(bits)
                        break
                done.append(bytes(key))
                found = cursor.next()
        for expiry in done:
            if len(expiry) <= start + 8:
                txn.delete(expiry)
                continue
            entry_key = self._prefix + expiry[start + 8 :]
            raw = txn.get(entry_key)
            if raw is not None:
                try:
                    record = read_dedup(entry_key, raw)
                except DamagedRecordError:
                    record = None
                finished = decode_due(_U64.unpack_from(expiry, start)[0])
                if record is not None and record.finished_at == finished:
                    txn.delete(entry_key)
            txn.delete(expiry)
        return len(done), oldest

    def held_by(self, txn: Txn, instance: int, sequences: Collection[int]) -> dict[int, str]:
        """The keys whose entries name, unfinished, one of events ``sequences`` of
        ``instance``, by sequence: for events whose records are lost, which cannot say
        their keys. A scan of the pool's entries; a damaged one is passed over."""
        held: dict[int, str] = {}
        for key, raw in _iter_prefix(txn, self._prefix):
            try:
                record = read_dedup(key, raw)
            except DamagedRecordError:
                continue
            if (
                record.finished_at is None
                and record.instance == instance
                and record.sequence in sequences
                and self.entry_key(record.dedup_key) == key  # (else it holds another key)
            ):
                held[record.sequence] = record.dedup_key
        return held

    def entries(self, txn: Txn) -> Iterator[tuple[bytes, bytes]]:
        """Every index entry's key and stored value (for checkers)."""
        return _iter_prefix(txn, self._prefix)

    def count_expiries(self, txn: Txn) -> int:
        return _count_prefix(txn, self._expiry)


# -- the events that hold keys ------------------------------------------------------------


def event_stored(txn: Txn, ns: Namespace, entry: DedupRecord) -> bool:
    """Whether the unfinished event ``entry`` names is stored in ``ns``, due (or started)
    or scheduled, reads (a damaged one will never run), and holds the entry's key (an
    event holding another key, or none, is not what the entry says)."""
    priority, sequence, due = entry.priority, entry.sequence, entry.due
    try:
        record = ns.get_event(txn, ns.queue_key(priority, sequence, due))
        if record is None:
            record = ns.get_event(txn, ns.delayed_key(priority, sequence, due))
    except DamagedRecordError:
        return False
    return record is not None and record.dedup_key == entry.dedup_key


def keyed_events(txn: Txn, ns: Namespace) -> list[tuple[int, str]]:
    """The sequence and dedup key of every pending event of ``ns`` that has one and reads.

    A damaged record is passed over: its key cannot be known (the index entry that names
    it is found stale when next looked up).
    """
    keyed = []
    for key in [*ns.iter_event_keys(txn), *ns.iter_delayed_keys(txn)]:
        try:
            record = ns.get_event(txn, key)
        except DamagedRecordError:
            continue
        if record is not None and record.dedup_key is not None:
            keyed.append((queue_key_sequence(key), record.dedup_key))
    return keyed
