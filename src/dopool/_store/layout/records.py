"""The store's records: their encoding, their seal, their fields and their checks.

Every value the engine writes is sealed: a CRC-32 of the record's key and
body (4 bytes, big-endian), then the body, a msgpack array whose fields are
listed here in order (``docs/store-format.md`` documents them). Reading a
record checks the checksum, the array's length and every field's type, and
raises :class:`DamagedRecordError` if any of that is wrong, so damage is
reported instead of acted on. The field order is declared by the layouts
below, not by the order of a dataclass's fields: adding a field means a new
format version.

No other module touches msgpack: its errors become :class:`DamagedRecordError` /
:class:`EventValidationError` here.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

import msgpack

from dopool._errors import DamagedRecordError, EventValidationError
from dopool._store.layout.keys import _QUEUE_TAG, _RANK_DUE_SEQ, describe_key
from dopool._store.layout.limits import (
    FORMAT_VERSION,
    MAX_CONCURRENCY,
    MAX_TRACE_FIELDS,
    MAX_TRACE_TEXT,
    PER_KEY,
    POOL_NAME,
    PRIORITY_MAX,
    PRIORITY_MIN,
)

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


def packer() -> Any:
    """This thread's packer (:func:`pack`'s), for a loop that packs many values."""
    try:
        return _packers.packer
    except AttributeError:
        _packers.packer = msgpack.Packer(use_bin_type=True)
        return _packers.packer


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


def _instance(value: Any) -> bool:
    """An instance's index: below ``PER_KEY`` (a per-key pool's reach 2**64 - 1)."""
    return type(value) is int and 0 <= value < PER_KEY


def _integer(value: Any) -> bool:
    return type(value) is int and -(2**63) <= value < 2**63


def _priority(value: Any) -> bool:
    """A priority an enqueue accepts: it becomes a queue key's rank, 4 bytes."""
    return type(value) is int and PRIORITY_MIN <= value <= PRIORITY_MAX


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


def trace_carrier(value: Any) -> bool:
    """A trace context as a propagator injects it: nil, or a small map of text to text."""
    return value is None or (
        type(value) is dict
        and 0 < len(value) <= MAX_TRACE_FIELDS
        and all(type(k) is str and type(v) is str for k, v in value.items())
        and sum(len(k) + len(v) for k, v in value.items()) <= MAX_TRACE_TEXT
    )


def _tally(value: Any) -> bool:
    """A map of int to count (events per priority)."""
    return type(value) is dict and all(_integer(k) and _count(v) for k, v in value.items())


def _pool_name(value: Any) -> bool:
    return type(value) is str and POOL_NAME.fullmatch(value) is not None


def _instance_id(value: Any) -> bool:
    """An instance's id, ``"<pool>:<index>"``."""
    if type(value) is not str:
        return False
    pool, colon, index = value.rpartition(":")
    return bool(colon) and _pool_name(pool) and index.isdigit() and index.isascii()


def _links(value: Any) -> bool:
    """A map of instance id to count (the next follow-up link per target instance)."""
    return type(value) is dict and all(_instance_id(k) and _count(v) for k, v in value.items())


Layout = tuple[tuple[str, Check], ...]


def _laid_out(key: bytes, value: bytes, layout: Layout) -> list[Any]:
    """A sealed record's fields, each checked against ``layout``."""
    fields = _fields(key, value, len(layout))
    for (name, valid), item in zip(layout, fields, strict=True):
        if not valid(item):
            raise damaged(key, value, f"field {name!r} is {item!r}")
    return fields


# -- records -----------------------------------------------------------------------


class EventRecord(NamedTuple):
    """A pending event as stored: the encoded event plus what routing needs."""

    event: bytes
    enqueued_at: float
    partition_key: str | None
    priority: int
    dedup_key: str | None = None
    expires_at: float | None = None  # not started by then (its ttl), it expires
    trace: dict[str, str] | None = None  # the enqueuer's trace context (format 12)


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
    dedup_key: str | None = None
    traceback: str | None = None  # the last failure's (format 11), cut to MAX_TRACEBACK_TEXT


class OutboxRecord(NamedTuple):
    """A follow-up committed with its parent's outcome, waiting to reach its instance.

    It goes to instance ``target`` of pool ``pool`` (this instance's own pool, or
    another). ``link`` numbers the follow-ups from this source to that instance
    consecutively from 0, which is how the target tells a duplicate from a gap.
    """

    pool: str
    target: int
    link: int
    event: bytes
    enqueued_at: float
    partition_key: str | None
    priority: int
    due: float | None = None  # a delayed follow-up's due time (None: due when delivered)
    trace: dict[str, str] | None = None  # the parent attempt's trace context (format 12)


# Format 3's event and dead-letter layouts (the migration reads them); format 4's add
# the dedup key.
_EVENT_LAYOUT_3: Layout = (
    ("event", _blob),
    ("enqueued_at", _time),
    ("partition_key", _text_or_none),
    ("priority", _priority),
)
_EVENT_LAYOUT_4: Layout = (*_EVENT_LAYOUT_3, ("dedup_key", _text_or_none))
_EVENT_LAYOUT_5: Layout = (*_EVENT_LAYOUT_4, ("expires_at", _time_or_none))  # formats 5 to 11
_EVENT_LAYOUT: Layout = (*_EVENT_LAYOUT_5, ("trace", trace_carrier))  # format 12
_DEAD_LAYOUT_3: Layout = (
    ("event", _blob),
    ("error", _text),
    ("attempts", _count),
    ("enqueued_at", _time),
    ("failed_at", _time),
    ("partition_key", _text_or_none),
    ("priority", _priority),
    ("damaged", _flag),
)
_DEAD_LAYOUT_10: Layout = (*_DEAD_LAYOUT_3, ("dedup_key", _text_or_none))  # formats 4 to 10
_DEAD_LAYOUT: Layout = (*_DEAD_LAYOUT_10, ("traceback", _text_or_none))
_OUTBOX_LAYOUT_6: Layout = (  # formats 2 to 6
    ("pool", _pool_name),
    ("target", _instance),
    ("link", _count),
    ("event", _blob),
    ("enqueued_at", _time),
    ("partition_key", _text_or_none),
    ("priority", _priority),
)
_OUTBOX_LAYOUT_7: Layout = (*_OUTBOX_LAYOUT_6, ("due", _time_or_none))  # formats 7 to 11
_OUTBOX_LAYOUT: Layout = (*_OUTBOX_LAYOUT_7, ("trace", trace_carrier))  # format 12


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
        if type(fields) is list and len(fields) == 7:
            event, enqueued_at, partition_key, priority, dedup_key, expires_at, trace = fields
            if (
                type(event) is bytes
                and type(enqueued_at) is float
                and math.isfinite(enqueued_at)
                and (partition_key is None or type(partition_key) is str)
                and type(priority) is int
                and PRIORITY_MIN <= priority <= PRIORITY_MAX
                and (dedup_key is None or type(dedup_key) is str)
                and (
                    expires_at is None or (type(expires_at) is float and math.isfinite(expires_at))
                )
                and (trace is None or trace_carrier(trace))
            ):
                return EventRecord(*fields)
    _laid_out(key, value, _EVENT_LAYOUT)  # raises, naming what is wrong
    raise damaged(key, value, "fields of the wrong types")  # pragma: no cover


def seal_dead(key: bytes, record: DeadRecord) -> bytes:
    return seal(key, pack(record))


def read_dead(key: bytes, value: bytes) -> DeadRecord:
    return DeadRecord(*_laid_out(key, value, _DEAD_LAYOUT))


def seal_outbox(key: bytes, record: OutboxRecord) -> bytes:
    return seal(key, pack(record))


def read_outbox(key: bytes, value: bytes) -> OutboxRecord:
    return OutboxRecord(*_laid_out(key, value, _OUTBOX_LAYOUT))


def seal_link(key: bytes, link: int) -> bytes:
    return seal(key, pack([link]))


def read_link(key: bytes, value: bytes) -> int:
    (link,) = _fields(key, value, 1)
    if not (type(link) is int and 0 <= link < 2**64):
        raise damaged(key, value, f"link is {link!r}")
    return int(link)


class PoolRecord(NamedTuple):
    """A pool, as the store knows it: its number of instances (:data:`PER_KEY` for an
    instance per partition key), and whether it was paused as a whole (``pool.pause()``),
    so that an instance never used starts paused."""

    concurrency: int
    paused: bool = False


#: How a per-key pool's concurrency is stored (an instance index is any 64-bit hash).
_PER_KEY_TEXT = "per-key"


def _concurrency(value: Any) -> bool:
    return value == _PER_KEY_TEXT or (_count(value) and 1 <= value <= MAX_CONCURRENCY)


_POOL_LAYOUT: Layout = (("concurrency", _concurrency), ("paused", _flag))


def seal_pool(key: bytes, record: PoolRecord) -> bytes:
    concurrency = _PER_KEY_TEXT if record.concurrency == PER_KEY else record.concurrency
    return seal(key, pack([concurrency, record.paused]))


def read_pool(key: bytes, value: bytes) -> PoolRecord:
    """A pool record's stored concurrency (:data:`PER_KEY` for ``"per-key"``) and pause."""
    concurrency, paused = _laid_out(key, value, _POOL_LAYOUT)
    return PoolRecord(PER_KEY if concurrency == _PER_KEY_TEXT else concurrency, paused)


def read_pool_8(key: bytes, value: bytes) -> int:
    """A format-8 pool record's concurrency (the migration reads it; it had no pause)."""
    (concurrency,) = _fields(key, value, 1)
    if not (_count(concurrency) and 1 <= concurrency <= 4096):  # format 8's most
        raise damaged(key, value, f"concurrency is {concurrency!r}")
    return int(concurrency)


class RateRecord(NamedTuple):
    """A pool's rate limit bucket (:mod:`dopool._machine.rates`): its theoretical arrival
    time (None: no token taken yet), and the end of the queue of instances that booked a
    turn for a token (None: none did)."""

    tat: float | None
    booked_until: float | None


_RATE_LAYOUT: Layout = (("tat", _time_or_none), ("booked_until", _time_or_none))


def seal_rate(key: bytes, record: RateRecord) -> bytes:
    return seal(key, pack(list(record)))


def read_rate(key: bytes, value: bytes) -> RateRecord:
    return RateRecord(*_laid_out(key, value, _RATE_LAYOUT))


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
    priorities: dict[int, int] = field(default_factory=dict)  # due pending events per priority
    alarm_failures: int = 0  # consecutive failed alarm deliveries (fault injection)
    links: dict[str, int] = field(default_factory=dict)  # next outbox link per target id
    # Of ``pending``, the events not due yet, under scheduled keys (not in ``priorities``):
    scheduled: int = 0
    next_due: float | None = None  # the earliest due time among them
    # The highest due time any queue key was given: an event due when it is enqueued
    # gets at least this, so it goes behind every event already due (clock steps back).
    last_due: float | None = None
    duplicates: int = 0  # enqueues answered with an existing event (a dedup key's)
    cancelled: int = 0  # events cancelled before they ran to an outcome
    expired: int = 0  # of ``dead_lettered``, the events not started within their ttl
    remembered: int = 0  # finished events remembered (``f`` keys), for keep_finished
    last_error: str | None = None  # the current event's last failure, while in backoff
    last_traceback: str | None = None  # and its traceback (format 11)
    last_started: float | None = None  # when the current event's last attempt started
    schedules: int = 0  # recurring schedules stored (``r`` keys: instance 0's only)
    next_fire: float | None = None  # the earliest fire time among them (the first ``t`` key)
    key: str | None = None  # a per-key pool's instance: the partition key it was first sent
    stored: int = 0  # values in the instance's own storage (``v`` keys)
    # Due work waits for a token of the pool's rate limit until then (format 13): the
    # alarm slot is not set before it.
    throttled_until: float | None = None
    # Not stored in the record: what the store's alarm and work indexes hold for this
    # instance, as of the meta's load or last save (``Namespace.save_meta`` keeps them).
    indexed_alarm: float | None = field(default=None, compare=False, repr=False)
    indexed_work: bool = field(default=False, compare=False, repr=False)

    @property
    def has_work(self) -> bool:
        """Whether the instance has pending events or follow-ups not yet delivered."""
        return self.pending > 0 or self.outbox > 0


# The meta record's fields, in stored order. Independent of the dataclass's field
# order; a change here is a change of format. Format 2's (the migration reads it):
_META_LAYOUT_2: Layout = (
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
    ("links", _links),
)
# Format 3's: format 2's, then the scheduled events' fields; format 4's, then duplicates.
_META_LAYOUT_3: Layout = (
    *_META_LAYOUT_2,
    ("scheduled", _count),
    ("next_due", _time_or_none),
    ("last_due", _time_or_none),
)
_META_LAYOUT_4: Layout = (*_META_LAYOUT_3, ("duplicates", _count))
# Format 5's (and 6's: leases added no field): format 4's, then the event index's and the
# lifecycle's fields.
_META_LAYOUT_6: Layout = (
    *_META_LAYOUT_4,
    ("cancelled", _count),
    ("expired", _count),
    ("remembered", _count),
    ("last_error", _text_or_none),
    ("last_started", _time_or_none),
)
# Format 7's (and 8's): format 6's, then the recurring schedules' fields.
_META_LAYOUT_8: Layout = (*_META_LAYOUT_6, ("schedules", _count), ("next_fire", _time_or_none))
# Format 9's: format 8's, then a per-key pool's instance's partition key.
_META_LAYOUT_9: Layout = (*_META_LAYOUT_8, ("key", _text_or_none))
# Format 10's: format 9's, then the count of the instance's stored values.
_META_LAYOUT_10: Layout = (*_META_LAYOUT_9, ("stored", _count))
# Format 11's (and 12's): format 10's, then the traceback of the current event's last failure.
_META_LAYOUT_12: Layout = (*_META_LAYOUT_10, ("last_traceback", _text_or_none))
# Format 13's: format 12's, then when a token of the pool's rate limit is free again.
_META_LAYOUT: Layout = (*_META_LAYOUT_12, ("throttled_until", _time_or_none))
_META_NAMES = tuple(name for name, _ in _META_LAYOUT)
_meta_values = attrgetter(*_META_NAMES)  # every field in stored order, in one C call


def seal_meta(key: bytes, meta: Meta) -> bytes:
    return seal(key, pack(_meta_values(meta)))


def read_meta(key: bytes, value: bytes) -> Meta:
    fields = _laid_out(key, value, _META_LAYOUT)
    meta = Meta(**dict(zip(_META_NAMES, fields, strict=True)))
    # The indexes agree with the stored meta (every save keeps them so).
    meta.indexed_alarm, meta.indexed_work = meta.alarm, meta.pending > 0 or meta.outbox > 0
    current = meta.current
    # The started event's queue key: this namespace's queue tag, then rank, due, sequence.
    queue, size = key[:-1] + _QUEUE_TAG, _RANK_DUE_SEQ.size
    if current is not None and (len(current) != len(key) + size or current[:-size] != queue):
        raise damaged(key, value, f"current is {current!r}")
    if (meta.next_due is None) != (meta.scheduled == 0) or meta.scheduled > meta.pending:
        raise damaged(key, value, f"{meta.scheduled} scheduled, next due {meta.next_due!r}")
    if meta.expired > meta.dead_lettered:
        raise damaged(key, value, f"{meta.expired} expired of {meta.dead_lettered} dead")
    if meta.next_fire is not None and not meta.schedules:
        raise damaged(key, value, f"no schedule, next fire {meta.next_fire!r}")
    return meta
