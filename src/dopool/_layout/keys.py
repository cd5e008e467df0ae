"""The store's keys: which record each key holds, and taking a key apart.

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

This is the only module that spells a key's bytes (``tests/test_layout_structure.py``).
Its names with a leading underscore are the layout's own: :mod:`.records` and
:mod:`.namespace` use them, and no module outside :mod:`dopool._layout` does.
"""

from __future__ import annotations

import enum
import struct
from typing import TYPE_CHECKING, NamedTuple

from dopool._layout.limits import PRIORITY_MAX

if TYPE_CHECKING:
    from dopool._layout.records import Meta

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


# -- keys in words -------------------------------------------------------------------


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


# -- the started event ---------------------------------------------------------------


def started_event(meta: Meta) -> tuple[int, int] | None:
    """The priority and sequence of the event whose attempts have started, if any.

    A plain tuple, not a named one: this runs as events are enqueued.
    """
    current = meta.current
    if current is None:
        return None
    rank, sequence = _RANK_SEQ.unpack_from(current, len(current) - _RANK_SEQ.size)
    return PRIORITY_MAX - rank, sequence
