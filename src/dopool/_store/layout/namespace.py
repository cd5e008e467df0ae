"""An instance's namespace and the pool records: records read and written under their keys.

Every function here takes an open transaction from :class:`~dopool._store.environment.Store`;
the keys come from :mod:`.keys`, the values are sealed and checked by :mod:`.records`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from dopool._errors import DamagedRecordError
from dopool._store.layout.keys import (
    _DEAD_TAG,
    _DUE_RANK_SEQ,
    _INDEX_TAG,
    _INSTANCE_PREFIX,
    _KIND_OF_TAG,
    _MARK_TAG,
    _META_TAG,
    _OUTBOX_TAG,
    _POOL_PREFIX,
    _QUEUE_TAG,
    _RANK_DUE_SEQ,
    _U64,
    _WAIT_TAG,
    RecordKind,
    _mark_source,
    _mark_suffix,
    _valid_suffix,
    alarm_entry_key,
    alarm_index_prefix,
    dead_letter_sequence,
    decode_due,
    encode_due,
    outbox_sequence,
    parse_alarm_entry,
    parse_work_entry,
    pool_key,
    pool_name_of,
    rate_key,
    work_entry_key,
    work_index_prefix,
)
from dopool._store.layout.limits import PRIORITY_MAX
from dopool._store.layout.records import (
    DeadRecord,
    EventRecord,
    Meta,
    OutboxRecord,
    PoolRecord,
    RateRecord,
    damaged,
    open_sealed,
    pack,
    read_dead,
    read_event,
    read_link,
    read_meta,
    read_outbox,
    read_pool,
    read_rate,
    seal,
    seal_dead,
    seal_event,
    seal_link,
    seal_meta,
    seal_outbox,
    seal_pool,
    seal_rate,
)
from dopool._store.txn import Txn

# An event index entry's body before its 12 bytes: msgpack's array of 1, bin of 12.
_ENTRY = b"\x91\xc4\x0c"


@dataclass(slots=True)
class Promoted:
    """What :meth:`Namespace.promote` moved: each event's priority, in due order; the due
    time of the last one moved (None if none); the next scheduled due time (None if none)."""

    priorities: list[int] = field(default_factory=list)
    last_due: float | None = None
    next_due: float | None = None


# -- an instance's keys ---------------------------------------------------------------


class Namespace:
    """The keys of one instance. Methods take an open transaction from :class:`Store`.

    Every value is sealed and checked by :mod:`.records`: a read raises
    :class:`DamagedRecordError` for a record that fails its checksum or layout.
    """

    __slots__ = (
        "_dead",
        "_due",
        "_entries",
        "_marks",
        "_meta",
        "_outbox",
        "_queue",
        "_seen",
        "_wait",
        "index",
        "pool",
        "prefix",
    )

    def __init__(self, pool: str, index: int) -> None:
        self.pool, self.index = pool, index
        self.prefix = _INSTANCE_PREFIX + f"{pool}:{index}".encode() + b"\0"
        self._meta = self.prefix + _META_TAG
        self._queue = self.prefix + _QUEUE_TAG
        self._wait = self.prefix + _WAIT_TAG
        self._entries = self.prefix + _INDEX_TAG  # the event index (see .events)
        self._due = (math.nan, 0)  # the last due time encoded, and its encoding
        self._dead = self.prefix + _DEAD_TAG
        self._outbox = self.prefix + _OUTBOX_TAG
        self._seen = self.prefix + _MARK_TAG
        self._marks: dict[tuple[str, int], bytes] = {}  # mark keys made, by source

    # -- meta ---------------------------------------------------------------
    @property
    def meta_key(self) -> bytes:
        return self._meta

    @property
    def mark_prefix(self) -> bytes:
        """The start of every delivery mark's key (the migration builds marks with it)."""
        return self._seen

    def load_meta(self, txn: Txn) -> Meta:
        return self.decode_meta(txn, txn.get(self._meta))

    def meta_bytes(self, txn: Txn) -> bytes | None:
        """The meta record's stored bytes, undecoded (None if it was never written)."""
        raw: bytes | None = txn.get(self._meta)
        return raw

    def decode_meta(self, txn: Txn, raw: bytes | None) -> Meta:
        """The meta record from its stored bytes (:meth:`meta_bytes`, read in ``txn``); for
        None, a new instance's: paused if its pool was paused as a whole."""
        if raw is None:
            return Meta(paused=pool_paused(txn, self.pool))
        return read_meta(self._meta, raw)

    def sealed(self, meta: Meta) -> bytes:
        """The bytes :meth:`save_meta` would store for ``meta`` (nothing is stored)."""
        return seal_meta(self._meta, meta)

    def save_meta(self, txn: Txn, meta: Meta) -> bytes:
        """Store ``meta``, and its entries in the store's alarm and work indexes where they
        changed (in the same transaction); returns the bytes stored."""
        raw = seal_meta(self._meta, meta)
        txn.put(self._meta, raw)
        alarm = meta.alarm
        if alarm != meta.indexed_alarm:
            if meta.indexed_alarm is not None:
                txn.delete(alarm_entry_key(meta.indexed_alarm, self.pool, self.index))
            if alarm is not None:
                txn.put(alarm_entry_key(alarm, self.pool, self.index), b"")
            meta.indexed_alarm = alarm
        work = meta.pending > 0 or meta.outbox > 0  # (Meta.has_work, without the call)
        if work != meta.indexed_work:
            entry = work_entry_key(self.pool, self.index)
            if work:
                txn.put(entry, b"")
            else:
                txn.delete(entry)
            meta.indexed_work = work
        return raw

    # -- queue --------------------------------------------------------------
    def _encoded(self, due: float) -> int:
        """``encode_due(due)``, remembered: a batch's events share one due time."""
        last, bits = self._due
        if last != due:
            bits = encode_due(due)
            self._due = (due, bits)
        return bits

    def queue_key(self, priority: int, sequence: int, due: float) -> bytes:
        """The run queue's key of an event due at ``due``."""
        rank = PRIORITY_MAX - priority
        return self._queue + _RANK_DUE_SEQ.pack(rank, self._encoded(due), sequence)

    def delayed_key(self, priority: int, sequence: int, due: float) -> bytes:
        """The key of an event not due until ``due``."""
        rank = PRIORITY_MAX - priority
        return self._wait + _DUE_RANK_SEQ.pack(self._encoded(due), rank, sequence)

    def put_event(self, txn: Txn, key: bytes, record: EventRecord) -> None:
        """Store a pending event under its queue or scheduled key (not indexed: tests
        build queues with it)."""
        txn.put(key, seal_event(key, record), overwrite=False)

    def add_event(
        self,
        txn: Txn,
        sequence: int,
        event: bytes,
        enqueued_at: float,
        partition_key: str | None,
        priority: int,
        due: float,
        dedup_key: str | None = None,
        expires_at: float | None = None,
        trace: dict[str, str] | None = None,
    ) -> None:
        """Store a new event due at ``due`` from its fields, under the queue key they make,
        and its index entry (:mod:`.events`).

        :meth:`put_event` and :meth:`queue_key` in one call, with no record built:
        this runs for every event enqueued.
        """
        last, bits = self._due  # ``_encoded`` written out
        if last != due:
            bits = encode_due(due)
            self._due = (due, bits)
        suffix = _RANK_DUE_SEQ.pack(PRIORITY_MAX - priority, bits, sequence)
        key = self._queue + suffix
        # records._EVENT_LAYOUT's order:
        body = pack((event, enqueued_at, partition_key, priority, dedup_key, expires_at, trace))
        txn.put(key, seal(key, body), overwrite=False)
        entry = self._entries + suffix[12:]  # events.seal_entry written out:
        txn.put(entry, seal(entry, _ENTRY + suffix[:12]))  # pack((rank:4 due:8,))

    def add_delayed(
        self,
        txn: Txn,
        sequence: int,
        event: bytes,
        enqueued_at: float,
        partition_key: str | None,
        priority: int,
        due: float,
        dedup_key: str | None = None,
        expires_at: float | None = None,
        trace: dict[str, str] | None = None,
    ) -> None:
        """Store a new event that is not due until ``due``, under its scheduled key."""
        key = self.delayed_key(priority, sequence, due)
        body = pack((event, enqueued_at, partition_key, priority, dedup_key, expires_at, trace))
        txn.put(key, seal(key, body), overwrite=False)
        entry = self._entries + key[-8:]  # the entry holds rank then due (.events)
        txn.put(entry, seal(entry, _ENTRY + key[-12:-8] + key[-20:-12]))

    def get_event(self, txn: Txn, key: bytes) -> EventRecord | None:
        raw = txn.get(key)
        return None if raw is None else read_event(key, raw)

    def first_event(self, txn: Txn) -> tuple[bytes, EventRecord] | None:
        """The queue's first key and its record: the next event to run, if any.

        Raises:
            DamagedRecordError: the first record is damaged (its ``key`` says which).
        """
        first = self._first_queued(txn)
        return None if first is None else (first[0], read_event(*first))

    def first_queue_key(self, txn: Txn) -> bytes | None:
        """The queue's first key (its record unread): the next event to run, if any."""
        first = self._first_queued(txn)
        return None if first is None else first[0]

    def _first_queued(self, txn: Txn) -> tuple[bytes, bytes] | None:
        queue, length = self._queue, len(self._queue) + _RANK_DUE_SEQ.size
        with txn.cursor() as cursor:
            found = cursor.set_range(queue)
            while found:
                key, raw = cursor.item()
                if not key.startswith(queue):
                    break
                if len(key) == length:
                    return bytes(key), bytes(raw)
                found = cursor.next()  # a stray key of the wrong length: not an event
        return None

    def promote(self, txn: Txn, now: float) -> Promoted:
        """Move every scheduled event due by ``now`` into the run queue, in due order.

        Each keeps its rank, due time and sequence, so its queue key orders it by its
        due time among the events already there. Its record is sealed again for its
        new key; one that fails its checksum moves with its bytes as found, so that it
        is found damaged, and dead-lettered, when its turn comes.
        """
        wait, queue = self._wait, self._queue
        length, limit = len(wait) + _DUE_RANK_SEQ.size, encode_due(now)
        moves: list[tuple[bytes, bytes, bytes]] = []
        promoted = Promoted()
        with txn.cursor() as cursor:
            found = cursor.set_range(wait)
            while found:
                key, raw = cursor.item()
                if not key.startswith(wait):
                    break
                if len(key) == length:  # else a stray key: not an event
                    bits, rank, sequence = _DUE_RANK_SEQ.unpack_from(key, len(wait))
                    due = decode_due(bits)  # not finite: no enqueue's, so moved as found
                    if bits > limit and math.isfinite(due):
                        promoted.next_due = due
                        break
                    new_key = queue + _RANK_DUE_SEQ.pack(rank, bits, sequence)
                    try:
                        value = seal(new_key, open_sealed(key, raw)) if math.isfinite(due) else raw
                    except DamagedRecordError:
                        value = raw  # damaged as found: still damaged under its new key
                    moves.append((key, new_key, value))
                    promoted.priorities.append(PRIORITY_MAX - rank)
                    promoted.last_due = due if math.isfinite(due) else promoted.last_due
                found = cursor.next()
        for key, new_key, value in moves:
            txn.delete(key)
            txn.put(new_key, value, overwrite=False)
        return promoted

    def delete_event(self, txn: Txn, key: bytes) -> None:
        """Delete a pending event and its index entry."""
        txn.delete(key)
        txn.delete(self._entries + key[-8:])

    def delete_events(self, txn: Txn) -> int:
        """Delete every pending event, due or scheduled, and the index; how many events."""
        _delete_prefix(txn, self._entries)
        length = len(self._queue) + _RANK_DUE_SEQ.size  # a stray key goes too, uncounted
        return _delete_prefix(txn, self._queue, length) + _delete_prefix(txn, self._wait, length)

    def iter_event_keys(self, txn: Txn) -> Iterator[bytes]:
        """The run queue's keys, in run order."""
        for key, _ in _iter_prefix(txn, self._queue):
            yield key

    def iter_delayed_keys(self, txn: Txn) -> Iterator[bytes]:
        """The scheduled events' keys, in due order."""
        for key, _ in _iter_prefix(txn, self._wait):
            yield key

    # -- dead letters -------------------------------------------------------
    def dead_letter_key(self, sequence: int) -> bytes:
        return self._dead + _U64.pack(sequence)

    def put_dead_letter(self, txn: Txn, sequence: int, record: DeadRecord) -> None:
        key = self.dead_letter_key(sequence)
        txn.put(key, seal_dead(key, record))

    def iter_dead_letters(self, txn: Txn) -> Iterator[tuple[int, DeadRecord]]:
        """Every dead letter by sequence; a damaged one is listed as such, not raised."""
        for key, raw in _iter_prefix(txn, self._dead, len(self._dead) + 8):
            yield dead_letter_sequence(key), _dead_or_damaged(key, raw)

    def pop_dead_letter(self, txn: Txn, sequence: int) -> DeadRecord | None:
        key = self.dead_letter_key(sequence)
        raw = txn.pop(key)
        return None if raw is None else _dead_or_damaged(key, raw)

    def delete_dead_letters(self, txn: Txn) -> int:
        return _delete_prefix(txn, self._dead)

    # -- outbox and delivery bookkeeping --------------------------------------
    def outbox_key(self, oseq: int) -> bytes:
        return self._outbox + _U64.pack(oseq)

    def put_outbox(self, txn: Txn, oseq: int, record: OutboxRecord) -> None:
        key = self.outbox_key(oseq)
        txn.put(key, seal_outbox(key, record))

    def iter_outbox(self, txn: Txn) -> Iterator[tuple[int, OutboxRecord | DamagedRecordError]]:
        """Every outbox entry by sequence; a damaged one comes as its error, not raised."""
        for key, raw in _iter_prefix(txn, self._outbox, len(self._outbox) + 8):
            try:
                record: OutboxRecord | DamagedRecordError = read_outbox(key, raw)
            except DamagedRecordError as exc:
                record = exc
            yield outbox_sequence(key), record

    def delete_outbox(self, txn: Txn, oseq: int) -> bool:
        return bool(txn.delete(self.outbox_key(oseq)))

    def mark_key(self, source_pool: str, source: int) -> bytes:
        """The key of this instance's delivery mark for instance ``source`` of ``source_pool``.

        Kept once made: a delivery reads and writes it, and an instance hears from few sources.
        """
        key = self._marks.get((source_pool, source))
        if key is None:
            key = self._marks[source_pool, source] = self._seen + _mark_suffix(source_pool, source)
        return key

    def last_delivered(self, txn: Txn, source_pool: str, source: int) -> int:
        """The last link accepted from instance ``source`` of ``source_pool`` (all below
        it were too), or -1."""
        key = self.mark_key(source_pool, source)
        raw = txn.get(key)
        return -1 if raw is None else read_link(key, raw)

    def set_delivered(self, txn: Txn, source_pool: str, source: int, link: int) -> None:
        key = self.mark_key(source_pool, source)
        txn.put(key, seal_link(key, link))

    def iter_marks(self, txn: Txn) -> Iterator[tuple[tuple[str, int], int]]:
        """Every delivery mark: its source ``(pool, index)`` and the last link accepted.

        Raises:
            DamagedRecordError: a mark is damaged.
        """
        start = len(self._seen)
        for key, raw in _iter_prefix(txn, self._seen):
            source = _mark_source(key[start:])
            if source is not None:
                yield source, read_link(key, raw)

    # -- key counts, for checkers only ----------------------------------------
    def iter_keys(self, txn: Txn) -> Iterator[tuple[RecordKind, bytes]]:
        """Every key of the namespace with its kind, in key order, without reading a value.

        Only keys of the layout (:mod:`.keys`): a stray key (an unknown tag, a suffix of the
        wrong length) is skipped, as :func:`parse_instance_key` would refuse it.
        """
        start = len(self.prefix)
        for key, _ in _iter_prefix(txn, self.prefix):
            tag = key[start : start + 1]
            if _valid_suffix(tag, key[start + 1 :]):
                yield _KIND_OF_TAG[tag], key

    def count_pending(self, txn: Txn) -> int:
        """How many queue and scheduled keys exist (the meta's ``pending``)."""
        return _count_prefix(txn, self._queue) + _count_prefix(txn, self._wait)

    def count_dead_letters(self, txn: Txn) -> int:
        """How many dead-letter keys exist (the meta's ``held_dead_letters``)."""
        return _count_prefix(txn, self._dead)

    def count_outbox(self, txn: Txn) -> int:
        """How many outbox keys exist (the meta's ``outbox``)."""
        return _count_prefix(txn, self._outbox)


def _dead_or_damaged(key: bytes, raw: bytes) -> DeadRecord:
    """A dead letter as stored, or, if it is damaged, a record that says so."""
    try:
        return read_dead(key, raw)
    except DamagedRecordError as exc:
        return DeadRecord(raw, f"DamagedRecordError: {exc.reason}", 0, 0.0, 0.0, None, 0, True)


def _iter_prefix(
    txn: Txn, prefix: bytes, length: int | None = None, start: bytes | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """The records under ``prefix``; with ``length``, only keys of that length; with
    ``start`` (a key under ``prefix``), from there on.

    A key of the wrong length is no record of the layout (``dopool check``
    reports it); skipping it keeps one stray key from stopping an instance.
    """
    with txn.cursor() as cursor:
        if not cursor.set_range(prefix if start is None else start):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            if length is None or len(key) == length:
                yield key, value


def _count_prefix(txn: Txn, prefix: bytes) -> int:
    return sum(1 for _ in _iter_prefix(txn, prefix))


def _delete_prefix(txn: Txn, prefix: bytes, length: int | None = None) -> int:
    count = 0  # of the keys deleted (with ``length``, of those of that length)
    with txn.cursor() as cursor:
        if not cursor.set_range(prefix):
            return 0
        while cursor.key().startswith(prefix):
            count += length is None or len(cursor.key()) == length
            cursor.delete()  # moves to the next key
            if not cursor.key():
                break
    return count


# -- pools -----------------------------------------------------------------------------


def get_pool(txn: Txn, name: str) -> int | None:
    """The concurrency a pool was stored with, or None for a pool never defined."""
    record = get_pool_record(txn, name)
    return None if record is None else record.concurrency


def get_pool_record(txn: Txn, name: str) -> PoolRecord | None:
    """A pool's record (its concurrency and whole-pool pause), or None if never defined."""
    key = pool_key(name)
    raw = txn.get(key)
    return None if raw is None else read_pool(key, raw)


def put_pool(txn: Txn, name: str, record: PoolRecord) -> None:
    key = pool_key(name)
    txn.put(key, seal_pool(key, record))


def set_pool_paused(txn: Txn, name: str, paused: bool) -> None:
    """Store whether ``name`` (a pool the store knows) is paused as a whole."""
    record = get_pool_record(txn, name)
    assert record is not None, f"pool {name!r} has no record"
    if record.paused != paused:
        put_pool(txn, name, record._replace(paused=paused))


def pool_paused(txn: Txn, name: str) -> bool:
    """Whether ``name`` was paused as a whole (``pool.pause()``): an instance of it never
    used starts paused. False for a pool never defined."""
    record = get_pool_record(txn, name)
    return record is not None and record.paused


def get_rate(txn: Txn, pool: str) -> RateRecord | None:
    """``pool``'s rate limit bucket, or None if it never had one.

    Raises:
        DamagedRecordError: the record fails its checks.
    """
    key = rate_key(pool)
    raw = txn.get(key)
    return None if raw is None else read_rate(key, raw)


def put_rate(txn: Txn, pool: str, record: RateRecord) -> None:
    key = rate_key(pool)
    txn.put(key, seal_rate(key, record))


def pool_records(txn: Txn) -> dict[str, int]:
    """Every pool a store knows, by name, with its stored concurrency (checked)."""
    pools = {}
    for key, raw in _iter_prefix(txn, _POOL_PREFIX):
        name = pool_name_of(key)
        if name is None:
            raise damaged(key, raw, "the pool name is not UTF-8")
        pools[name] = read_pool(key, raw).concurrency
    return pools


def follow_ups_to(txn: Txn, pool: str) -> dict[str, int]:
    """The follow-ups for ``pool`` still in an outbox: how many each instance of the
    store holds, by instance id (none listed for an instance that holds none).

    Only the instances the work index names are read (one with follow-ups in its outbox
    has work), whatever their pool, defined in this runtime or not. A damaged meta or
    outbox entry is passed over (its instance cannot run, its entry names no pool):
    ``dopool check`` reports it.
    """
    held: dict[str, int] = {}
    for key in work_index(txn):
        named = parse_work_entry(key)
        if named is None:
            continue  # no entry of the layout: dopool check reports it
        name, index = named
        namespace = Namespace(name, index)
        try:
            if not namespace.load_meta(txn).outbox:
                continue
        except DamagedRecordError:
            continue
        count = sum(
            1
            for _, record in namespace.iter_outbox(txn)
            if isinstance(record, OutboxRecord) and record.pool == pool
        )
        if count:
            held[f"{name}:{index}"] = count
    return held


def alarm_index(txn: Txn) -> Iterator[bytes]:
    """The alarm index's entries, earliest due first (:func:`.keys.parse_alarm_entry`)."""
    for key, _ in _iter_prefix(txn, alarm_index_prefix()):
        yield key


def work_index(txn: Txn, pool: str | None = None) -> Iterator[bytes]:
    """The work index's entries: ``pool``'s, or every pool's (:func:`.keys.parse_work_entry`)."""
    for key, _ in _iter_prefix(txn, work_index_prefix(pool)):
        yield key


def instances_waiting(txn: Txn, pool: str) -> list[int]:
    """The instances of ``pool`` that hold work (pending events, an attempt a crash
    interrupted, follow-ups in the outbox) or have their alarm slot set, by index: those
    an open must start, found from the store's work and alarm indexes."""
    found = set()
    for key in work_index(txn, pool):
        named = parse_work_entry(key)
        if named is not None:
            found.add(named[1])
    for key in alarm_index(txn):
        alarmed = parse_alarm_entry(key)
        if alarmed is not None and alarmed[1] == pool:
            found.add(alarmed[2])
    return sorted(found)


def used_instances(txn: Txn, pool: str) -> list[int]:
    """The instances of ``pool`` that have ever been used (any record in their namespace),
    by index. The cursor leaps from one namespace to the next, so the cost is one B-tree
    search per instance used, whatever its records and whatever the pool's size."""
    prefix = _INSTANCE_PREFIX + pool.encode() + b":"
    found = []
    with txn.cursor() as cursor:
        at = cursor.set_range(prefix)
        while at:
            key = cursor.key()
            if not key.startswith(prefix):
                break
            ident = key[len(prefix) :].partition(b"\0")[0]
            # (A key ``dopool check`` would report, its index not a number as the layout
            # writes it, names no instance.)
            if ident.isdigit() and str(int(ident)).encode() == ident:
                found.append(int(ident))
            at = cursor.set_range(prefix + ident + b"\x01")  # past every key of ``ident``
    return sorted(found)
