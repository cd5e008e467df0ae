"""A store of format 1 rewritten as format 2, in place, in one write transaction.

Format 2 lets a follow-up go to another pool, so what format 1 keyed or counted by
an instance's index alone now names the pool too (``docs/store-format.md``):

- an outbox entry gains a first field, ``pool``: format 1's went to the source's
  own pool;
- the meta's ``links`` (the next link per target) is keyed by the target's id,
  ``"<pool>:<index>"``, instead of its index;
- a delivery mark is keyed ``s <source pool> \\0 <source:4>`` instead of
  ``s <source:4>``: format 1's sources were of the marked instance's own pool.

Every other record reads the same in both formats and is left as it is. A record
that fails format 1's checks is not rewritten (a mark moves to its new key, its
bytes as found): format 2's checks then find it damaged, as format 1's would have.
The caller commits the transaction, or rolls it back if anything raises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dopool._errors import DamagedRecordError
from dopool._layout.keys import (
    _INSTANCE_PREFIX,
    FORMAT_KEY,
    RecordKind,
    _mark_suffix,
    format_1_mark,
    parse_instance_key,
)
from dopool._layout.namespace import Namespace
from dopool._layout.records import (
    _META_LAYOUT,
    _META_NAMES,
    _OUTBOX_LAYOUT,
    Layout,
    Meta,
    OutboxRecord,
    _laid_out,
    _tally,
    read_link,
    seal_format,
    seal_link,
    seal_meta,
    seal_outbox,
)

if TYPE_CHECKING:
    from dopool._storage import Txn

# Format 1's layouts of the two records whose fields changed.
_META_LAYOUT_1: Layout = tuple(
    (name, _tally if name == "links" else check) for name, check in _META_LAYOUT
)
_OUTBOX_LAYOUT_1: Layout = _OUTBOX_LAYOUT[1:]  # no "pool"


def migrate_from_1(txn: Txn) -> int:
    """Rewrite a format-1 store in ``txn`` as format 2; how many records changed."""
    changed = 0
    with txn.cursor() as cursor:
        keys = []
        if cursor.set_range(_INSTANCE_PREFIX):
            for key in cursor.iternext(keys=True, values=False):
                if not key.startswith(_INSTANCE_PREFIX):
                    break
                keys.append(bytes(key))
    for key in keys:
        value = txn.get(key)
        parsed = parse_instance_key(key)
        if parsed is not None and parsed.kind is RecordKind.META:
            changed += _meta(txn, key, value, parsed.pool)
        elif parsed is not None and parsed.kind is RecordKind.OUTBOX:
            changed += _outbox(txn, key, value, parsed.pool)
        elif (mark := format_1_mark(key)) is not None:
            _mark(txn, key, value, *mark)
            changed += 1
    txn.put(FORMAT_KEY, seal_format(FORMAT_KEY))
    return changed


def _meta(txn: Txn, key: bytes, value: bytes, pool: str) -> int:
    try:
        fields = _laid_out(key, value, _META_LAYOUT_1)
    except DamagedRecordError:
        return 0
    meta = Meta(**dict(zip(_META_NAMES, fields, strict=True)))
    meta.links = {f"{pool}:{target}": link for target, link in sorted(meta.links.items())}
    txn.put(key, seal_meta(key, meta))
    return 1


def _outbox(txn: Txn, key: bytes, value: bytes, pool: str) -> int:
    try:
        fields = _laid_out(key, value, _OUTBOX_LAYOUT_1)
    except DamagedRecordError:
        return 0
    txn.put(key, seal_outbox(key, OutboxRecord(pool, *fields)))
    return 1


def _mark(txn: Txn, key: bytes, value: bytes, pool: str, index: int, source: int) -> None:
    new_key = Namespace(pool, index).mark_prefix + _mark_suffix(pool, source)
    try:
        new_value = seal_link(new_key, read_link(key, value))
    except DamagedRecordError:
        new_value = value  # damaged as found: still damaged under its new key
    txn.delete(key)
    txn.put(new_key, new_value)
