"""An instance's own storage (``ctx.storage``), read and written in a transaction.

Each value is one record under ``v <name>`` in the instance's namespace, ``name`` made
from its key by :func:`~.keys.storage_name`: the key's UTF-8 bytes, or for a long key
its first bytes, ``0xFF`` and a digest. The record holds the key itself and the value,
encoded with msgpack, so it names its key whatever form the name has; the meta's
``stored`` counts the records. Keys are listed in their order: names sort as their keys
do, but for long keys that share their first :data:`~.keys.STORED_DIRECT` bytes, which
sort by digest, so :meth:`StoredValues.items` reads such a run whole and orders it by
the keys. ``docs/store-format.md`` documents the record.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from dopool._store.layout.keys import _STORED_TAG, STORED_DIRECT, storage_name, stored_run
from dopool._store.layout.limits import MAX_STORAGE_KEY_BYTES, MAX_STORAGE_VALUE_BYTES
from dopool._store.layout.namespace import Namespace, _count_prefix, _iter_prefix
from dopool._store.layout.records import Layout, _blob, _laid_out, _text, damaged, pack, seal
from dopool._store.txn import Txn


class StoredRecord(NamedTuple):
    """A stored value: its key, and the value as msgpack."""

    key: str
    value: bytes


_STORED_LAYOUT: Layout = (("key", _text), ("value", _blob))


def read_stored(key: bytes, raw: bytes, name_at: int) -> StoredRecord:
    """The record ``raw`` under ``key``, whose name starts at ``name_at``; it must hold a
    key whose name that is, within the limits a put holds to."""
    record = StoredRecord(*_laid_out(key, raw, _STORED_LAYOUT))
    encoded = len(record.key.encode(errors="surrogatepass"))
    if encoded > MAX_STORAGE_KEY_BYTES or len(record.value) > MAX_STORAGE_VALUE_BYTES:
        raise damaged(key, raw, f"a key of {encoded} bytes, a value of {len(record.value)}")
    try:
        name = storage_name(record.key)
    except UnicodeEncodeError:
        raise damaged(key, raw, "its key is not text UTF-8 can hold") from None
    if key[name_at:] != name:
        raise damaged(key, raw, f"it holds the key {record.key[:80]!r}, stored elsewhere")
    return record


class StoredValues:
    """The stored values of one instance (``ns``). Keys and values come checked: a
    caller encodes a value (:func:`~.records.encode_event`'s rules) and holds both to
    their limits before a put."""

    __slots__ = ("_prefix",)

    def __init__(self, ns: Namespace) -> None:
        self._prefix = ns.prefix + _STORED_TAG

    def key(self, key: str) -> bytes:
        """The store's key of the value under ``key``."""
        return self._prefix + storage_name(key)

    def get(self, txn: Txn, key: str) -> bytes | None:
        """The value under ``key``, as msgpack; None if there is none.

        Raises:
            DamagedRecordError: its record fails its checks.
        """
        stored = self.key(key)
        raw = txn.get(stored)
        return None if raw is None else read_stored(stored, raw, len(self._prefix)).value

    def put(self, txn: Txn, key: str, value: bytes) -> bool:
        """Store ``value`` (msgpack) under ``key``; whether the key is new."""
        stored = self.key(key)
        new = txn.get(stored) is None
        txn.put(stored, seal(stored, pack([key, value])))
        return new

    def delete(self, txn: Txn, key: str) -> bool:
        """Delete the value under ``key``; whether there was one."""
        return bool(txn.delete(self.key(key)))

    def count(self, txn: Txn) -> int:
        """How many records there are (the meta's ``stored``; for checkers)."""
        return _count_prefix(txn, self._prefix)

    def items(
        self, txn: Txn, prefix: str = "", start: str | None = None, end: str | None = None
    ) -> Iterator[StoredRecord]:
        """The records whose keys start with ``prefix``, from ``start`` (included) to
        ``end`` (excluded), in key order.

        Raises:
            DamagedRecordError: a record on the way fails its checks.
        """
        low = prefix if start is None or start < prefix else start
        for record in self._ordered(txn, self._prefix + low.encode()[:STORED_DIRECT]):
            if end is not None and record.key >= end:
                return
            if record.key.startswith(prefix):
                if record.key >= low:
                    yield record
            elif record.key > prefix:  # past every key with the prefix
                return

    def _ordered(self, txn: Txn, seek: bytes) -> Iterator[StoredRecord]:
        """The records from ``seek`` on, in their keys' order: a run of long keys that sort
        by digest is read whole and sorted."""
        at = len(self._prefix)
        run: list[StoredRecord] = []
        run_of: bytes | None = None
        for key, raw in _iter_prefix(txn, self._prefix, start=seek):
            record = read_stored(key, raw, at)
            of = stored_run(key[at:])
            if run and of != run_of:
                yield from sorted(run)
                run = []
            if of is None:
                yield record
            else:
                run.append(record)
                run_of = of
        yield from sorted(run)
