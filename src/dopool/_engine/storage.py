"""An instance's own storage, as its handler sees it (``ctx.storage``) and as a reader
outside does (``pool.storage(...)``).

A handler's writes are buffered in its attempt and handed to the outcome's transaction:
committed with the event's success (and its follow-ups), discarded when the attempt
fails, so an event retried after a crash never applies its change twice. Its reads see
the committed values with its own writes over them. Only the instance's own successes
write its storage, and an instance runs one attempt at a time, so what a handler read
is still what is stored when its success commits. The values live in the instance's
namespace (:mod:`dopool._store.layout.storage`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from dopool._cluster.routing import stable_hash
from dopool._errors import ConfigurationError, DamagedRecordError, StorageItemError, shown
from dopool._machine.types import StorageRows
from dopool._store.layout import (
    MAX_STORAGE_KEY_BYTES,
    MAX_STORAGE_VALUE_BYTES,
    Namespace,
    StoredValues,
    describe_key,
    pack,
    unpack,
)
from dopool._store.txn import Txn

Reader = Callable[[], AbstractContextManager[Txn]]  # a read transaction of the store

#: What a handler's buffered writes hand to its success: each key's new value as
#: msgpack, or None where it deleted the key.
Writes = dict[str, bytes | None]


class ReadOnlyStorage:
    """An instance's stored values, read-only (a :class:`~dopool.StorageView`):
    ``WorkerPool.storage(...)`` and ``ProducerPool.storage(...)`` return one. Each call
    reads the values committed when it is made; values come back decoded (tuples as
    lists), a fresh copy each time.

    Raises (every method):
        StorageItemError: a key that is not a str or is over 2 KiB of UTF-8.
        DamagedRecordError: a stored value on the way failed its checks.
    """

    __slots__ = ("_read", "_rows_read", "_values", "instance_id")

    def __init__(self, read: Reader, pool: str, index: int) -> None:
        self._read = read
        self._values = StoredValues(Namespace(pool, index))
        self.instance_id = f"{pool}:{index}"
        self._rows_read = 0  # a handler's reads, as Cloudflare bills them (StorageRows)

    @classmethod
    def of(
        cls,
        read: Reader,
        pool: str,
        concurrency: int,
        partition_key: str | None,
        instance: int | None,
    ) -> ReadOnlyStorage:
        """The view of the instance ``partition_key`` routes to, or of ``instance``.

        Raises:
            ConfigurationError: neither or both given; not a str key; no such instance.
        """
        if (partition_key is None) == (instance is None):
            raise ConfigurationError("storage() takes one of partition_key= and instance=")
        if partition_key is not None:
            if not isinstance(partition_key, str):
                raise ConfigurationError(f"partition_key must be a str, got {shown(partition_key)}")
            return cls(read, pool, stable_hash(partition_key) % concurrency)
        if isinstance(instance, bool) or not isinstance(instance, int):
            raise ConfigurationError(f"instance index must be an int, got {shown(instance)}")
        if not 0 <= instance < concurrency:
            raise ConfigurationError(
                f"pool {pool!r} has no instance {instance} (concurrency {concurrency})"
            )
        return cls(read, pool, instance)

    def get(self, key: str, default: Any = None) -> Any:
        """The value under ``key``, or ``default`` if there is none."""
        key = _key(key)
        raw = self._raw(key)
        self._rows_read += 1
        return default if raw is None else self._decoded(key, raw)

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """The values under ``keys`` that have one, by key, in the order asked."""
        wanted = [_key(key) for key in keys]
        found: dict[str, Any] = {}
        with self._read() as txn:
            for key in wanted:
                raw = self._raw(key, txn)
                if raw is not None:
                    found[key] = self._decoded(key, raw)
        self._rows_read += len(wanted)
        return found

    def list(
        self,
        *,
        prefix: str = "",
        start: str | None = None,
        end: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """The values whose keys start with ``prefix``, from ``start`` (included) to
        ``end`` (excluded), at most ``limit`` of them, in key order (of the keys' UTF-8
        bytes, which is their code points' order)."""
        prefix = _bound("prefix", prefix)
        start = None if start is None else _bound("start", start)
        end = None if end is None else _bound("end", end)
        if limit is not None and (type(limit) is not int or limit < 0):
            raise ConfigurationError(f"limit must be an int >= 0 or None, got {shown(limit)}")
        listed: dict[str, Any] = {}
        if limit == 0:
            return listed
        with self._read() as txn:
            committed = ((r.key, r.value) for r in self._values.items(txn, prefix, start, end))
            for key, raw in self._overlaid(committed, prefix, start, end):
                listed[key] = self._decoded(key, raw)
                if len(listed) == limit:
                    break
        self._rows_read += max(len(listed), 1)  # an empty list is billed a row too
        return listed

    def _decoded(self, key: str, raw: bytes) -> Any:
        """A stored value, decoded; one that does not decode is a damaged record."""
        try:
            return unpack(raw)
        except Exception as exc:
            stored = self._values.key(key)
            reason = f"its value does not decode ({type(exc).__name__})"
            raise DamagedRecordError(
                key=stored, value=raw, reason=reason, what=describe_key(stored)
            ) from None

    def _raw(self, key: str, txn: Txn | None = None) -> bytes | None:
        """The value of ``key`` as msgpack (None: it has none), read in ``txn`` or a new
        read transaction."""
        if txn is None:
            with self._read() as reading:
                return self._values.get(reading, key)
        return self._values.get(txn, key)

    def _overlaid(
        self,
        committed: Iterator[tuple[str, bytes]],
        prefix: str,
        start: str | None,
        end: str | None,
    ) -> Iterator[tuple[str, bytes]]:
        """The committed values listed, with a handler's buffered writes over them."""
        return committed


class Storage(ReadOnlyStorage):
    """The instance's own storage, as its handler sees it: ``ctx.storage``.

    Writes are buffered and commit in the transaction of the event's success, with its
    follow-ups; a failed attempt (an exception, a crash, a timeout) discards them. Reads
    see the committed values with this attempt's writes over them. Keys are str of at most
    2 KiB in UTF-8; values anything msgpack encodes (as an event), at most 128 KiB
    encoded, stored as encoded when put (a later change to the object changes nothing).

    Raises (every method, besides the view's):
        StorageItemError: a value msgpack cannot encode, or over 128 KiB encoded.
        ConfigurationError: a write after the attempt ended.
    """

    __slots__ = ("_ended", "_keys", "_rows_written", "_writes")

    def __init__(self, read: Reader, pool: str, index: int) -> None:
        super().__init__(read, pool, index)
        self._writes: Writes = {}
        self._keys: list[str] = []  # the buffered keys, sorted (for list)
        self._ended = False
        self._rows_written = 0  # each key a put, put_many or delete names (StorageRows)

    def put(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` when the event's success commits."""
        key = _key(key)
        self._write(key, _encoded(key, value))

    def put_many(self, values: Mapping[str, Any]) -> None:
        """:meth:`put` each item of ``values``; one refused refuses all, none buffered."""
        checked = [(key, _encoded(key, value)) for key, value in _items(values)]
        for key, raw in checked:
            self._write(key, raw)

    def delete(self, key: str) -> bool:
        """Delete ``key`` when the event's success commits; whether it has a value now."""
        key = _key(key)
        existed = self._raw(key) is not None
        self._write(key, None)
        return existed

    def _write(self, key: str, raw: bytes | None) -> None:
        if self._ended:
            raise ConfigurationError(
                f"ctx.storage written after its attempt ended ({self.instance_id}): its "
                "writes were committed or discarded with the outcome"
            )
        if key not in self._writes:
            bisect.insort(self._keys, key)
        self._writes[key] = raw
        self._rows_written += 1

    def _end(self) -> Writes:
        """The attempt's writes, which nothing adds to now."""
        self._ended = True
        return self._writes

    def _rows(self) -> StorageRows:
        """What the handler did with the storage, in rows (:class:`StorageRows`)."""
        return StorageRows(self._rows_read, self._rows_written)

    def _raw(self, key: str, txn: Txn | None = None) -> bytes | None:
        if key in self._writes:
            return self._writes[key]
        return super()._raw(key, txn)

    def _overlaid(
        self,
        committed: Iterator[tuple[str, bytes]],
        prefix: str,
        start: str | None,
        end: str | None,
    ) -> Iterator[tuple[str, bytes]]:
        # Both are in key order: merge them. A buffered key before a committed one (both
        # at or past the start) is within the prefix and before the end as that one is.
        keys, writes = self._keys, self._writes
        low = prefix if start is None or start < prefix else start
        mine = iter(keys[bisect.bisect_left(keys, low) :])
        ahead = next(mine, None)
        for key, raw in committed:
            while ahead is not None and ahead < key:
                written = writes[ahead]
                if written is not None:
                    yield ahead, written
                ahead = next(mine, None)
            if ahead == key:  # overwritten or deleted: the buffered write stands
                written = writes[key]
                if written is not None:
                    yield key, written
                ahead = next(mine, None)
            else:
                yield key, raw
        while ahead is not None and _listed(ahead, prefix, end):
            written = writes[ahead]
            if written is not None:
                yield ahead, written
            ahead = next(mine, None)


def _listed(key: str, prefix: str, end: str | None) -> bool:
    """Whether a buffered key at or past the list's start is within it."""
    return key.startswith(prefix) and (end is None or key < end)


def _key(key: object) -> str:
    """``key`` as a plain str, held to the limit."""
    if not isinstance(key, str):
        raise StorageItemError("key", key, f"a key is a str, not {type(key).__name__}")
    key = str.__str__(key)  # a subclass's value, as a plain str
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise StorageItemError("key", key, "it is not valid text (a lone surrogate)") from None
    if size > MAX_STORAGE_KEY_BYTES:
        reason = f"{size} bytes of UTF-8, over the limit of {MAX_STORAGE_KEY_BYTES}"
        raise StorageItemError("key", key, reason, size=size, limit=MAX_STORAGE_KEY_BYTES)
    return key


def _bound(name: str, value: object) -> str:
    """A list's ``prefix``, ``start`` or ``end``: a str, as a key."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{name} must be a str, got {shown(value)}")
    return _key(value)


def _encoded(key: str, value: Any) -> bytes:
    """``value`` as msgpack, refused if it would not decode to itself or is too large."""
    try:
        raw = pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        reason = f"not msgpack-encodable ({type(exc).__name__}: {exc})"
        raise StorageItemError("value", key, reason) from exc
    try:
        unpack(raw)
    except Exception as exc:
        reason = f"encodes but does not decode ({type(exc).__name__}: {exc})"
        raise StorageItemError("value", key, reason) from exc
    if len(raw) > MAX_STORAGE_VALUE_BYTES:
        reason = f"{len(raw)} bytes encoded, over the limit of {MAX_STORAGE_VALUE_BYTES}"
        raise StorageItemError("value", key, reason, size=len(raw), limit=MAX_STORAGE_VALUE_BYTES)
    return raw


def _items(values: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    if not isinstance(values, Mapping):
        raise ConfigurationError(f"put_many takes a mapping of keys to values, got {shown(values)}")
    for key, value in values.items():
        yield _key(key), value
