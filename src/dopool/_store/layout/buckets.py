"""The rate limit buckets of a pool's partition keys, in the instance's namespace.

A pool defined with ``rate_limit_per_key`` keeps one bucket per partition key, in the
namespace of the instance its key routes to, the only one that starts that key's
events (``docs/store-format.md``): its record under ``b <name>`` (the key itself and the
bucket's theoretical arrival time), and its expiry under ``x <tat:8> <name>``, so the
first ``x`` key is always the bucket that is full again soonest. A full bucket is
worth nothing stored (it is what no record means), so each start sweeps a few of those
(:meth:`KeyBuckets.sweep`): the buckets of keys no longer used do not pile up. ``name``
is :func:`~.keys.bucket_name`'s bytes.
"""

from __future__ import annotations

from dopool._errors import DamagedRecordError
from dopool._store.layout.keys import _BUCKET_EXPIRY_TAG, _BUCKET_TAG, _U64, decode_due, encode_due
from dopool._store.layout.keys import bucket_name as _name_of
from dopool._store.layout.namespace import Namespace, _iter_prefix
from dopool._store.layout.records import (
    Layout,
    _fields,
    _laid_out,
    _text,
    _time,
    damaged,
    pack,
    seal,
)
from dopool._store.txn import Txn

_BUCKET_LAYOUT: Layout = (("partition_key", _text), ("tat", _time))
#: The expired buckets a start removes at most.
SWEEP = 2


def read_bucket(key: bytes, value: bytes) -> tuple[str, float]:
    """A bucket record's partition key and theoretical arrival time."""
    partition_key, tat = _laid_out(key, value, _BUCKET_LAYOUT)
    if _name_of(partition_key) != key[key.index(b"\0") + 2 :]:
        raise damaged(key, value, f"its key names another partition key than {partition_key!r}")
    return partition_key, float(tat)


def read_bucket_expiry(key: bytes, value: bytes) -> float:
    """When the bucket an expiry key names is full again (the key says; the record is an
    empty array)."""
    if _fields(key, value, 0):
        raise damaged(key, value, "not empty")
    return bucket_expiry_at(key)


def bucket_expiry_at(key: bytes) -> float:
    """The time an expiry key names (a key ``parse_instance_key`` read as one)."""
    return decode_due(_U64.unpack_from(key, key.index(b"\0") + 2)[0])


class KeyBuckets:
    """One instance's partition-key buckets, read and written in a transaction."""

    __slots__ = ("_buckets", "_expiries")

    def __init__(self, namespace: Namespace) -> None:
        self._buckets = namespace.prefix + _BUCKET_TAG
        self._expiries = namespace.prefix + _BUCKET_EXPIRY_TAG

    def get(self, txn: Txn, partition_key: str) -> float | None:
        """The theoretical arrival time of ``partition_key``'s bucket; None if it has none
        (full).

        Raises:
            DamagedRecordError: its record fails its checks.
        """
        key = self._buckets + _name_of(partition_key)
        raw = txn.get(key)
        return None if raw is None else read_bucket(key, raw)[1]

    def put(self, txn: Txn, partition_key: str, tat: float, was: float | None) -> None:
        """Store ``partition_key``'s bucket at ``tat``, moving its expiry from ``was``."""
        name = _name_of(partition_key)
        if was is not None:
            txn.delete(self._expiry_key(was, name))
        key = self._buckets + name
        txn.put(key, seal(key, pack([partition_key, tat])))
        expiry = self._expiry_key(tat, name)
        txn.put(expiry, seal(expiry, pack([])))

    def sweep(self, txn: Txn, now: float, most: int = SWEEP) -> int:
        """Delete up to ``most`` buckets full again by ``now``, soonest first, with their
        expiries (an expiry whose bucket moved on, or is damaged, goes alone); how many
        expiries went."""
        gone: list[tuple[bytes, bytes | None]] = []
        for key, _value in _iter_prefix(txn, self._expiries):
            if len(gone) == most:
                break
            if len(key) <= len(self._expiries) + 8:  # no record of the layout: check says so
                continue
            suffix = key[len(self._expiries) :]
            tat = decode_due(_U64.unpack_from(suffix)[0])
            if tat > now:
                break
            bucket = self._buckets + suffix[8:]
            raw = txn.get(bucket)
            try:
                current = None if raw is None else read_bucket(bucket, raw)[1]
            except DamagedRecordError:  # the next start for its key writes it sound
                current = None
            gone.append((bytes(key), bucket if current == tat else None))
        for expiry, holding in gone:
            txn.delete(expiry)
            if holding is not None:
                txn.delete(holding)
        return len(gone)

    def _expiry_key(self, tat: float, name: bytes) -> bytes:
        return self._expiries + _U64.pack(encode_due(tat)) + name
