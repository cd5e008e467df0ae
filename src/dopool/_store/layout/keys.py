"""The store's keys: which record each key holds, and taking a key apart.

Keys (all integers big-endian, so LMDB's byte order is numeric order)::

    F                                     the format record: the store's format version
    P <pool>                              pool record: {"concurrency": N}
    I <pool>:<index> \\0 m                 instance meta (counters, flags, alarm slot)
    I <pool>:<index> \\0 q <rank:4> <due:8> <seq:8>
                                          one pending event that is due (the run queue)
    I <pool>:<index> \\0 w <due:8> <rank:4> <seq:8>
                                          one pending event not due yet (scheduled)
    I <pool>:<index> \\0 d <seq:8>          one dead letter
    I <pool>:<index> \\0 o <oseq:8>         one follow-up waiting in the outbox
    I <pool>:<index> \\0 s <source pool> \\0 <source:8>
                                          the last follow-up link accepted from a
                                          source instance (of any pool)
    I <pool>:<index> \\0 n <seq:8>          an unfinished event's index entry: its key's
                                          rank and due, so its key is found from its
                                          sequence alone
    I <pool>:<index> \\0 f <seq:8>          a finished event, remembered (keep_finished)
    I <pool>:<index> \\0 e <finished:8> <seq:8>
                                          when a remembered event finished: its expiry
    I <pool>:<index> \\0 v <name>         one value of the instance's own storage
                                          (``ctx.storage``), by its key's name
    I <pool>:<index> \\0 b <name>         a partition key's rate limit bucket
                                          (``rate_limit_per_key``), by its key's name
    I <pool>:<index> \\0 x <tat:8> <name>  that bucket's expiry: when it is full again
                                          (format 13)
    I <pool>:0 \\0 r <name>               a recurring schedule (instance 0's only)
    I <pool>:0 \\0 t <at:8> <name>        a schedule's next fire time, by time
    K <pool> \\0 <name>                   a dedup key's index entry (the pool's own)
    E <pool> \\0 <finished:8> <name>      a finished dedup key's expiry, by finish time
    L <pool> \\0 <unit:4>                 a lease: the worker serving a unit of the
                                          pool's instances (one instance per unit in
                                          a pool of up to 4,096)
    R <pool>                              a pool's rate limit bucket: its theoretical
                                          arrival time (format 13)
    W <owner>                             a live worker's presence (its owner id)
    C <producer:16> <call:8>              a producer's call an owner stored: its answer,
                                          so that the call retried is answered, not
                                          stored twice (format 14)
    A <due:8> <pool> \\0 <index:8>        the alarm index: an instance whose alarm slot
                                          is set, by due time, store-wide
    U <pool> \\0 <index:8>                the work index: an instance with pending events
                                          or follow-ups in its outbox

``rank`` is ``2**31 - 1 - priority`` and ``due`` a float's order-preserving
encoding (:func:`encode_due`), so the first queue key under an instance's prefix is
always the next event to run: higher priority first, then the earlier due time, then
FIFO. The first scheduled key is the next event to fall due; moving it into the run
queue keeps its rank, due and sequence. Enqueue is one put and dequeue one
``set_range`` through the B-tree; nothing scans.

Formats 2 to 8 gave a delivery mark's source index 4 bytes; :func:`format_8_mark` gives
such a key its format-9 form. Format 1 keyed a delivery mark by the source's index alone
(``s <source:4>``), so
sources of two pools would share one; :func:`format_1_mark` reads such a key for
the migration (:mod:`.migrate`). Format 2's queue keys had no due time
(``q <rank:4> <seq:8>``); :func:`format_2_queue_key` gives one its format-3 key.

A dedup key's ``name`` in those keys (:func:`dedup_name`) is its UTF-8 bytes, up to
:data:`DIRECT_NAME` of them; a longer key (up to 2 KiB: too long for an LMDB key, at
most 511 bytes) is named by ``0xFF`` and its BLAKE2b digest of 16 bytes. UTF-8 never
holds the byte ``0xFF``, so the two forms cannot meet. The entry holds the key itself,
and a lookup compares it. The index is the pool's, not an instance's: every instance of
a pool sees one key space.

A schedule's ``name`` in its keys (:func:`schedule_name`) follows the same rule as a
dedup key's: its UTF-8 bytes up to :data:`DIRECT_NAME` of them, else ``0xFF`` and a
BLAKE2b digest; the record holds the full name.

A stored value's ``name`` (:func:`storage_name`) keeps its key's order, which
``storage.list`` pages through: the key's UTF-8 bytes up to :data:`STORED_DIRECT` of
them, else its first :data:`STORED_DIRECT` bytes, ``0xFF`` and the BLAKE2b digest of the
whole key (16 bytes). Keys sort as their names do, but for long keys that share their
first :data:`STORED_DIRECT` bytes, which sort by digest: the reader orders such a run
by the full keys, which the records hold.

This is the only module that spells a key's bytes (``tests/store/test_layout_structure.py``).
Its names with a leading underscore are the layout's own: :mod:`.records` and
:mod:`.namespace` use them, and no module outside :mod:`dopool._store.layout` does.
"""

from __future__ import annotations

import enum
import hashlib
import math
import struct
from typing import NamedTuple

from dopool._store.layout.limits import POOL_NAME, PRIORITY_MAX

FORMAT_KEY = b"F"  # the store's format version, written when it is created
_POOL_PREFIX = b"P"
_INSTANCE_PREFIX = b"I"
# The tag after an instance's prefix: which kind of record the key holds.
_META_TAG, _QUEUE_TAG, _DEAD_TAG, _OUTBOX_TAG, _MARK_TAG = b"m", b"q", b"d", b"o", b"s"
_WAIT_TAG = b"w"  # a scheduled event, not due yet
# An unfinished event's index entry, a remembered finished event, and its expiry:
_INDEX_TAG, _FINISHED_TAG, _FORGET_TAG = b"n", b"f", b"e"
# A recurring schedule's record, and its next fire time (both in instance 0's namespace):
_RECURRING_TAG, _FIRE_TAG = b"r", b"t"
_STORED_TAG = b"v"  # a value of the instance's own storage
# A partition key's rate limit bucket, and when it is full again (``rate_limit_per_key``):
_BUCKET_TAG, _BUCKET_EXPIRY_TAG = b"b", b"x"
_DEDUP_PREFIX = b"K"  # a pool's dedup index: one entry per key
_EXPIRY_PREFIX = b"E"  # a pool's finished dedup keys, by finish time
_LEASE_PREFIX = b"L"  # a lease of a unit of a pool's instances
_RATE_PREFIX = b"R"  # a pool's rate limit bucket
_PRESENCE_PREFIX = b"W"  # a worker's presence
_CALL_PREFIX = b"C"  # a producer's call stored, by producer id and call number
#: The bytes of a producer's id in its call records' keys.
PRODUCER_ID_BYTES = 16
_ALARM_PREFIX = b"A"  # the alarm index: an entry per instance whose alarm slot is set
_WORK_PREFIX = b"U"  # the work index: an entry per instance with work (unfinished)
_DIGEST = 16  # the bytes of a long dedup key's digest
_DIGESTED = b"\xff"  # the first byte of a digested name: never in UTF-8
#: The longest dedup key, in UTF-8 bytes, that names its index entry as it is.
DIRECT_NAME = 255
#: The longest storage key, in UTF-8 bytes, that names its record as it is: with the
#: longest instance prefix (88 bytes) and a digested name, a key stays within LMDB's 511.
STORED_DIRECT = 400
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_RANK_SEQ = struct.Struct(">IQ")  # format 2's queue key suffix (the migration reads it)
_RANK_DUE_SEQ = struct.Struct(">IQQ")  # a queue key's suffix
_DUE_RANK_SEQ = struct.Struct(">QIQ")  # a scheduled key's suffix
_DUE_SEQ = struct.Struct(">QQ")  # a remembered event's expiry key's suffix
_SIGN = 1 << 63
_ALL = (1 << 64) - 1


def encode_due(due: float) -> int:
    """A due time as an unsigned 64-bit integer in the same order (the key's ``due``).

    The IEEE 754 bits, with the sign bit flipped for a positive number and every
    bit flipped for a negative one: big-endian bytes then sort as the floats do,
    ``-inf`` lowest. ``-0.0`` is taken as ``0.0``.
    """
    bits: int = _U64.unpack(_F64.pack(due + 0.0))[0]
    return bits ^ _ALL if bits & _SIGN else bits | _SIGN


def decode_due(bits: int) -> float:
    """The due time :func:`encode_due` encoded."""
    raw = bits ^ _SIGN if bits & _SIGN else bits ^ _ALL
    due: float = _F64.unpack(_U64.pack(raw))[0]
    return due


#: The due of an event stored before due times existed (format 2): it runs first.
MIGRATED_DUE = -math.inf


def queue_key_priority(key: bytes) -> int:
    """The priority encoded in a queue key (``rank:4 due:8 seq:8`` after its tag)."""
    rank: int = _U32.unpack_from(key, len(key) - _RANK_DUE_SEQ.size)[0]
    return PRIORITY_MAX - rank


def queue_key_sequence(key: bytes) -> int:
    """The sequence encoded in a queue key, or in a scheduled event's key."""
    sequence: int = _U64.unpack_from(key, len(key) - 8)[0]
    return sequence


def queue_key_due(key: bytes) -> float:
    """The due time encoded in a queue key."""
    return decode_due(_U64.unpack_from(key, len(key) - 16)[0])


def delayed_key_due(key: bytes) -> float:
    """The due time encoded in a scheduled event's key (``due:8 rank:4 seq:8``)."""
    return decode_due(_U64.unpack_from(key, len(key) - _DUE_RANK_SEQ.size)[0])


def delayed_key_priority(key: bytes) -> int:
    """The priority encoded in a scheduled event's key."""
    rank: int = _U32.unpack_from(key, len(key) - 12)[0]
    return PRIORITY_MAX - rank


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
    DELAYED = "scheduled event record"
    DEAD_LETTER = "dead letter"
    OUTBOX = "outbox entry"
    DELIVERY_MARK = "delivery mark"
    INDEX = "event index entry"
    FINISHED = "finished event record"
    FORGET = "finished event's expiry"
    SCHEDULE = "schedule record"
    FIRE = "schedule's fire time"
    STORED = "stored value"
    BUCKET = "partition key's rate limit bucket"
    BUCKET_EXPIRY = "rate limit bucket's expiry"


_KIND_OF_TAG = {
    _META_TAG: RecordKind.META,
    _QUEUE_TAG: RecordKind.EVENT,
    _WAIT_TAG: RecordKind.DELAYED,
    _DEAD_TAG: RecordKind.DEAD_LETTER,
    _OUTBOX_TAG: RecordKind.OUTBOX,
    _MARK_TAG: RecordKind.DELIVERY_MARK,
    _INDEX_TAG: RecordKind.INDEX,
    _FINISHED_TAG: RecordKind.FINISHED,
    _FORGET_TAG: RecordKind.FORGET,
    _RECURRING_TAG: RecordKind.SCHEDULE,
    _FIRE_TAG: RecordKind.FIRE,
    _STORED_TAG: RecordKind.STORED,
    _BUCKET_TAG: RecordKind.BUCKET,
    _BUCKET_EXPIRY_TAG: RecordKind.BUCKET_EXPIRY,
}
# The length of the suffix after each tag of an instance's namespace; a delivery
# mark's varies with its source's pool name (see ``_valid_suffix``).
_SUFFIX_LENGTHS = {
    _META_TAG: 0,
    _QUEUE_TAG: _RANK_DUE_SEQ.size,
    _WAIT_TAG: _DUE_RANK_SEQ.size,
    _DEAD_TAG: 8,
    _OUTBOX_TAG: 8,
    _INDEX_TAG: 8,
    _FINISHED_TAG: 8,
    _FORGET_TAG: _DUE_SEQ.size,
}


def _mark_suffix(pool: str, index: int) -> bytes:
    """A delivery mark's suffix: its source's pool, a NUL, and its source's index."""
    return pool.encode() + b"\0" + _U64.pack(index)


def _mark_source(suffix: bytes) -> tuple[str, int] | None:
    """The source ``(pool, index)`` a delivery mark's suffix names; None if it names none."""
    pool, nul, index = suffix.partition(b"\0")
    if not nul or len(index) != _U64.size:
        return None
    name = pool.decode("ascii", errors="replace")
    if not POOL_NAME.fullmatch(name):
        return None
    return name, _U64.unpack(index)[0]


def _valid_suffix(tag: bytes, suffix: bytes) -> bool:
    """Whether ``suffix`` is what the layout puts after ``tag`` in an instance's key."""
    if tag == _MARK_TAG:
        return _mark_source(suffix) is not None
    if tag in (_RECURRING_TAG, _BUCKET_TAG):
        return _valid_name(suffix)
    if tag in (_FIRE_TAG, _BUCKET_EXPIRY_TAG):
        return len(suffix) > 8 and _valid_name(suffix[8:])
    if tag == _STORED_TAG:
        return _valid_stored_name(suffix)
    return _SUFFIX_LENGTHS.get(tag) == len(suffix)


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
    if not pool or not index.isdigit() or not _valid_suffix(tag, suffix):
        return None
    return InstanceKey(pool, int(index), _KIND_OF_TAG[tag])


def mark_source(key: bytes) -> tuple[str, int]:
    """The source ``(pool, index)`` a delivery mark's key names (a key that
    :func:`parse_instance_key` read as a :attr:`RecordKind.DELIVERY_MARK`)."""
    suffix = key[key.index(b"\0") + 2 :]
    source = _mark_source(suffix)
    if source is None:
        raise ValueError(f"not a delivery mark's key: {key!r}")
    return source


def format_1_mark(key: bytes) -> tuple[str, int, int] | None:
    """``(pool, index, source index)`` if ``key`` is a format-1 delivery mark, else None.

    Format 1 keyed it ``I <pool>:<index> \\0 s <source:4>``: the source's pool was
    the instance's own.
    """
    ident, nul, rest = key[1:].partition(b"\0")
    if key[:1] != _INSTANCE_PREFIX or not nul or rest[:1] != _MARK_TAG or len(rest) != 5:
        return None
    try:
        pool, _, index = ident.decode().rpartition(":")
    except UnicodeDecodeError:
        return None
    if not pool or not index.isdigit():
        return None
    return pool, int(index), _U32.unpack_from(rest, 1)[0]


def format_8_mark(key: bytes) -> bytes | None:
    """Format 9's key for ``key`` if it is a delivery mark of formats 2 to 8, else None.

    Those keyed it ``s <source pool> \\0 <source:4>``: a source's index now takes 8 bytes
    (a per-key pool's instance is any 64-bit hash).
    """
    _, nul, rest = key[1:].partition(b"\0")
    if key[:1] != _INSTANCE_PREFIX or not nul or rest[:1] != _MARK_TAG:
        return None
    pool, nul, index = rest[1:].partition(b"\0")
    if not nul or len(index) != _U32.size or not POOL_NAME.fullmatch(pool.decode(errors="replace")):
        return None
    return key[: len(key) - _U32.size] + _U64.pack(_U32.unpack(index)[0])


def format_2_queue_key(key: bytes) -> bytes | None:
    """Format 3's key for ``key`` if it is a format-2 queue key, else None.

    Format 2 keyed a pending event ``q <rank:4> <seq:8>``: it gets the lowest due
    time (:data:`MIGRATED_DUE`), so it keeps its place, ahead of anything enqueued later.
    """
    _, nul, rest = key[1:].partition(b"\0")
    if key[:1] != _INSTANCE_PREFIX or not nul or rest[:1] != _QUEUE_TAG:
        return None
    if len(rest) != 1 + _RANK_SEQ.size:
        return None
    rank, sequence = _RANK_SEQ.unpack_from(rest, 1)
    suffix = _RANK_DUE_SEQ.pack(rank, encode_due(MIGRATED_DUE), sequence)
    return key[: -_RANK_SEQ.size] + suffix


def dedup_name(dedup_key: str) -> bytes:
    """What names a dedup key in its index entry's key: its UTF-8 bytes, or for a key over
    :data:`DIRECT_NAME` bytes, ``0xFF`` and its BLAKE2b digest (16 bytes)."""
    data = dedup_key.encode()
    if len(data) <= DIRECT_NAME:
        return data
    return _DIGESTED + hashlib.blake2b(data, digest_size=_DIGEST).digest()


def schedule_name(name: str) -> bytes:
    """What names a schedule in its keys: :func:`dedup_name`'s rule."""
    return dedup_name(name)


def bucket_name(partition_key: str) -> bytes:
    """What names a partition key's rate limit bucket in its keys: :func:`dedup_name`'s rule."""
    return dedup_name(partition_key)


def storage_name(key: str) -> bytes:
    """What names a storage key in its record's key, in the keys' order but within a run
    of long keys: its UTF-8 bytes, or for a key over :data:`STORED_DIRECT` bytes, its first
    :data:`STORED_DIRECT` bytes, ``0xFF`` and the whole key's BLAKE2b digest (16 bytes)."""
    data = key.encode()
    if len(data) <= STORED_DIRECT:
        return data
    digest = hashlib.blake2b(data, digest_size=_DIGEST).digest()
    return data[:STORED_DIRECT] + _DIGESTED + digest


def stored_run(name: bytes) -> bytes | None:
    """The first bytes a long key's name shares with the other long keys it sorts among
    by digest (None for a key's name that holds the key itself)."""
    return name[:STORED_DIRECT] if len(name) > STORED_DIRECT else None


def _valid_stored_name(name: bytes) -> bool:
    """Whether ``name`` is what :func:`storage_name` makes of some key (its first bytes
    are not checked as UTF-8: a long key's may end inside a character)."""
    if len(name) > STORED_DIRECT:
        return len(name) == STORED_DIRECT + 1 + _DIGEST and name[STORED_DIRECT:][:1] == _DIGESTED
    return _DIGESTED not in name


def fire_time(suffix: bytes) -> tuple[float, bytes]:
    """The time and the schedule's name a fire key's suffix (after its tag) holds."""
    return decode_due(_U64.unpack_from(suffix)[0]), suffix[8:]


def _valid_name(name: bytes) -> bool:
    """Whether ``name`` is what :func:`dedup_name` makes of some key."""
    if name[:1] == _DIGESTED:
        return len(name) == 1 + _DIGEST
    if not 0 < len(name) <= DIRECT_NAME:
        return False
    try:
        name.decode()
    except UnicodeDecodeError:
        return False
    return True


def dedup_prefix(pool: str) -> bytes:
    """The start of every index entry of ``pool``'s dedup keys."""
    return _DEDUP_PREFIX + pool.encode() + b"\0"


def expiry_prefix(pool: str) -> bytes:
    """The start of every expiry key of ``pool``'s finished dedup keys."""
    return _EXPIRY_PREFIX + pool.encode() + b"\0"


class DedupKey(NamedTuple):
    """A key of a pool's dedup index or expiry queue, taken apart."""

    pool: str
    expiry: bool  # an expiry key (else an index entry)
    name: bytes  # the dedup key's name (see dedup_name)
    finished_at: float | None  # an expiry key's finish time


def parse_dedup_key(key: bytes) -> DedupKey | None:
    """Take a dedup index or expiry key apart; None if it is neither."""
    prefix = key[:1]
    if prefix not in (_DEDUP_PREFIX, _EXPIRY_PREFIX):
        return None
    name, nul, rest = key[1:].partition(b"\0")
    pool = name.decode("ascii", errors="replace")
    if not nul or not POOL_NAME.fullmatch(pool):
        return None
    if prefix == _DEDUP_PREFIX:
        return DedupKey(pool, False, rest, None) if _valid_name(rest) else None
    if len(rest) <= 8 or not _valid_name(rest[8:]):
        return None
    return DedupKey(pool, True, rest[8:], decode_due(_U64.unpack_from(rest)[0]))


def expiry_key(pool: str, finished_at: float, name: bytes) -> bytes:
    """The expiry key of a dedup key (by its name) finished at ``finished_at``: they sort
    by that time."""
    return expiry_prefix(pool) + _U64.pack(encode_due(finished_at)) + name


def is_format_key(key: bytes) -> bool:
    return key == FORMAT_KEY


def pool_key(name: str) -> bytes:
    return _POOL_PREFIX + name.encode()


def rate_key(pool: str) -> bytes:
    """The key of ``pool``'s rate limit bucket (``rate_limit``)."""
    return _RATE_PREFIX + pool.encode()


def rate_pool_of(key: bytes) -> str | None:
    """The pool a rate bucket's key names; None if ``key`` is not a rate bucket's."""
    if key[:1] != _RATE_PREFIX:
        return None
    name = key[1:].decode("ascii", errors="replace")
    return name if POOL_NAME.fullmatch(name) else None


def pool_name_of(key: bytes) -> str | None:
    """The pool a pool record's key names; None if ``key`` is not a pool record's."""
    if key[:1] != _POOL_PREFIX or len(key) == 1:
        return None
    try:
        return key[1:].decode()
    except UnicodeDecodeError:
        return None


# -- leases and presences ---------------------------------------------------------

#: The longest owner id (a worker's, in its lease and presence keys), in ASCII bytes.
MAX_OWNER = 200


def lease_key(pool: str, unit: int) -> bytes:
    """The key of the lease of ``pool``'s lease unit ``unit``."""
    return _LEASE_PREFIX + pool.encode() + b"\0" + _U32.pack(unit)


def lease_prefix() -> bytes:
    """The prefix every lease key starts with."""
    return _LEASE_PREFIX


def parse_lease_key(key: bytes) -> tuple[str, int] | None:
    """The ``(pool, unit)`` a lease key names; None if ``key`` is not one."""
    if key[:1] != _LEASE_PREFIX:
        return None
    pool, nul, index = key[1:].partition(b"\0")
    if not nul or len(index) != _U32.size:
        return None
    name = pool.decode("ascii", errors="replace")
    if not POOL_NAME.fullmatch(name):
        return None
    return name, _U32.unpack(index)[0]


# -- the store-wide indexes of alarms and work ----------------------------------------
# Their entries hold nothing (b""): the key is the entry. A meta's save keeps them
# (``Namespace.save_meta``), in the transaction that changes the meta.


def alarm_entry_key(due: float, pool: str, index: int) -> bytes:
    """The alarm index's entry for instance ``index`` of ``pool``, whose alarm is ``due``."""
    return _ALARM_PREFIX + _U64.pack(encode_due(due)) + pool.encode() + b"\0" + _U64.pack(index)


def alarm_index_prefix() -> bytes:
    """The prefix every alarm index entry starts with: the first one is the earliest due."""
    return _ALARM_PREFIX


def parse_alarm_entry(key: bytes) -> tuple[float, str, int] | None:
    """The ``(due, pool, index)`` an alarm index entry names; None if ``key`` is not one."""
    if key[:1] != _ALARM_PREFIX or len(key) < 1 + 8 + 1 + 1 + 8:
        return None
    named = _entry_instance(key[9:])
    if named is None:
        return None
    return decode_due(_U64.unpack_from(key, 1)[0]), *named


def work_entry_key(pool: str, index: int) -> bytes:
    """The work index's entry for instance ``index`` of ``pool``."""
    return _WORK_PREFIX + pool.encode() + b"\0" + _U64.pack(index)


def work_index_prefix(pool: str | None = None) -> bytes:
    """The prefix of the work index's entries: ``pool``'s, or every pool's."""
    return _WORK_PREFIX if pool is None else _WORK_PREFIX + pool.encode() + b"\0"


def parse_work_entry(key: bytes) -> tuple[str, int] | None:
    """The ``(pool, index)`` a work index entry names; None if ``key`` is not one."""
    if key[:1] != _WORK_PREFIX:
        return None
    return _entry_instance(key[1:])


def _entry_instance(rest: bytes) -> tuple[str, int] | None:
    """``<pool> \\0 <index:8>``, as the index entries end, parsed."""
    pool, nul, index = rest.partition(b"\0")
    if not nul or len(index) != _U64.size:
        return None
    name = pool.decode("ascii", errors="replace")
    if not POOL_NAME.fullmatch(name):
        return None
    return name, _U64.unpack(index)[0]


def valid_owner(owner: str) -> bool:
    """Whether ``owner`` may name a worker: printable ASCII, no space, 1 to MAX_OWNER."""
    printable = owner.isascii() and owner.isprintable() and " " not in owner
    return 0 < len(owner) <= MAX_OWNER and printable


def presence_key(owner: str) -> bytes:
    """The key of a worker's presence record."""
    return _PRESENCE_PREFIX + owner.encode()


def presence_prefix() -> bytes:
    """The prefix every presence key starts with."""
    return _PRESENCE_PREFIX


def presence_owner(key: bytes) -> str | None:
    """The owner id a presence key names; None if ``key`` is not one."""
    if key[:1] != _PRESENCE_PREFIX:
        return None
    owner = key[1:].decode("ascii", errors="replace")
    return owner if valid_owner(owner) else None


# -- producers' calls stored through an owner --------------------------------------------


def call_key(producer: bytes, call: int) -> bytes:
    """The key of the record of call number ``call`` of producer ``producer``."""
    return _CALL_PREFIX + producer + _U64.pack(call)


def call_prefix(producer: bytes | None = None) -> bytes:
    """The prefix of every call record's key, or of one producer's."""
    return _CALL_PREFIX if producer is None else _CALL_PREFIX + producer


def parse_call_key(key: bytes) -> tuple[bytes, int] | None:
    """The ``(producer, call)`` a call record's key names; None if ``key`` is not one."""
    if key[:1] != _CALL_PREFIX or len(key) != 1 + PRODUCER_ID_BYTES + _U64.size:
        return None
    return key[1 : 1 + PRODUCER_ID_BYTES], _U64.unpack(key[1 + PRODUCER_ID_BYTES :])[0]


# -- keys in words -------------------------------------------------------------------


def describe_key(key: bytes) -> str:
    """Which record a key holds, in words, for errors."""
    if key == FORMAT_KEY:
        return "format record"
    if key[:1] == _POOL_PREFIX:
        return f"pool record {key[1:].decode(errors='backslashreplace')!r}"
    lease = parse_lease_key(key)
    if lease is not None:
        return f"lease of unit {lease[1]} of pool {lease[0]}"
    rated = rate_pool_of(key)
    if rated is not None:
        return f"rate limit bucket of pool {rated}"
    owner = presence_owner(key)
    if owner is not None:
        return f"presence of worker {owner}"
    call = parse_call_key(key)
    if call is not None:
        return f"call {call[1]} of producer {call[0].hex()}"
    dedup = parse_dedup_key(key)
    if dedup is not None:
        what = "dedup expiry key" if dedup.expiry else "dedup index entry"
        return f"{what} of pool {dedup.pool}"
    ident, nul, rest = key[1:].partition(b"\0")
    if key[:1] == _INSTANCE_PREFIX and nul:
        kind = _KIND_OF_TAG.get(rest[:1])
        what = "record" if kind is None else kind.value
        return f"{what} of instance {ident.decode(errors='backslashreplace')}"
    return "record"


# -- the started event ---------------------------------------------------------------


def started_event(current: bytes | None) -> tuple[int, int] | None:
    """The priority and sequence of the started event ``current`` (``Meta.current``) keys.

    None when no event's attempts have started. A plain tuple, not a named one: this
    runs as events are enqueued.
    """
    if current is None:
        return None
    rank, _, sequence = _RANK_DUE_SEQ.unpack_from(current, len(current) - _RANK_DUE_SEQ.size)
    return PRIORITY_MAX - rank, sequence
