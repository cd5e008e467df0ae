"""The store's layout: every key and every record, their encoding and their checks.

Keys (all integers big-endian, so LMDB's byte order is numeric order)::

    F                                     the format record: the store's format version
    P <pool>                              pool record: {"concurrency": N}
    I <pool>:<index> \\0 m                 instance meta (counters, flags, alarm slot)
    I <pool>:<index> \\0 q <rank:4> <seq:8> one pending event
    I <pool>:<index> \\0 d <seq:8>          one dead letter
    I <pool>:<index> \\0 o <oseq:8>         one follow-up waiting in the outbox
    I <pool>:<index> \\0 s <source:4>       last outbox sequence accepted from a source

``rank`` is ``2**31 - 1 - priority``, so the first queue key under an instance's
prefix is always the next event to run: higher priority first, then FIFO.
Enqueue is one put and dequeue one ``set_range`` through the B-tree; nothing scans.

Every value the engine writes is sealed: a CRC-32 of the record's key and
body (4 bytes, big-endian), then the body, a msgpack array whose fields are
listed here in order (``docs/store-format.md`` documents them). Reading a
record checks the checksum, the array's length and every field's type, and
raises :class:`DamagedRecordError` if any of that is wrong, so damage is
reported instead of acted on. The field order is declared by the layouts
below, not by the order of a dataclass's fields: adding a field means a new
format version.

Everything outside this module sees records, namespaces and parsed keys,
never a key's layout or msgpack: msgpack's errors become
:class:`DamagedRecordError` / :class:`EventValidationError` here.
"""

from __future__ import annotations

import enum
import math
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack

from dopool._errors import DamagedRecordError, EventValidationError

if TYPE_CHECKING:
    from dopool._storage import Txn

#: The version of the layout below. A store records the version it was created
#: with; a runtime refuses to open a store of any other version.
FORMAT_VERSION = 1

#: The most instances a pool may have: each is a thread, started when the pool is
#: defined. A stored pool record above it is damaged.
MAX_CONCURRENCY = 4096

# The largest event and partition key stored, encoded; the range of priorities.
MAX_EVENT_BYTES = 128 * 1024
MAX_PARTITION_KEY_BYTES = 2 * 1024
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1

# -- keys ------------------------------------------------------------------------

FORMAT_KEY = b"F"  # the store's format version, written when it is created
_POOL_PREFIX = b"P"
_INSTANCE_PREFIX = b"I"
# The tag after an instance's prefix: which kind of record the key holds.
_META_TAG, _QUEUE_TAG, _DEAD_TAG, _OUTBOX_TAG, _MARK_TAG = b"m", b"q", b"d", b"o", b"s"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_RANK_SEQ = struct.Struct(">IQ")


def queue_key_priority(key: bytes) -> int:
    """The priority encoded in a queue key (``rank:4 seq:8`` after its tag)."""
    rank: int = _U32.unpack_from(key, len(key) - 12)[0]
    return PRIORITY_MAX - rank


def queue_key_sequence(key: bytes) -> int:
    """The sequence encoded in a queue key."""
    sequence: int = _U64.unpack_from(key, len(key) - 8)[0]
    return sequence


def dead_letter_sequence(key: bytes) -> int:
    """The sequence encoded in a dead letter's key."""
    sequence: int = _U64.unpack_from(key, len(key) - 8)[0]
    return sequence


def outbox_sequence(key: bytes) -> int:
    """The outbox sequence encoded in an outbox entry's key."""
    oseq: int = _U64.unpack_from(key, len(key) - 8)[0]
    return oseq


class RecordKind(enum.Enum):
    """The kinds of record in an instance's namespace; each value names it in errors."""

    META = "meta record"
    EVENT = "event record"
    DEAD_LETTER = "dead letter"
    OUTBOX = "outbox entry"
    DELIVERY_MARK = "delivery mark"


_KIND_OF_TAG = {
    _META_TAG: RecordKind.META,
    _QUEUE_TAG: RecordKind.EVENT,
    _DEAD_TAG: RecordKind.DEAD_LETTER,
    _OUTBOX_TAG: RecordKind.OUTBOX,
    _MARK_TAG: RecordKind.DELIVERY_MARK,
}
# The length of the suffix after each tag of an instance's namespace.
_SUFFIX_LENGTHS = {
    _META_TAG: 0,
    _QUEUE_TAG: _RANK_SEQ.size,
    _DEAD_TAG: 8,
    _OUTBOX_TAG: 8,
    _MARK_TAG: 4,
}


class InstanceKey(NamedTuple):
    """A key of some instance's namespace, taken apart (see :func:`parse_instance_key`)."""

    pool: str
    instance: int
    kind: RecordKind


def parse_instance_key(key: bytes) -> InstanceKey | None:
    """Take an instance's key apart; None if it is not one of the layout above."""
    ident, nul, rest = key[1:].partition(b"\0")
    if key[:1] != _INSTANCE_PREFIX or not nul or not rest:
        return None
    try:
        pool, _, index = ident.decode().rpartition(":")
    except UnicodeDecodeError:
        return None
    tag, suffix = rest[:1], rest[1:]
    if not pool or not index.isdigit() or _SUFFIX_LENGTHS.get(tag) != len(suffix):
        return None
    return InstanceKey(pool, int(index), _KIND_OF_TAG[tag])


def is_format_key(key: bytes) -> bool:
    return key == FORMAT_KEY


def pool_key(name: str) -> bytes:
    return _POOL_PREFIX + name.encode()


def pool_name_of(key: bytes) -> str | None:
    """The pool a pool record's key names; None if ``key`` is not a pool record's."""
    if key[:1] != _POOL_PREFIX or len(key) == 1:
        return None
    try:
        return key[1:].decode()
    except UnicodeDecodeError:
        return None


# -- encoding ----------------------------------------------------------------------

_packers = threading.local()
_unpackb = msgpack.unpackb


def pack(value: Any) -> bytes:
    """Encode a value with msgpack (bytes stay bytes, str stays str).

    Each thread reuses one packer: half the cost of ``msgpack.packb`` per call.
    A packer resets itself when a value fails to encode.
    """
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(value)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    """Decode a msgpack value; maps may have non-str keys."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def encode_event(event: Any, *, position: int | None = None) -> bytes:
    """Encode a user event, refusing one that would not decode to what a handler sees.

    msgpack encodes some values it cannot decode (a tuple as a map key comes
    back as a list, which cannot be a key): such an event would be stored and
    then fail at every attempt, so it is refused here.
    """
    try:
        data = pack(event)
    except (TypeError, ValueError, OverflowError) as exc:
        raise EventValidationError(
            f"not msgpack-encodable ({type(exc).__name__}: {exc})", position=position
        ) from exc
    try:
        unpack(data)
    except Exception as exc:
        raise EventValidationError(
            f"encodes but does not decode ({type(exc).__name__}: {exc}); "
            "a tuple used as a map key is the usual cause",
            position=position,
        ) from exc
    return data


# -- sealing -------------------------------------------------------------------


def describe_key(key: bytes) -> str:
    """Which record a key holds, in words, for errors."""
    if key == FORMAT_KEY:
        return "format record"
    if key[:1] == _POOL_PREFIX:
        return f"pool record {key[1:].decode(errors='backslashreplace')!r}"
    ident, nul, rest = key[1:].partition(b"\0")
    if key[:1] == _INSTANCE_PREFIX and nul:
        kind = _KIND_OF_TAG.get(rest[:1])
        what = "record" if kind is None else kind.value
        return f"{what} of instance {ident.decode(errors='backslashreplace')}"
    return "record"


def damaged(key: bytes, value: bytes, reason: str) -> DamagedRecordError:
    """The error for a record that fails its checks, naming it."""
    return DamagedRecordError(key=key, value=value, reason=reason, what=describe_key(key))


def seal(key: bytes, body: bytes) -> bytes:
    """The stored value of ``body`` under ``key``: its checksum, then the body."""
    return zlib.crc32(body, zlib.crc32(key)).to_bytes(4, "big") + body


def open_sealed(key: bytes, value: bytes) -> bytes:
    """The body of a stored value, once its checksum matches its key and body."""
    if len(value) < 4:
        raise damaged(key, value, "shorter than its checksum")
    body = value[4:]
    if int.from_bytes(value[:4], "big") != zlib.crc32(body, zlib.crc32(key)):
        raise damaged(key, value, "checksum mismatch")
    return body


def _fields(key: bytes, value: bytes, count: int) -> list[Any]:
    """A sealed record's fields: a msgpack array of exactly ``count`` items."""
    body = open_sealed(key, value)
    try:
        fields = unpack(body)
    except Exception as exc:
        raise damaged(key, value, f"does not decode ({type(exc).__name__})") from exc
    if type(fields) is not list or len(fields) != count:
        raise damaged(key, value, f"not an array of {count} fields")
    return fields


# -- field checks ----------------------------------------------------------------

Check = Callable[[Any], bool]


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _integer(value: Any) -> bool:
    return type(value) is int and -(2**63) <= value < 2**63


def _time(value: Any) -> bool:
    return type(value) is float and math.isfinite(value)


def _time_or_none(value: Any) -> bool:
    return value is None or _time(value)


def _flag(value: Any) -> bool:
    return type(value) is bool


def _blob(value: Any) -> bool:
    return type(value) is bytes


def _blob_or_none(value: Any) -> bool:
    return value is None or type(value) is bytes


def _text(value: Any) -> bool:
    return type(value) is str


def _text_or_none(value: Any) -> bool:
    return value is None or type(value) is str


def _tally(value: Any) -> bool:
    """A map of int to count (events per priority, next link per target)."""
    return type(value) is dict and all(_integer(k) and _count(v) for k, v in value.items())


Layout = tuple[tuple[str, Check], ...]


def _check(key: bytes, value: bytes, fields: list[Any], layout: Layout) -> None:
    for (name, valid), item in zip(layout, fields, strict=True):
        if not valid(item):
            raise damaged(key, value, f"field {name!r} is {item!r}")


# -- records -----------------------------------------------------------------------


class EventRecord(NamedTuple):
    """A pending event as stored: the encoded event plus what routing needs."""

    event: bytes
    enqueued_at: float
    partition_key: str | None
    priority: int


class DeadRecord(NamedTuple):
    """A dead letter as stored.

    ``damaged`` marks one made from a record that failed its checks: its
    ``event`` is the damaged record's raw bytes, and it is never redriven.
    """

    event: bytes
    error: str
    attempts: int
    enqueued_at: float
    failed_at: float
    partition_key: str | None
    priority: int
    damaged: bool = False


class OutboxRecord(NamedTuple):
    """A follow-up committed with its parent's outcome, waiting to reach its instance.

    ``link`` numbers the follow-ups from this source to ``target`` consecutively
    from 0, which is how the target tells a duplicate from a gap.
    """

    target: int
    link: int
    event: bytes
    enqueued_at: float
    partition_key: str | None
    priority: int


_EVENT_LAYOUT: Layout = (
    ("event", _blob),
    ("enqueued_at", _time),
    ("partition_key", _text_or_none),
    ("priority", _integer),
)
_DEAD_LAYOUT: Layout = (
    ("event", _blob),
    ("error", _text),
    ("attempts", _count),
    ("enqueued_at", _time),
    ("failed_at", _time),
    ("partition_key", _text_or_none),
    ("priority", _integer),
    ("damaged", _flag),
)
_OUTBOX_LAYOUT: Layout = (
    ("target", _count),
    ("link", _count),
    ("event", _blob),
    ("enqueued_at", _time),
    ("partition_key", _text_or_none),
    ("priority", _integer),
)


def seal_event(key: bytes, record: EventRecord | tuple[Any, ...]) -> bytes:
    return seal(key, pack(record))


def read_event(key: bytes, value: bytes) -> EventRecord:
    # The checks of _fields and _EVENT_LAYOUT written out: this runs for every
    # event started. Anything they refuse goes the general way, which names why.
    body = value[4:]
    if int.from_bytes(value[:4], "big") == zlib.crc32(body, zlib.crc32(key)):
        try:
            fields = _unpackb(body, raw=False, strict_map_key=False)
        except Exception:
            fields = None
        if type(fields) is list and len(fields) == 4:
            event, enqueued_at, partition_key, priority = fields
            if (
                type(event) is bytes
                and type(enqueued_at) is float
                and math.isfinite(enqueued_at)
                and (partition_key is None or type(partition_key) is str)
                and type(priority) is int
                and -(2**63) <= priority < 2**63
            ):
                return EventRecord(event, enqueued_at, partition_key, priority)
    fields = _fields(key, value, len(_EVENT_LAYOUT))
    _check(key, value, fields, _EVENT_LAYOUT)
    raise damaged(key, value, "fields of the wrong types")  # pragma: no cover


def seal_dead(key: bytes, record: DeadRecord) -> bytes:
    return seal(key, pack(record))


def read_dead(key: bytes, value: bytes) -> DeadRecord:
    fields = _fields(key, value, len(_DEAD_LAYOUT))
    _check(key, value, fields, _DEAD_LAYOUT)
    return DeadRecord(*fields)


def seal_outbox(key: bytes, record: OutboxRecord) -> bytes:
    return seal(key, pack(record))


def read_outbox(key: bytes, value: bytes) -> OutboxRecord:
    fields = _fields(key, value, len(_OUTBOX_LAYOUT))
    _check(key, value, fields, _OUTBOX_LAYOUT)
    return OutboxRecord(*fields)


def seal_link(key: bytes, link: int) -> bytes:
    return seal(key, pack([link]))


def read_link(key: bytes, value: bytes) -> int:
    (link,) = _fields(key, value, 1)
    if not _count(link) and not (type(link) is int and 0 <= link < 2**64):
        raise damaged(key, value, f"link is {link!r}")
    return int(link)


def seal_pool(key: bytes, concurrency: int) -> bytes:
    return seal(key, pack([concurrency]))


def read_pool(key: bytes, value: bytes) -> int:
    """A pool record's stored concurrency."""
    (concurrency,) = _fields(key, value, 1)
    if not (_count(concurrency) and 1 <= concurrency <= MAX_CONCURRENCY):
        raise damaged(key, value, f"concurrency is {concurrency!r}")
    return int(concurrency)


def seal_format(key: bytes) -> bytes:
    return seal(key, pack([FORMAT_VERSION]))


def read_format(key: bytes, value: bytes) -> int:
    """The format version a store records (any int: the caller judges it)."""
    (version,) = _fields(key, value, 1)
    if not _count(version):
        raise damaged(key, value, f"version is {version!r}")
    return int(version)


# -- the instance's meta -------------------------------------------------------------


@dataclass(slots=True)
class Meta:
    """An instance's durable state, apart from the event, dead-letter and outbox keys."""

    tail: int = 0  # the next sequence to assign; every pending sequence is below it
    pending: int = 0
    enqueued: int = 0
    succeeded: int = 0
    dead_lettered: int = 0
    drained: int = 0
    paused: bool = False
    alarm: float | None = None  # the alarm slot (absolute clock time)
    current: bytes | None = None  # queue key of the event whose attempts have started
    attempt: int = 0  # attempts started for ``current``
    running: bool = False  # an attempt started and its outcome is not committed yet
    started_at: float | None = None
    retry_at: float | None = None
    restarts: int = 0
    outbox_next: int = 0
    outbox: int = 0  # outbox entries not yet acknowledged by their target
    held_dead_letters: int = 0  # dead-letter records held (dead_lettered counts them all)
    priorities: dict[int, int] = field(default_factory=dict)  # pending events per priority
    alarm_failures: int = 0  # consecutive failed alarm deliveries (fault injection)
    links: dict[int, int] = field(default_factory=dict)  # next outbox link per target


# The meta record's fields, in stored order (format 1). Independent of the
# dataclass's field order; a change here is a change of format.
_META_LAYOUT: Layout = (
    ("tail", _count),
    ("pending", _count),
    ("enqueued", _count),
    ("succeeded", _count),
    ("dead_lettered", _count),
    ("drained", _count),
    ("paused", _flag),
    ("alarm", _time_or_none),
    ("current", _blob_or_none),
    ("attempt", _count),
    ("running", _flag),
    ("started_at", _time_or_none),
    ("retry_at", _time_or_none),
    ("restarts", _count),
    ("outbox_next", _count),
    ("outbox", _count),
    ("held_dead_letters", _count),
    ("priorities", _tally),
    ("alarm_failures", _count),
    ("links", _tally),
)
_META_NAMES = tuple(name for name, _ in _META_LAYOUT)
_meta_values = attrgetter(*_META_NAMES)  # every field in stored order, in one C call


def seal_meta(key: bytes, meta: Meta) -> bytes:
    return seal(key, pack(_meta_values(meta)))


def read_meta(key: bytes, value: bytes) -> Meta:
    fields = _fields(key, value, len(_META_LAYOUT))
    _check(key, value, fields, _META_LAYOUT)
    meta = Meta(**dict(zip(_META_NAMES, fields, strict=True)))
    current = meta.current
    # The started event's queue key: this namespace's queue tag, then rank and sequence.
    queue = key[:-1] + _QUEUE_TAG
    if current is not None and (len(current) != len(key) + 12 or current[:-12] != queue):
        raise damaged(key, value, f"current is {current!r}")
    return meta


def started_event(meta: Meta) -> tuple[int, int] | None:
    """The priority and sequence of the event whose attempts have started, if any.

    A plain tuple, not a named one: this runs as events are enqueued.
    """
    current = meta.current
    if current is None:
        return None
    rank, sequence = _RANK_SEQ.unpack_from(current, len(current) - _RANK_SEQ.size)
    return PRIORITY_MAX - rank, sequence


# -- an instance's keys ---------------------------------------------------------------


class Namespace:
    """The keys of one instance. Methods take an open transaction from :class:`Store`.

    Every value is sealed and checked as above: a read raises
    :class:`DamagedRecordError` for a record that fails its checksum or layout.
    """

    __slots__ = ("_dead", "_meta", "_outbox", "_queue", "_seen", "prefix")

    def __init__(self, pool: str, index: int) -> None:
        self.prefix = _INSTANCE_PREFIX + f"{pool}:{index}".encode() + b"\0"
        self._meta = self.prefix + _META_TAG
        self._queue = self.prefix + _QUEUE_TAG
        self._dead = self.prefix + _DEAD_TAG
        self._outbox = self.prefix + _OUTBOX_TAG
        self._seen = self.prefix + _MARK_TAG

    # -- meta ---------------------------------------------------------------
    @property
    def meta_key(self) -> bytes:
        return self._meta

    def load_meta(self, txn: Txn) -> Meta:
        raw = txn.get(self._meta)
        if raw is None:
            return Meta()
        return read_meta(self._meta, raw)

    def save_meta(self, txn: Txn, meta: Meta) -> None:
        txn.put(self._meta, seal_meta(self._meta, meta))

    # -- queue --------------------------------------------------------------
    def queue_key(self, priority: int, sequence: int) -> bytes:
        return self._queue + _RANK_SEQ.pack(PRIORITY_MAX - priority, sequence)

    def put_event(self, txn: Txn, key: bytes, record: EventRecord) -> None:
        """Store a pending event under its queue key."""
        txn.put(key, seal_event(key, record), overwrite=False)

    def add_event(
        self,
        txn: Txn,
        sequence: int,
        event: bytes,
        enqueued_at: float,
        partition_key: str | None,
        priority: int,
    ) -> None:
        """Store a new pending event from its fields, under the queue key they make.

        :meth:`put_event` and :meth:`queue_key` in one call, with no record built:
        this runs for every event enqueued.
        """
        key = self._queue + _RANK_SEQ.pack(PRIORITY_MAX - priority, sequence)
        body = pack((event, enqueued_at, partition_key, priority))  # _EVENT_LAYOUT's order
        txn.put(key, seal(key, body), overwrite=False)

    def get_event(self, txn: Txn, key: bytes) -> EventRecord | None:
        raw = txn.get(key)
        return None if raw is None else read_event(key, raw)

    def first_event(self, txn: Txn) -> tuple[bytes, EventRecord] | None:
        """The queue's first key and its record: the next event to run, if any.

        Raises:
            DamagedRecordError: the first record is damaged (its ``key`` says which).
        """
        queue, length = self._queue, len(self._queue) + _RANK_SEQ.size
        with txn.cursor() as cursor:
            found = cursor.set_range(queue)
            while found:
                key, raw = cursor.item()
                if not key.startswith(queue):
                    break
                if len(key) == length:
                    return key, read_event(key, raw)
                found = cursor.next()  # a stray key of the wrong length: not an event
        return None

    def delete_event(self, txn: Txn, key: bytes) -> None:
        txn.delete(key)

    def delete_events(self, txn: Txn) -> int:
        return _delete_prefix(txn, self._queue)

    def iter_event_keys(self, txn: Txn) -> Iterator[bytes]:
        for key, _ in _iter_prefix(txn, self._queue):
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

    def last_delivered(self, txn: Txn, source: int) -> int:
        """The last link accepted from ``source`` (all below it were too), or -1."""
        key = self._seen + _U32.pack(source)
        raw = txn.get(key)
        return -1 if raw is None else read_link(key, raw)

    def set_delivered(self, txn: Txn, source: int, link: int) -> None:
        key = self._seen + _U32.pack(source)
        txn.put(key, seal_link(key, link))

    # -- key counts, for checkers only ----------------------------------------
    def iter_keys(self, txn: Txn) -> Iterator[tuple[RecordKind, bytes]]:
        """Every key of the namespace with its kind, in key order, without reading a value.

        Only keys of the layout above: a stray key (an unknown tag, a suffix of the
        wrong length) is skipped, as :func:`parse_instance_key` would refuse it.
        """
        start = len(self.prefix)
        for key, _ in _iter_prefix(txn, self.prefix):
            tag = key[start : start + 1]
            if _SUFFIX_LENGTHS.get(tag) == len(key) - start - 1:
                yield _KIND_OF_TAG[tag], key

    def count_pending(self, txn: Txn) -> int:
        """How many queue keys exist (the meta's ``pending`` should say as many)."""
        return _count_prefix(txn, self._queue)

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
    txn: Txn, prefix: bytes, length: int | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """The records under ``prefix``; with ``length``, only keys of that length.

    A key of the wrong length is no record of the layout (``dopool check``
    reports it); skipping it keeps one stray key from stopping an instance.
    """
    with txn.cursor() as cursor:
        if not cursor.set_range(prefix):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            if length is None or len(key) == length:
                yield key, value


def _count_prefix(txn: Txn, prefix: bytes) -> int:
    return sum(1 for _ in _iter_prefix(txn, prefix))


def _delete_prefix(txn: Txn, prefix: bytes) -> int:
    count = 0
    with txn.cursor() as cursor:
        if not cursor.set_range(prefix):
            return 0
        while cursor.key().startswith(prefix):
            cursor.delete()  # moves to the next key
            count += 1
            if not cursor.key():
                break
    return count


# -- pools -----------------------------------------------------------------------------


def get_pool(txn: Txn, name: str) -> int | None:
    """The concurrency a pool was stored with, or None for a pool never defined."""
    key = pool_key(name)
    raw = txn.get(key)
    return None if raw is None else read_pool(key, raw)


def put_pool(txn: Txn, name: str, concurrency: int) -> None:
    key = pool_key(name)
    txn.put(key, seal_pool(key, concurrency))


def pool_records(txn: Txn) -> dict[str, int]:
    """Every pool a store knows, by name, with its stored concurrency (checked)."""
    pools = {}
    for key, raw in _iter_prefix(txn, _POOL_PREFIX):
        name = pool_name_of(key)
        if name is None:
            raise damaged(key, raw, "the pool name is not UTF-8")
        pools[name] = read_pool(key, raw)
    return pools
