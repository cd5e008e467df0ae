"""A store of an older format rewritten as this one, in place, in one write transaction.

Each step rewrites what changed between two formats and leaves every other record
as it is; a store of format 1 takes both steps, in the same transaction.

Format 1 → 2: a follow-up may go to another pool, so what format 1 keyed or counted
by an instance's index alone now names the pool too (``docs/store-format.md``):

- an outbox entry gains a first field, ``pool``: format 1's went to the source's
  own pool;
- the meta's ``links`` (the next link per target) is keyed by the target's id,
  ``"<pool>:<index>"``, instead of its index;
- a delivery mark is keyed ``s <source pool> \\0 <source:4>`` instead of
  ``s <source:4>``: format 1's sources were of the marked instance's own pool.

Format 2 → 3: events may be scheduled, and due events run by due time:

- a queue key gains a due time between its rank and its sequence: format 2's get
  the lowest (``MIGRATED_DUE``), so they keep their order and run first; each
  record is sealed again for its new key;
- the meta gains ``scheduled`` (0), ``next_due`` and ``last_due`` (nil), and its
  ``current`` names the started event's new key.

Format 3 → 4: events may carry a dedup key, indexed pool by pool:

- each event record (due or scheduled) and each dead letter gains a last field,
  ``dedup_key`` (nil: no event of format 3 had one), sealed again under its key;
- the meta gains ``duplicates`` (0). No index entry is written: there are no keys.

Format 4 → 5: an event is found by its id, and finished ones are remembered:

- each pending event, due or scheduled, gets its event index entry (``n <seq:8>``),
  and its record gains a last field, ``expires_at`` (nil: no event of format 4 had a
  ttl), sealed again under its key;
- the meta gains ``cancelled``, ``expired``, ``remembered`` (0), ``last_error`` and
  ``last_started`` (nil). No finished event is remembered: none was.

Format 5 → 6: several workers may serve a store, by leases (``L <pool>:<index>``) and
presence records (``W <owner>``): a store of format 5 has none, so only the format
record changes.

Format 6 → 7: a pool may hold recurring schedules, and a follow-up may be delayed:

- the meta gains ``schedules`` (0) and ``next_fire`` (nil): no pool had a schedule;
- each outbox entry gains a last field, ``due`` (nil: due when delivered), sealed
  again under its key.

Format 7 → 8: the store keeps two indexes of its instances, store-wide (an alarm
index by due time, and a work index of the instances with pending events or
follow-ups in their outbox): each instance's entries are written from its meta, which
does not change. A damaged meta gets none (its instance cannot run).

Format 8 → 9: a pool may have up to 2**32 instances, and may be paused as a whole: each
pool record gains a last field, ``paused`` (false). A lease now covers a unit of a pool's
instances (:mod:`dopool._cluster.units`), which for every pool format 8 could hold (up to
4,096 instances) is one instance, so its leases keep their keys and meaning.

Format 9 → 10: an instance has storage of its own (``v <name>`` keys): the meta gains
``stored`` (0), since no instance of format 9 had any.

Format 10 → 11: a failed attempt keeps its traceback: each dead letter gains a last field,
``traceback``, and the meta gains ``last_traceback``, both nil (format 10 kept none).

Format 11 → 12: an event carries its enqueuer's trace context: each pending event (due or
scheduled) and each outbox entry gains a last field, ``trace``, nil (format 11 kept none).

Format 12 → 13: a pool may have a rate limit, its bucket a pool-wide key (``R <pool>``)
that no store of format 12 holds; the meta gains ``throttled_until``, nil (no instance
waited for a token).

Format 13 → 14: a producer's call stored by an owner keeps its answer under a store-wide
key (``C <producer> <call>``) that no store of format 13 holds: nothing is rewritten.

A record that fails the older format's checks is not rewritten (a record that moves
to a new key moves with its bytes as found): the new format's checks then find it
damaged, as the old ones would have. The caller commits the transaction, or rolls it
back if anything raises.
"""

from __future__ import annotations

from typing import Any

from dopool._errors import DamagedRecordError
from dopool._store.layout.events import EventIndex
from dopool._store.layout.keys import (
    _INSTANCE_PREFIX,
    _POOL_PREFIX,
    FORMAT_KEY,
    RecordKind,
    _mark_suffix,
    alarm_entry_key,
    format_1_mark,
    format_2_queue_key,
    format_8_mark,
    parse_instance_key,
    work_entry_key,
)
from dopool._store.layout.namespace import Namespace, _iter_prefix
from dopool._store.layout.records import (
    _DEAD_LAYOUT_3,
    _DEAD_LAYOUT_10,
    _EVENT_LAYOUT_3,
    _EVENT_LAYOUT_4,
    _EVENT_LAYOUT_5,
    _META_LAYOUT_2,
    _META_LAYOUT_3,
    _META_LAYOUT_4,
    _META_LAYOUT_6,
    _META_LAYOUT_8,
    _META_LAYOUT_9,
    _META_LAYOUT_10,
    _META_LAYOUT_12,
    _OUTBOX_LAYOUT_6,
    _OUTBOX_LAYOUT_7,
    Layout,
    PoolRecord,
    _laid_out,
    _tally,
    open_sealed,
    pack,
    read_link,
    read_pool_8,
    seal,
    seal_format,
    seal_link,
    seal_pool,
)
from dopool._store.txn import Txn

# The older formats' layouts of the records whose fields changed.
_META_LAYOUT_1: Layout = tuple(
    (name, _tally if name == "links" else check) for name, check in _META_LAYOUT_2
)
_META_NAMES_2 = tuple(name for name, _ in _META_LAYOUT_2)
_META_NAMES_8 = tuple(name for name, _ in _META_LAYOUT_8)
_OUTBOX_LAYOUT_1: Layout = _OUTBOX_LAYOUT_6[1:]  # no "pool"


def migrate_store(txn: Txn, found: int) -> int:
    """Rewrite a store of format ``found`` (1 to 13) in ``txn`` as this format; how many
    records changed or were added (format 5 to 6 changes none but the format record)."""
    changed = _from_1(txn) if found == 1 else 0
    changed += _from_2(txn) if found <= 2 else 0
    changed += _from_3(txn) if found <= 3 else 0
    changed += _from_4(txn) if found <= 4 else 0
    changed += _from_6(txn) if found <= 6 else 0
    changed += _from_7(txn) if found <= 7 else 0
    changed += _from_8(txn) if found <= 8 else 0
    changed += _from_9(txn) if found <= 9 else 0
    changed += _from_10(txn) if found <= 10 else 0
    changed += _from_11(txn) if found <= 11 else 0
    changed += _from_12(txn) if found <= 12 else 0
    txn.put(FORMAT_KEY, seal_format(FORMAT_KEY))
    return changed


def _instance_keys(txn: Txn) -> list[bytes]:
    with txn.cursor() as cursor:
        keys = []
        if cursor.set_range(_INSTANCE_PREFIX):
            for key in cursor.iternext(keys=True, values=False):
                if not key.startswith(_INSTANCE_PREFIX):
                    break
                keys.append(bytes(key))
    return keys


# -- format 1 to 2 ---------------------------------------------------------------------


def _from_1(txn: Txn) -> int:
    """Rewrite a format-1 store in ``txn`` as format 2; how many records changed."""
    changed = 0
    for key in _instance_keys(txn):
        value = txn.get(key)
        parsed = parse_instance_key(key)
        if parsed is not None and parsed.kind is RecordKind.META:
            changed += _meta_1(txn, key, value, parsed.pool)
        elif parsed is not None and parsed.kind is RecordKind.OUTBOX:
            changed += _outbox_1(txn, key, value, parsed.pool)
        elif (mark := format_1_mark(key)) is not None:
            _mark_1(txn, key, value, *mark)
            changed += 1
    return changed


def _meta_1(txn: Txn, key: bytes, value: bytes, pool: str) -> int:
    try:
        fields = _laid_out(key, value, _META_LAYOUT_1)
    except DamagedRecordError:
        return 0
    links = fields[_META_NAMES_2.index("links")]
    fields[_META_NAMES_2.index("links")] = {
        f"{pool}:{target}": link for target, link in sorted(links.items())
    }
    txn.put(key, seal(key, pack(fields)))  # format 2's layout: the next step reads it
    return 1


def _outbox_1(txn: Txn, key: bytes, value: bytes, pool: str) -> int:
    try:
        fields = _laid_out(key, value, _OUTBOX_LAYOUT_1)
    except DamagedRecordError:
        return 0
    txn.put(key, seal(key, pack([pool, *fields])))  # format 2's layout: later steps read it
    return 1


def _mark_1(txn: Txn, key: bytes, value: bytes, pool: str, index: int, source: int) -> None:
    new_key = Namespace(pool, index).mark_prefix + _mark_suffix(pool, source)
    try:
        new_value = seal_link(new_key, read_link(key, value))
    except DamagedRecordError:
        new_value = value  # damaged as found: still damaged under its new key
    txn.delete(key)
    txn.put(new_key, new_value)


# -- format 2 to 3 ---------------------------------------------------------------------


def _from_2(txn: Txn) -> int:
    """Rewrite a format-2 store in ``txn`` as format 3; how many records changed."""
    changed = 0
    for key in _instance_keys(txn):
        value = txn.get(key)
        parsed = parse_instance_key(key)
        if parsed is not None and parsed.kind is RecordKind.META:
            changed += _meta_2(txn, key, value)
        elif (new_key := format_2_queue_key(key)) is not None:
            _event_2(txn, key, value, new_key)
            changed += 1
    return changed


def _meta_2(txn: Txn, key: bytes, value: bytes) -> int:
    try:
        fields = _laid_out(key, value, _META_LAYOUT_2)
    except DamagedRecordError:
        return 0
    current = fields[_META_NAMES_2.index("current")]
    if current is not None:
        current = format_2_queue_key(current) or current  # else damaged
        fields[_META_NAMES_2.index("current")] = current
    fields += [0, None, None]  # scheduled, next_due, last_due: format 3's layout
    txn.put(key, seal(key, pack(fields)))  # the next step reads it
    return 1


def _event_2(txn: Txn, key: bytes, value: bytes, new_key: bytes) -> None:
    try:
        new_value = seal(new_key, open_sealed(key, value))
    except DamagedRecordError:
        new_value = value  # damaged as found: still damaged under its new key
    txn.delete(key)
    txn.put(new_key, new_value)


# -- format 3 to 4 ---------------------------------------------------------------------


def _from_3(txn: Txn) -> int:
    """Rewrite a format-3 store in ``txn`` as format 4; how many records changed."""
    return _append_fields(txn, _LAYOUTS_3, meta=[0], other=[None])  # duplicates; dedup_key


def _append_fields(
    txn: Txn, layouts: dict[RecordKind, Layout], meta: list[Any], other: list[Any]
) -> int:
    """Append fields to every sound instance record of a kind in ``layouts`` (its layout
    before): ``meta`` to a meta record, ``other`` to any other; how many changed. A record
    damaged as found stays as found, and the newer format's checks find it so too."""
    changed = 0
    for key in _instance_keys(txn):
        parsed = parse_instance_key(key)
        if parsed is None:
            continue
        layout = layouts.get(parsed.kind)
        if layout is None:
            continue
        try:
            fields = _laid_out(key, txn.get(key), layout)
        except DamagedRecordError:
            continue
        fields += meta if parsed.kind is RecordKind.META else other
        txn.put(key, seal(key, pack(fields)))
        changed += 1
    return changed


# The records format 4 added a field to, by kind, with their format-3 layouts.
_LAYOUTS_3: dict[RecordKind, Layout] = {
    RecordKind.META: _META_LAYOUT_3,
    RecordKind.EVENT: _EVENT_LAYOUT_3,
    RecordKind.DELAYED: _EVENT_LAYOUT_3,
    RecordKind.DEAD_LETTER: _DEAD_LAYOUT_3,
}


# -- format 4 to 5 ---------------------------------------------------------------------


def _from_4(txn: Txn) -> int:
    """Rewrite a format-4 store in ``txn`` as format 5; how many records changed or were
    written (index entries included)."""
    changed = 0
    for key in _instance_keys(txn):
        parsed = parse_instance_key(key)
        if parsed is None:
            continue
        if parsed.kind is RecordKind.META:
            try:
                fields = _laid_out(key, txn.get(key), _META_LAYOUT_4)
            except DamagedRecordError:
                continue  # damaged as found: format 5's checks find it so too
            fields += [0, 0, 0, None, None]  # cancelled, expired, remembered, last_*
            txn.put(key, seal(key, pack(fields)))
            changed += 1
        elif parsed.kind is RecordKind.EVENT or parsed.kind is RecordKind.DELAYED:
            # A damaged record is indexed too: its key is sound, and it is found damaged.
            EventIndex(Namespace(parsed.pool, parsed.instance)).put_entry(txn, key)
            changed += 1
            try:
                fields = _laid_out(key, txn.get(key), _EVENT_LAYOUT_4)
            except DamagedRecordError:
                continue  # damaged as found: format 5's checks find it so too
            txn.put(key, seal(key, pack([*fields, None])))  # expires_at
            changed += 1
    return changed


# -- format 6 to 7 (5 to 6 changed no record) ---------------------------------------------


def _from_6(txn: Txn) -> int:
    """Rewrite a format-6 (or 5) store in ``txn`` as format 7; how many records changed."""
    # The meta's schedules and next_fire; an outbox entry's due.
    return _append_fields(txn, _LAYOUTS_6, meta=[0, None], other=[None])


# The records format 7 added fields to, by kind, with their format-6 layouts.
_LAYOUTS_6: dict[RecordKind, Layout] = {
    RecordKind.META: _META_LAYOUT_6,
    RecordKind.OUTBOX: _OUTBOX_LAYOUT_6,
}


# -- format 7 to 8 ------------------------------------------------------------------------


def _from_7(txn: Txn) -> int:
    """Write every instance's alarm and work index entries from its meta (laid out as
    format 8's); how many."""
    written = 0
    for key in _instance_keys(txn):
        parsed = parse_instance_key(key)
        if parsed is None or parsed.kind is not RecordKind.META:
            continue
        try:
            fields = _laid_out(key, txn.get(key), _META_LAYOUT_8)
            meta = dict(zip(_META_NAMES_8, fields, strict=True))
        except DamagedRecordError:
            continue  # no entries: its instance cannot run (dopool check reports it)
        if meta["alarm"] is not None:
            txn.put(alarm_entry_key(meta["alarm"], parsed.pool, parsed.instance), b"")
            written += 1
        if meta["pending"] > 0 or meta["outbox"] > 0:
            txn.put(work_entry_key(parsed.pool, parsed.instance), b"")
            written += 1
    return written


# -- format 8 to 9 ---------------------------------------------------------------------


def _from_8(txn: Txn) -> int:
    """Give every pool record its whole-pool pause (not paused) and every meta its
    per-key pool's key (nil), and key every delivery mark by an 8-byte source index;
    how many records changed."""
    changed = 0
    for key, value in list(_iter_prefix(txn, _POOL_PREFIX)):
        try:
            concurrency = read_pool_8(key, value)
        except DamagedRecordError:
            continue  # as found: the newer checks find it damaged too
        txn.put(key, seal_pool(key, PoolRecord(concurrency, paused=False)))
        changed += 1
    for key in _instance_keys(txn):
        moved = format_8_mark(key)
        if moved is not None:
            value = txn.get(key)
            txn.delete(key)
            try:
                txn.put(moved, seal_link(moved, read_link(key, value)))
            except DamagedRecordError:
                txn.put(moved, value)  # moved with its bytes as found: damaged there too
            changed += 1
    return changed + _append_fields(txn, {RecordKind.META: _META_LAYOUT_8}, [None], [])


# -- format 9 to 10 --------------------------------------------------------------------


def _from_9(txn: Txn) -> int:
    """Give every meta its count of stored values (0: no instance had storage); how many
    records changed."""
    return _append_fields(txn, {RecordKind.META: _META_LAYOUT_9}, [0], [])


# -- format 10 to 11 -------------------------------------------------------------------


def _from_10(txn: Txn) -> int:
    """Give every dead letter and meta a traceback, nil; how many records changed."""
    layouts = {RecordKind.META: _META_LAYOUT_10, RecordKind.DEAD_LETTER: _DEAD_LAYOUT_10}
    return _append_fields(txn, layouts, [None], [None])


# -- format 11 to 12 -------------------------------------------------------------------


def _from_11(txn: Txn) -> int:
    """Give every pending event and outbox entry a trace context, nil; how many changed."""
    layouts = {
        RecordKind.EVENT: _EVENT_LAYOUT_5,
        RecordKind.DELAYED: _EVENT_LAYOUT_5,
        RecordKind.OUTBOX: _OUTBOX_LAYOUT_7,
    }
    return _append_fields(txn, layouts, [], [None])


# -- format 12 to 13 -------------------------------------------------------------------


def _from_12(txn: Txn) -> int:
    """Give every meta a rate limit wait, nil (rate buckets are new keys); how many changed."""
    return _append_fields(txn, {RecordKind.META: _META_LAYOUT_12}, [None], [])
