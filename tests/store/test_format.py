"""The store format: its version record, its pinned layout, the migrations of formats 1
to 13, and stores that are refused."""

from __future__ import annotations

import hashlib
import logging
import shutil
import traceback
from pathlib import Path

import lmdb
import pytest

from dopool import (
    DamagedRecordError,
    EventContext,
    Runtime,
    SimulatedClock,
    StoreDamagedError,
    StoreFormatError,
)
from dopool._errors import MAX_TRACEBACK_TEXT, failure_traceback
from dopool._ops.check import check_store
from dopool._ops.storeview import open_view
from dopool._store.environment import Store
from dopool._store.layout import (
    FORMAT_VERSION,
    MAX_STORAGE_KEY_BYTES,
    MAX_STORAGE_VALUE_BYTES,
    MAX_TRACE_FIELDS,
    MAX_TRACE_TEXT,
    MIGRATED_DUE,
    PER_KEY,
    PRODUCER_ID_BYTES,
    CallRecord,
    DeadRecord,
    DedupIndex,
    DedupRecord,
    EventIndex,
    EventRecord,
    FinishedRecord,
    LeaseRecord,
    Located,
    Meta,
    Namespace,
    OutboxRecord,
    PoolRecord,
    PresenceRecord,
    RateRecord,
    RecordKind,
    ScheduleBook,
    ScheduleRecord,
    StoredRecord,
    StoredValues,
    alarm_entry_key,
    all_leases,
    all_presences,
    call_key,
    call_prefix,
    encode_due,
    get_pool_record,
    lease_key,
    open_sealed,
    pack,
    parse_alarm_entry,
    parse_call_key,
    parse_dedup_key,
    parse_work_entry,
    pool_key,
    queue_key_sequence,
    read_bucket,
    read_bucket_expiry,
    read_call,
    read_dead,
    read_dedup,
    read_event,
    read_lifecycle,
    read_meta,
    read_outbox,
    read_rate,
    read_stored,
    seal,
    seal_dead,
    seal_event,
    seal_format,
    seal_meta,
    seal_outbox,
    stored_call,
    unpack,
    work_entry_key,
)
from dopool._store.layout import migrate as migration
from dopool._store.layout.dedup import seal_dedup

FIXTURES = Path(__file__).parents[1] / "support" / "fixtures"
FIXTURE_1 = FIXTURES / "store-v1"  # format 1, written at commit 837caa8 (make_store.py then)
FIXTURE_1_OUTBOX = FIXTURES / "store-v1-outbox"  # format 1, make_store_v1_outbox.py
FIXTURE_2 = FIXTURES / "store-v2"  # format 2, written at commit c2aca5a (make_store.py then)
FIXTURE_3 = FIXTURES / "store-v3"  # format 3, written at commit fa16d78 (make_store.py then)
FIXTURE_4 = FIXTURES / "store-v4"  # format 4, written at commit 9270e60 (make_store.py then)
FIXTURE_5 = FIXTURES / "store-v5"  # format 5, written at commit 5f125b8 (make_store.py then)
FIXTURE_6 = FIXTURES / "store-v6"  # format 6, written at commit a59b992 (make_store.py then)
FIXTURE_7 = FIXTURES / "store-v7"  # format 7, written at commit eb274bf (make_store.py then)
FIXTURE_8 = FIXTURES / "store-v8"  # format 8, written at commit 3719304 (make_store.py then)
FIXTURE_9 = FIXTURES / "store-v9"  # format 9, written at commit a2b332a (make_store.py then)
FIXTURE_10 = FIXTURES / "store-v10"  # format 10, written at commit e50d88c (make_store.py then)
FIXTURE_11 = FIXTURES / "store-v11"  # format 11, written at commit e6657e7 (make_store.py then)
FIXTURE_12 = FIXTURES / "store-v12"  # format 12, written at commit cb8083a (make_store.py then)
FIXTURE_13 = FIXTURES / "store-v13"  # format 13, written at commit 7a5bbde (make_store.py then)
FIXTURE_14 = FIXTURES / "store-v14"  # format 14, make_store.py
OWNER = "host-4121-0a1b2c3d"  # the worker the lease and presence of store-v6 and v7 name
# The events the fixtures of formats 1 and 2 (and format 3, at 1000.0) hold pending.
ID_5 = EventRecord(b"\x82\xa2id\x05\xa4tags\x92\xa1x\xa1y", 1000.0, "bob", 9)
ID_3 = EventRecord(b"\x82\xa2id\x03\xa4blob\xc4\x02\x00\xff", 1000.0, "alice", 0)
ID_4 = EventRecord(b"\x81\xa2id\x04", 1000.0, "alice", -2)
# The follow-up invoices:0 holds for orders:1 in the fixtures of formats 5 to 7.
REFUND_9 = OutboxRecord("orders", 1, 0, b"\x81\xa9refund_of\t", 1000.0, "alice", 1)
POISON = DeadRecord(
    b"\x82\xa2id\x02\xa6poison\xc3", "PermanentError: poisoned", 1, 1000.0, 1000.0, "bob", 3, False
)
# The tracebacks store-v11 and v12 keep, of make_store.py's handler (compiled as "<fixture>"): the
# poisoned event's, dead-lettered, and invoices' event 12's, in backoff.
POISON_TRACE = """\
Traceback (most recent call last):
  File "<fixture>", line 24, in handle
  File "<fixture>", line 13, in poison
fixture.PermanentError: poisoned"""
FLAKY_TRACE = """\
Traceback (most recent call last):
  File "<fixture>", line 26, in handle
  File "<fixture>", line 17, in fetch
fixture.Unavailable: upstream timed out fetching 12"""
# The trace contexts store-v12 keeps (make_store.py, its ids counted from 1): that of event
# 10's traced enqueue, in its scheduled record, and that of the traced attempt of event 9
# that made the follow-up {"refund_of": 9}, in invoices:0's outbox.
TRACE_10 = {"traceparent": "00-00000000000000000000000000000001-0000000000000001-01"}
TRACE_9 = {"traceparent": "00-00000000000000000000000000000002-0000000000000003-01"}


def copy(fixture: Path, tmp_path: Path) -> Path:
    path = tmp_path / fixture.name
    shutil.copytree(fixture, path)
    return path


def raw_env(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path / "data"), subdir=True)


def records(path: Path) -> dict[bytes, bytes]:
    with lmdb.open(str(path / "data"), readonly=True, lock=False) as env, env.begin() as txn:
        return dict(txn.cursor())


def test_the_fixture_of_this_format_is_the_current_version() -> None:
    assert FORMAT_VERSION == 14
    assert records(FIXTURE_14)[b"F"] == seal_format(b"F")


def pools(found: dict[bytes, bytes]) -> list[bytes]:
    """The pool records' keys: format 9 gives each record a field (the whole-pool pause)."""
    return [key for key in found if key[:1] == b"P"]


def marks(found: dict[bytes, bytes]) -> list[bytes]:
    """The delivery marks' keys: format 9 keys each by an 8-byte source index."""
    return [key for key in found if key[:1] == b"I" and key.split(b"\x00")[1][:1] == b"s"]


def nines(before: dict[bytes, bytes], after: dict[bytes, bytes]) -> list[bytes]:
    """What format 9's step changes: the pool records, the metas, and the marks (moved)."""
    metas = [key for key in after if key[:1] == b"I" and key.endswith(b"\x00m")]
    return [*pools(before), *metas, *marks(before), *marks(after)]


def dead_letters(found: dict[bytes, bytes]) -> list[bytes]:
    """The dead letters' keys: format 11 gives each record a field (the traceback)."""
    return [key for key in found if key[:1] == b"I" and key.split(b"\x00")[1][:1] == b"d"]


def outbox(found: dict[bytes, bytes]) -> list[bytes]:
    """The outbox entries among a store's records: format 12 gives each a field (the trace
    context)."""
    return [key for key in found if key[:1] == b"I" and key.split(b"\x00")[1][:1] == b"o"]


def pending_events(found: dict[bytes, bytes]) -> list[bytes]:
    """The pending events' keys, due (``q``) and scheduled (``w``): format 12 gives each
    record a field (the trace context)."""
    return [key for key in found if key[:1] == b"I" and key.split(b"\x00")[1][:1] in b"qw"]


def indexes(path: Path) -> list[bytes]:
    """The alarm and work index entries a store holds (format 8's, written from the metas:
    the migrated store's ``check_store`` checks them against the metas)."""
    return sorted(key for key in records(path) if key[:1] in (b"A", b"U"))


def entries(path: Path) -> list[bytes]:
    """The event index entries a store holds."""
    return sorted(key for key in records(path) if key[:1] == b"I" and b"\x00n" in key)


# -- format 4, migrated in place when a runtime opens it -----------------------------------


def test_the_format_4_fixture_is_migrated_to_exactly_what_was_written(tmp_path: Path) -> None:
    """store-v4, written by the format-4 code: every record reads as it was written, the
    metas with format 5's counters at 0, and each pending event gets its index entry."""
    path = copy(FIXTURE_4, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 4])
    store = Store(path)
    try:
        with store.read() as txn:
            zero, one = Namespace("orders", 0), Namespace("orders", 1)
            assert zero.load_meta(txn) == Meta(
                tail=5,
                pending=2,
                enqueued=5,
                succeeded=2,
                dead_lettered=1,
                paused=True,
                outbox_next=1,
                held_dead_letters=1,
                priorities={9: 1},
                links={"orders:1": 1},
                scheduled=1,
                next_due=1030.0,
                last_due=1000.0,
                duplicates=1,
            )
            assert one.load_meta(txn).duplicates == 0
            assert zero.get_event(txn, zero.queue_key(9, 3, 1000.0)) == ID_5._replace(
                dedup_key="order-5"
            )
            assert [one.get_event(txn, key) for key in one.iter_event_keys(txn)] == [ID_3, ID_4]
            assert list(zero.iter_dead_letters(txn)) == [(0, POISON._replace(dedup_key="order-2"))]
            index = DedupIndex("orders")
            assert index.get(txn, "order-5") == DedupRecord("order-5", 0, 3, 0, 9, 1000.0)
            assert index.get(txn, "order-2") == DedupRecord("order-2", 0, 0, 0, 3, 1000.0, 1000.0)
            assert index.get(txn, "order-1") == DedupRecord("order-1", 1, 0, 0, 0, 1000.0, 1000.0)
            assert index.count_expiries(txn) == 2
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 27)
            indexed = EventIndex(zero)
            assert [indexed.locate(txn, n) for n in (3, 4, 0)] == [
                Located(zero.queue_key(9, 3, 1000.0), False),
                Located(zero.delayed_key(2, 4, 1030.0), True),
                None,  # dead-lettered
            ]
    finally:
        store.close()
    after = records(path)
    changed = sorted(
        key for key in before.keys() | after.keys() if before.get(key) != after.get(key)
    )
    metas = [key for key in before if key[:1] == b"I" and key.endswith(b"\x00m")]
    events = [key for key in before if key[:1] == b"I" and key.split(b"\x00")[1][:1] in b"qw"]
    assert (len(metas), len(events)) == (3, 4)  # two pending events on each of orders
    assert len(entries(path)) == 4
    # events: expires_at and format 12's trace; the outbox entry: format 7's due and format
    # 12's trace; the dead letter: format 11's traceback
    assert set(changed) == {
        b"F",
        *metas,
        *events,
        *entries(path),
        *outbox(before),
        *indexes(path),
        *nines(before, after),
        *dead_letters(before),
    }


# -- format 5, migrated in place when a runtime opens it -----------------------------------


def test_the_format_5_fixture_is_migrated_to_exactly_what_was_written(tmp_path: Path) -> None:
    """store-v5, written by the format-5 code: format 6 adds leases and presences, of
    which a store of format 5 has none; format 7 gives each meta its schedules' fields and
    the outbox entry its due time; format 12 gives each pending event and the outbox entry
    a trace context, nil. So only the format record, the metas, the pending events and the
    outbox entry change (and the later steps' indexes, pool records, marks and dead
    letter), and every record reads as it was written."""
    path = copy(FIXTURE_5, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 5])
    _the_fixture_of_format_5_reads_as_written(path, records=41)
    _only_metas_events_and_the_outbox_changed(before, records(path))


# -- format 6, migrated in place when a runtime opens it -----------------------------------


def test_the_format_6_fixture_is_migrated_to_exactly_what_was_written(tmp_path: Path) -> None:
    """store-v6, written by the format-6 code (a lease and a presence over format 5's
    records): the metas gain no schedule, the outbox entry is due when delivered, the
    pending events and the outbox entry carry no trace context, the lease and the presence
    stay as they were."""
    path = copy(FIXTURE_6, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 6])
    _the_fixture_of_format_5_reads_as_written(path, records=43)
    store = Store(path)
    try:
        with store.read() as txn:
            assert list(all_leases(txn)) == [
                ("orders", 0, LeaseRecord(OWNER, 4121, "host", 2, 1030.0))
            ]
            assert list(all_presences(txn)) == [(OWNER, PresenceRecord(4121, "host", 1030.0))]
    finally:
        store.close()
    _only_metas_events_and_the_outbox_changed(before, records(path))


def _only_metas_events_and_the_outbox_changed(
    before: dict[bytes, bytes], after: dict[bytes, bytes]
) -> None:
    changed = sorted(
        key for key in before.keys() | after.keys() if before.get(key) != after.get(key)
    )
    metas = [key for key in before if key[:1] == b"I" and key.endswith(b"\x00m")]
    events = pending_events(before)  # format 12's trace
    assert (len(metas), len(events)) == (3, 4)  # two pending events on each of orders
    assert len(outbox(before)) == 1
    indexed = [key for key in after if key[:1] in (b"A", b"U")]  # format 8's indexes
    dead = dead_letters(before)  # format 11's traceback
    assert set(changed) == {
        b"F",
        *metas,
        *events,
        *outbox(before),
        *indexed,
        *nines(before, after),
        *dead,
    }
    for key in events:  # each gains a last field, nil: its trace
        assert fields(key, after) == [*fields(key, before), None]
    for key in outbox(before):  # format 7's due and format 12's trace, both nil
        assert fields(key, after) == [*fields(key, before), None, None]


# -- the committed store of format 7 ----------------------------------------------------


def test_the_format_7_fixture_decodes_to_exactly_what_was_written(tmp_path: Path) -> None:
    """A change of layout that misreads stores of format 7 fails here: the fixture of
    format 6 with three recurring schedules (one named by a digest) and a delayed
    follow-up in an outbox (store-v7, make_store.py)."""
    store = Store(copy(FIXTURE_7, tmp_path))
    try:
        with store.read() as txn:
            zero = Namespace("orders", 0)
            meta = zero.load_meta(txn)
            assert (meta.schedules, meta.next_fire, meta.paused) == (3, 8200.0, True)
            assert (meta.tail, meta.pending, meta.cancelled, meta.remembered) == (6, 2, 1, 4)
            assert Namespace("orders", 1).load_meta(txn).schedules == 0
            book = ScheduleBook(zero)
            long = "é" * 150
            assert book.get(txn, "tick") == ScheduleRecord(
                "tick", b"\x81\xa4tick\xc3", 7200.0, None, "alice", 1, 8200.0
            )
            assert book.get(txn, "nightly") == ScheduleRecord(
                "nightly", b"\x81\xa7nightly\xc3", None, "0 3 * * *", None, 0, 10800.0
            )
            assert book.get(txn, long) == ScheduleRecord(
                long, b"\x91\xa4long", 86400.0, None, None, 0, 87400.0
            )
            digest = hashlib.blake2b(long.encode(), digest_size=16).digest()
            assert book.record_key(long) == zero.prefix + b"r\xff" + digest
            assert list(book.fires(txn)) == [
                (8200.0, b"tick"),
                (10800.0, b"nightly"),
                (87400.0, book.name_key(long)),
            ]
            assert list(Namespace("invoices", 0).iter_outbox(txn)) == [
                (1, REFUND_9._replace(due=1045.0))
            ]
            assert list(all_leases(txn)) == [
                ("orders", 0, LeaseRecord(OWNER, 4121, "host", 2, 1030.0))
            ]
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 49)
    finally:
        store.close()


def test_the_format_7_fixture_gains_exactly_the_index_entries_of_its_metas(
    tmp_path: Path,
) -> None:
    """store-v7, written by the format-7 code: the migration to format 8 writes a work
    entry for each instance with pending events or an outbox (orders:0 and orders:1 hold
    events, paused; invoices:0 a follow-up) and no alarm entry (no alarm slot is set),
    and changes nothing else but the format record (and the later steps': format 9's pool
    records, metas and marks, format 11's dead letter, and format 12's trace in each
    pending event and the outbox entry)."""
    path = copy(FIXTURE_7, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 7])
    Store(path).close()  # opening migrates it
    after = records(path)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    work = [work_entry_key("invoices", 0), work_entry_key("orders", 0), work_entry_key("orders", 1)]
    assert set(changed) == {
        b"F",
        *work,
        *nines(before, after),
        *dead_letters(before),
        *pending_events(before),
        *outbox(before),
    }
    assert [after[key] for key in work] == [b"", b"", b""]
    eight = copy(FIXTURE_8, tmp_path / "8")
    Store(eight).close()
    assert records(eight) == after  # what make_store.py wrote at format 8, migrated alike


# -- the committed store of format 8 ----------------------------------------------------


def test_the_format_8_fixture_gains_the_whole_pool_pause_in_its_pool_records(
    tmp_path: Path,
) -> None:
    """store-v8, written by the format-8 code: the migration to format 9 gives each pool
    record a last field, ``paused`` (false: format 8 paused instances one by one), each
    meta a last field, ``key`` (nil: no pool had an instance per key), and each delivery
    mark's key an 8-byte source index, and changes nothing else but the format record
    (and the later steps: format 10's, every meta's ``stored``, format 11's, every meta's
    ``last_traceback`` and every dead letter's ``traceback``, and format 12's, every pending
    event's and outbox entry's ``trace``). make_store.py's format-9 version paused orders as
    a whole, so store-v9, migrated alike, differs from it there alone."""
    path = copy(FIXTURE_8, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 8])
    assert before[pool_key("orders")][4:] == bytes([0x91, 2])  # [concurrency]
    Store(path).close()  # opening migrates it
    after = records(path)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert set(changed) == {
        b"F",
        *nines(before, after),
        *dead_letters(before),
        *pending_events(before),
        *outbox(before),
    }
    assert len(marks(before)) == len(marks(after)) == 3  # each moved, none lost
    for mark in marks(before):
        assert mark not in after
        moved = mark[:-4] + bytes(4) + mark[-4:]  # the same index, in 8 bytes
        assert after[moved][4:] == before[mark][4:]  # the same link, sealed for its key
    assert after[pool_key("orders")][4:] == bytes([0x92, 2, 0xC2])  # [concurrency, false]
    assert after[pool_key("invoices")][4:] == bytes([0x92, 1, 0xC2])
    nine_path = copy(FIXTURE_9, tmp_path / "9")
    Store(nine_path).close()
    nine = records(nine_path)
    assert nine[pool_key("orders")][4:] == bytes([0x92, 2, 0xC3])  # paused as a whole
    assert {k: v for k, v in nine.items() if k != pool_key("orders")} == {
        k: v for k, v in after.items() if k != pool_key("orders")
    }  # what make_store.py wrote at format 9, byte for byte, but that pause
    store = Store(nine_path)
    try:
        with store.read() as txn:
            assert get_pool_record(txn, "orders") == PoolRecord(2, paused=True)
            assert get_pool_record(txn, "invoices") == PoolRecord(1, paused=False)
    finally:
        store.close()


# -- the committed store of format 9 ----------------------------------------------------


def stored(found: dict[bytes, bytes]) -> list[bytes]:
    """The stored values' keys (format 10's), in the store's order."""
    return [key for key in found if key[:1] == b"I" and key.split(b"\x00")[1][:1] == b"v"]


def fields(key: bytes, found: dict[bytes, bytes]) -> list[object]:
    """The fields of the record under ``key``."""
    return list(unpack(open_sealed(key, found[key])))


def test_the_format_9_fixture_gains_a_count_of_stored_values_in_its_metas(
    tmp_path: Path,
) -> None:
    """store-v9, written by the format-9 code: the migration to format 10 gives each meta
    a last field, ``stored`` (0: no instance had storage of its own), and changes nothing
    else but the format record (and format 11's step: each meta's ``last_traceback`` and
    each dead letter's ``traceback``, nil; and format 12's: each pending event's and outbox
    entry's ``trace``, nil). make_store.py's format-10 version stored three values in
    orders:1's storage, so store-v10, migrated alike, differs from it there alone: those
    records and that meta."""
    path = copy(FIXTURE_9, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 9])
    store = Store(path)  # opening migrates it
    try:
        with store.read() as txn:
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 49)
    finally:
        store.close()
    after = records(path)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    metas = [key for key in before if key[:1] == b"I" and key.endswith(b"\x00m")]
    dead, events = dead_letters(before), pending_events(before)
    assert (len(metas), len(dead), len(events), len(outbox(before))) == (3, 1, 4, 1)
    assert changed == {b"F", *metas, *dead, *events, *outbox(before)}
    for meta in metas:  # format 10's count, format 11's traceback, format 13's wait
        assert fields(meta, after) == [*fields(meta, before), 0, None, None]
    for key in [*dead, *events, *outbox(before)]:
        assert fields(key, after) == [*fields(key, before), None]
    ten_path = copy(FIXTURE_10, tmp_path / "10")
    Store(ten_path).close()
    ten = records(ten_path)
    meta = Namespace("orders", 1).meta_key
    assert len(stored(ten)) == 3
    assert {k: v for k, v in ten.items() if k not in {meta, *stored(ten)}} == {
        k: v for k, v in after.items() if k != meta
    }  # what make_store.py wrote at format 10, byte for byte, but orders:1's storage
    assert fields(meta, ten) == [*fields(meta, after)[:-3], 3, None, None]


# -- the committed store of format 10 ---------------------------------------------------

LONG = "é" * 200  # 400 bytes of UTF-8: the longest storage key named as it is


def test_the_format_10_fixture_decodes_to_exactly_what_was_written(tmp_path: Path) -> None:
    """orders:1's storage, as make_store.py's handler put it at event 7's success: a short
    key and two long ones sharing their first 400 bytes, whose records sort by digest the
    other way round; the poisoned event's put went with its failed attempt."""
    one, zero = StoredValues(Namespace("orders", 1)), StoredValues(Namespace("orders", 0))
    assert stored(records(FIXTURE_10)) == [
        one.key("billed"),
        one.key(LONG + "y"),
        one.key(LONG + "x"),
    ]
    store = Store(copy(FIXTURE_10, tmp_path))
    try:
        with store.read() as txn:
            assert list(one.items(txn)) == [
                StoredRecord("billed", pack([7])),
                StoredRecord(LONG + "x", pack({"blob": b"\x00\xff"})),
                StoredRecord(LONG + "y", pack(1.5)),
            ]
            assert one.get(txn, LONG + "y") == pack(1.5)
            assert (Namespace("orders", 1).load_meta(txn).stored, one.count(txn)) == (3, 3)
            assert (Namespace("orders", 0).load_meta(txn).stored, zero.count(txn)) == (0, 0)
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 52)
    finally:
        store.close()


def test_the_format_10_fixture_gains_a_nil_traceback_in_its_dead_letters_and_metas(
    tmp_path: Path,
) -> None:
    """store-v10, written by the format-10 code: the migration to format 11 gives each dead
    letter a last field, ``traceback``, and each meta a last field, ``last_traceback``, both
    nil (format 10 kept no traceback), and changes nothing else but the format record (and
    format 12's step: each pending event's and outbox entry's ``trace``, nil).
    make_store.py's format-11 version dead-lettered the poisoned event with its traceback
    and left invoices' event 12 in backoff after a failure, so store-v11, migrated alike,
    differs from it there alone: that traceback, and that event's record, its index and
    alarm entries and its meta."""
    path = copy(FIXTURE_10, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 10])
    store = Store(path)  # opening migrates it
    try:
        with store.read() as txn:
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 52)
            zero = Namespace("orders", 0)
            assert [dead.traceback for _, dead in zero.iter_dead_letters(txn)] == [None]
    finally:
        store.close()
    after = records(path)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    metas = [key for key in before if key[:1] == b"I" and key.endswith(b"\x00m")]
    dead, events = dead_letters(before), pending_events(before)
    assert (len(metas), len(dead), len(events), len(outbox(before))) == (3, 1, 4, 1)
    assert changed == {b"F", *metas, *dead, *events, *outbox(before)}
    for key in metas:  # format 11's traceback and format 13's wait
        assert fields(key, after) == [*fields(key, before), None, None]
    for key in [*dead, *events, *outbox(before)]:
        assert fields(key, after) == [*fields(key, before), None]
    eleven_path = copy(FIXTURE_11, tmp_path / "11")
    Store(eleven_path).close()
    eleven = records(eleven_path)
    invoices = Namespace("invoices", 0)
    added = {
        invoices.queue_key(0, 3, 1000.0),  # event 12
        invoices.prefix + b"n" + (3).to_bytes(8, "big"),  # its index entry
        alarm_entry_key(1060.0, "invoices", 0),  # its retry
    }
    assert added.isdisjoint(after)
    assert {k for k in after.keys() | eleven.keys() if after.get(k) != eleven.get(k)} == {
        *added,
        *dead,
        invoices.meta_key,
    }  # what make_store.py wrote at format 11, byte for byte, but those
    assert fields(dead[0], eleven) == [*fields(dead[0], after)[:-1], POISON_TRACE]
    assert fields(invoices.meta_key, after)[-2] is None  # (the last: format 13's wait)
    assert fields(invoices.meta_key, eleven)[-2] == FLAKY_TRACE


# -- an instance's own storage (format 10) -----------------------------------------------


def test_the_keys_and_records_of_stored_values_have_their_documented_bytes(
    store_path: Path,
) -> None:
    """``v <name>``: the key's UTF-8 bytes up to 400 of them, else its first 400 bytes (cut
    inside a character too), ``0xFF`` and its 16-byte BLAKE2b digest; the record is
    ``[key (str), value (bin: msgpack)]``, and reads back as written."""
    values = StoredValues(Namespace("p", 0))
    assert values.key("k") == b"Ip:0\x00vk"
    assert values.key(LONG) == b"Ip:0\x00v" + LONG.encode()
    for long in (LONG + "a", "a" + LONG):  # the second's first 400 bytes end inside an "é"
        digest = hashlib.blake2b(long.encode(), digest_size=16).digest()
        assert values.key(long) == b"Ip:0\x00v" + long.encode()[:400] + b"\xff" + digest
    key = values.key("k")
    value = seal(key, pack(["k", pack([1, 2])]))
    assert value[4:] == b"\x92\xa1k\xc4\x03\x92\x01\x02"
    assert read_stored(key, value, len(b"Ip:0\x00v")) == StoredRecord("k", b"\x92\x01\x02")
    store = Store(store_path)
    try:
        with store.write() as txn:
            assert values.put(txn, "k", pack([1, 2]))  # a new key
            assert values.put(txn, "a" + LONG, pack(None))
            assert values.put(txn, LONG + "a", pack(None))
            assert not values.put(txn, "k", pack([3]))  # replaced
            assert values.delete(txn, LONG + "a")
            assert not values.delete(txn, LONG + "a")
        with store.read() as txn:
            assert [values.get(txn, k) for k in ("k", "a" + LONG, LONG + "a")] == [
                pack([3]),
                pack(None),
                None,
            ]
            assert values.count(txn) == 2
    finally:
        store.close()
    found = records(store_path)
    assert found[key] == seal(key, pack(["k", pack([3])]))
    assert stored(found) == [values.key("a" + LONG), key]


def test_a_stored_value_under_another_key_flipped_or_over_its_limits_is_damaged() -> None:
    values = StoredValues(Namespace("p", 0))
    at = len(values.key(""))  # where a name starts
    key, other, long = values.key("k"), values.key("j"), "k" * (MAX_STORAGE_KEY_BYTES + 1)
    value = seal(key, pack(["k", pack(1)]))
    over = bytes(MAX_STORAGE_VALUE_BYTES + 1)
    for where, raw, reason in [
        (other, value, "checksum mismatch"),  # moved: the checksum covers the key
        (other, seal(other, pack(["k", pack(1)])), "holds the key 'k', stored elsewhere"),
        (key, value[:-1] + bytes([value[-1] ^ 0x04]), "checksum mismatch"),
        (key, seal(key, pack(["k", over])), f"a value of {len(over)}"),
        (values.key(long), seal(values.key(long), pack([long, b""])), "a key of 2049 bytes"),
        (key, seal(key, pack(["k"])), "not an array of 2 fields"),
        (key, seal(key, pack(["k", "1"])), "field 'value'"),
    ]:
        with pytest.raises(DamagedRecordError, match=reason):
            read_stored(where, raw, at)
    at_the_limit = seal(key, pack(["k", over[1:]]))
    assert read_stored(key, at_the_limit, at) == StoredRecord("k", over[1:])


def test_stored_values_are_listed_in_key_order_though_long_keys_sort_by_digest(
    store_path: Path,
) -> None:
    """Long keys sharing their first 400 bytes are named by digests, which sort them in no
    useful order: ``items`` reads such a run whole and sorts it by the keys, and its
    bounds (a prefix, a start included, an end excluded) hold across it."""
    run = [LONG + tail for tail in ("x", "y", "yy", "z")]
    keys = ["", "a", "b", "ba", "zz", LONG[:-1] + "z", LONG, "a" + LONG, *run]
    values = StoredValues(Namespace("p", 0))
    assert sorted(run, key=values.key) == [LONG + tail for tail in ("yy", "z", "y", "x")]
    store = Store(store_path)
    try:
        with store.write() as txn:
            for key in keys:
                values.put(txn, key, pack(key))
        with store.read() as txn:
            for prefix, start, end in [
                ("", None, None),
                (LONG, None, None),
                ("", LONG + "y", None),
                (LONG, None, LONG + "yy"),
                (LONG + "y", None, None),
                ("", "b", LONG + "x"),
                ("b", "a", "bb"),
                ("a", "b", None),
                ("", "zz", "zz"),
            ]:
                listed = [record.key for record in values.items(txn, prefix, start, end)]
                wanted = [k for k in sorted(keys) if k.startswith(prefix) and k >= (start or "")]
                assert listed == [k for k in wanted if end is None or k < end], (prefix, start, end)
            assert [record.value for record in values.items(txn)] == [pack(k) for k in sorted(keys)]
    finally:
        store.close()


# -- the committed store of format 11: a failure's traceback -------------------------------


def test_the_format_11_fixture_decodes_to_exactly_what_was_written(tmp_path: Path) -> None:
    """The poisoned event's dead letter keeps its traceback, and invoices:0's meta, its event
    12 waiting out a retry's backoff, keeps that failure's as ``last_traceback``, as
    make_store.py's format-11 version's handler raised them (compiled as ``<fixture>``, from
    the handler's frame on); a read-only view's dead letters and ``pool.event()`` give them
    back, once the store is migrated (format 12's trace, nil, in its events and outbox)."""
    path = copy(FIXTURE_11, tmp_path)
    assert records(path)[b"F"][4:] == bytes([0x91, 11])
    zero, one, invoices = (
        Namespace(*where) for where in [("orders", 0), ("orders", 1), ("invoices", 0)]
    )
    queued = invoices.queue_key(0, 3, 1000.0)
    store = Store(path)
    try:
        with store.read() as txn:
            assert list(zero.iter_dead_letters(txn)) == [
                (0, POISON._replace(dedup_key="order-2", traceback=POISON_TRACE))
            ]
            assert invoices.load_meta(txn) == Meta(
                tail=4,
                pending=1,
                enqueued=4,
                succeeded=3,
                alarm=1060.0,
                current=queued,
                attempt=1,
                retry_at=1060.0,
                outbox_next=2,
                outbox=1,
                priorities={0: 1},
                links={"orders:0": 1, "orders:1": 1},
                last_due=1000.0,
                last_error="Unavailable: upstream timed out fetching 12",
                last_started=1000.0,
                last_traceback=FLAKY_TRACE,
            )
            assert invoices.get_event(txn, queued) == EventRecord(
                b"\x82\xa2id\x0c\xa5flaky\xc3", 1000.0, None, 0
            )
            assert EventIndex(invoices).locate(txn, 3) == Located(queued, False)
            assert [ns.load_meta(txn).last_traceback for ns in (zero, one)] == [None, None]
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 55)
    finally:
        store.close()
    with open_view(path) as view:
        assert [dead.traceback for dead in view.dead_letters("orders")] == [POISON_TRACE]
    with Runtime.simulated(path, start=1000.0) as runtime:  # nothing drives its clock
        orders = runtime.define(
            "orders", execute=lambda ctx: None, concurrency=2, keep_finished=3600.0
        )
        poisoned = orders.event("orders:0:0")
        assert poisoned is not None
        assert (poisoned.state, poisoned.traceback) == ("dead_lettered", POISON_TRACE)
        flaky = runtime.define("invoices", execute=lambda ctx: None).event("invoices:0:3")
        assert flaky is not None
        assert (flaky.state, flaky.retry_at, flaky.traceback) == ("backoff", 1060.0, FLAKY_TRACE)


def test_the_format_11_fixture_gains_a_nil_trace_in_its_events_and_outbox(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """store-v11, written by the format-11 code: the migration to format 12 gives each
    pending event, due or scheduled, and each outbox entry a last field, ``trace``, nil
    (format 11 kept no trace context), and changes nothing else but the format record.
    make_store.py now traces the enqueue of event 10 and the enqueue and run of event 9, so
    store-v12 differs from it there alone: event 10's scheduled record carries its
    enqueue's context, and invoices:0's follow-up ``{"refund_of": 9}`` that of the attempt
    that made it."""
    path = copy(FIXTURE_11, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 11])
    with caplog.at_level(logging.INFO, logger="dopool"):
        store = Store(path)  # opening migrates it
    try:
        # five pending events (invoices' event 12, in backoff, too) and the outbox entry
        assert "migrated from format 11 to 14 (9 records rewritten)" in caplog.text
        with store.read() as txn:
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 55)
    finally:
        store.close()
    after = records(path)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    events = pending_events(before)
    metas = [key for key in before if key[:1] == b"I" and key.endswith(b"\x00m")]
    assert (len(events), len(outbox(before)), len(metas)) == (5, 1, 3)
    assert changed == {b"F", *events, *outbox(before), *metas}
    for key in [*events, *outbox(before), *metas]:  # a trace, or format 13's wait
        assert fields(key, after) == [*fields(key, before), None]
    twelve_path = copy(FIXTURE_12, tmp_path / "12")
    Store(twelve_path).close()  # (migrated to format 14 as well)
    twelve = records(twelve_path)
    delayed = Namespace("orders", 0).delayed_key(2, 4, 1030.0)  # event 10
    refund = Namespace("invoices", 0).outbox_key(1)  # {"refund_of": 9}, for orders:1
    assert {k for k in after.keys() | twelve.keys() if after.get(k) != twelve.get(k)} == {
        delayed,
        refund,
    }  # what make_store.py writes today, byte for byte, but those two
    assert fields(delayed, twelve) == [*fields(delayed, after)[:-1], TRACE_10]
    assert fields(refund, twelve) == [*fields(refund, after)[:-1], TRACE_9]


def raised(message: str) -> BaseException:
    """A failure raised two calls deep, as a handler's would be."""

    def inner() -> None:
        raise ValueError(message)

    def outer() -> None:
        inner()

    try:
        outer()
    except ValueError as exc:
        return exc
    raise AssertionError("not raised")


def printed(failure: BaseException) -> str:
    """The traceback as Python prints it, without its last newline."""
    return "".join(traceback.format_exception(failure)).removesuffix("\n")


def test_a_short_traceback_is_kept_whole_as_python_prints_it() -> None:
    failure = raised("deep")
    kept = failure_traceback(failure)
    assert kept == printed(failure)
    assert kept.startswith("Traceback (most recent call last):\n")
    assert kept.endswith("\nValueError: deep")
    assert 0 < kept.index(", in outer\n") < kept.index(", in inner\n")  # outermost first
    # A lone surrogate, which UTF-8 cannot hold, is kept as its escape.
    assert failure_traceback(raised("\udcff")).endswith("\nValueError: \\udcff")


def test_a_traceback_over_the_limit_keeps_its_end_and_says_how_much_was_left_out() -> None:
    """Its last ``MAX_TRACEBACK_TEXT`` characters (the innermost frames and the exception),
    after a first line saying how many characters before them were left out."""
    fill = MAX_TRACEBACK_TEXT - len(printed(raised("")))  # ": " and then the message
    at_the_limit = raised("x" * (fill - 2))
    assert len(printed(at_the_limit)) == MAX_TRACEBACK_TEXT
    assert failure_traceback(at_the_limit) == printed(at_the_limit)
    for over in (1, 10_000):
        failure = raised("x" * (fill - 2 + over))
        whole = printed(failure)
        assert len(whole) == MAX_TRACEBACK_TEXT + over
        note, kept = failure_traceback(failure).split("\n", 1)
        assert note == f"({over} characters of the traceback left out)"
        assert kept == whole[over:]
        assert len(kept) == MAX_TRACEBACK_TEXT


def test_a_traceback_that_is_not_a_str_is_damaged(tmp_path: Path) -> None:
    """A dead letter's ``traceback`` and a meta's ``last_traceback`` are a str or nil; a dead
    letter without one (format 10's layout) is damaged too. In a store, such a dead letter
    is listed as damaged and ``dopool check`` names its field."""
    key = Namespace("p", 0).dead_letter_key(0)
    dead = POISON._replace(dedup_key="order-2", traceback=POISON_TRACE)
    assert read_dead(key, seal_dead(key, dead)) == dead
    assert read_dead(key, seal_dead(key, dead._replace(traceback=None))).traceback is None
    for raw, reason in [
        (seal(key, pack([*dead[:-1], POISON_TRACE.encode()])), "field 'traceback' is b'Trace"),
        (seal(key, pack([*dead[:-1], 1])), "field 'traceback' is 1"),
        (seal(key, pack(list(dead[:-1]))), "not an array of 10 fields"),
    ]:
        with pytest.raises(DamagedRecordError, match=reason):
            read_dead(key, raw)
    meta_key = Namespace("p", 0).meta_key
    meta = Meta(last_error="ValueError: deep", last_traceback="Traceback")
    assert read_meta(meta_key, seal_meta(meta_key, meta)).last_traceback == "Traceback"
    laid = list(unpack(open_sealed(meta_key, seal_meta(meta_key, meta))))
    with pytest.raises(DamagedRecordError, match="field 'last_traceback' is 7"):
        read_meta(meta_key, seal(meta_key, pack([*laid[:-2], 7, laid[-1]])))
    path = copy(FIXTURE_14, tmp_path)
    at = Namespace("orders", 0).dead_letter_key(0)
    with raw_env(path) as env, env.begin(write=True) as txn:
        txn.put(at, seal(at, pack([*dead[:-1], 7])))
    with open_view(path) as view:
        [listed] = view.dead_letters("orders")
        assert (listed.damaged, listed.traceback) == (True, None)
        assert [problem.what for problem in view.check().problems] == [
            "damaged: field 'traceback' is 7"
        ]


# -- the committed store of format 13: an event's trace context, rate limits ----------------


def test_the_format_13_fixture_decodes_to_exactly_what_was_written(tmp_path: Path) -> None:
    """Event 10's scheduled record carries the context its traced enqueue injected, and
    invoices:0's follow-up for orders:1 that of the traced attempt of event 9 that made it
    (store-v13, make_store.py at commit 7a5bbde); every other pending event carries none.
    Pool mail's bucket holds the time its next token comes, and so does ada's bucket in
    mail:0's namespace, with its expiry; mail:0's meta waits for the later of the two."""
    path = copy(FIXTURE_13, tmp_path)
    found = records(path)
    assert found[b"F"][4:] == bytes([0x91, 13])
    assert not calls(found)  # format 13 had none
    zero, invoices = Namespace("orders", 0), Namespace("invoices", 0)
    delayed = zero.delayed_key(2, 4, 1030.0)
    assert read_event(delayed, found[delayed]) == EventRecord(
        b"\x81\xa2id\n", 1000.0, "bob", 2, trace=TRACE_10
    )
    untraced = [key for key in pending_events(found) if key != delayed]
    assert len(untraced) == 5  # orders:0's event 5, orders:1's 3 and 4, invoices' 12, mail's 14
    assert [read_event(key, found[key]).trace for key in untraced] == [None] * 5
    assert read_rate(b"Rmail", found[b"Rmail"]) == RateRecord(1060.0, 1120.0)
    mail = Namespace("mail", 0)
    assert read_bucket(mail.prefix + b"bada", found[mail.prefix + b"bada"]) == ("ada", 4600.0)
    (expiry,) = [key for key in found if key.startswith(mail.prefix + b"x")]
    assert expiry == mail.prefix + b"x" + encode_due(4600.0).to_bytes(8, "big") + b"ada"
    assert read_bucket_expiry(expiry, found[expiry]) == 4600.0
    throttled = read_meta(mail.meta_key, found[mail.meta_key])
    assert (throttled.throttled_until, throttled.alarm, throttled.pending) == (4600.0, 4600.0, 1)
    store = Store(path)  # (migrated to format 14: its format record alone changes, below)
    try:
        with store.read() as txn:
            assert list(invoices.iter_outbox(txn)) == [
                (1, REFUND_9._replace(due=1045.0, trace=TRACE_9))
            ]
            assert list(zero.iter_delayed_keys(txn)) == [delayed]
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 64)
    finally:
        store.close()


def test_the_format_12_fixture_gains_a_nil_rate_limit_wait_in_its_metas(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """store-v12, written by the format-12 code: the migration to format 13 gives each meta
    a last field, ``throttled_until``, nil, and changes nothing else but the format record.
    make_store.py at format 13 also defined pool mail, rate limited, so store-v13 differs
    from it by mail's records alone (and the metas' new field)."""
    path = copy(FIXTURE_12, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 12])
    with caplog.at_level(logging.INFO, logger="dopool"):
        store = Store(path)  # opening migrates it
    try:
        assert "migrated from format 12 to 14 (3 records rewritten)" in caplog.text
        with store.read() as txn:
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 55)
    finally:
        store.close()
    after = records(path)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    metas = [key for key in before if key[:1] == b"I" and key.endswith(b"\x00m")]
    assert len(metas) == 3
    assert changed == {b"F", *metas}
    for key in metas:
        assert fields(key, after) == [*fields(key, before), None]
    thirteen_path = copy(FIXTURE_13, tmp_path / "13")
    Store(thirteen_path).close()  # (migrated to format 14 as well)
    thirteen = records(thirteen_path)
    mails = {key for key in thirteen if b"mail" in key}
    assert {k for k in after.keys() | thirteen.keys() if after.get(k) != thirteen.get(k)} == mails
    assert len(mails) == 9  # pool record, its bucket, meta, event, index entry, ada's bucket
    # and its expiry, alarm and work index entries


# -- the current format: producers' calls stored through an owner ---------------------------

# The producer whose two calls store-v14 records (make_store.py), and their answers: call 1,
# the enqueues of events 3 and 4 (orders:1); call 2, those of event 5 and of its duplicate
# (orders:0), each ``(instance, sequence, position, duplicate)`` as the enqueue answered.
PRODUCER = bytes.fromhex("00112233445566778899aabbccddeeff")
CALL_1 = CallRecord(1000.0, [(1, 3, 0, False), (1, 4, 1, False)])
CALL_2 = CallRecord(1000.0, [(0, 3, 0, False), (0, 3, 0, True)])


def calls(found: dict[bytes, bytes]) -> list[bytes]:
    """The producers' call records' keys (format 14)."""
    return [key for key in found if key[:1] == b"C"]


def test_the_keys_and_records_of_calls_have_their_documented_bytes() -> None:
    """``C <producer:16> <call:u64>``; the record ``[at, [[instance, sequence, position,
    duplicate], ...]]``."""
    key = call_key(PRODUCER, 2**40 + 1)
    assert key == b"C" + PRODUCER + (2**40 + 1).to_bytes(8, "big")
    assert len(PRODUCER) == PRODUCER_ID_BYTES == 16
    assert parse_call_key(key) == (PRODUCER, 2**40 + 1)
    assert (call_prefix(PRODUCER), call_prefix()) == (b"C" + PRODUCER, b"C")
    assert call_key(PRODUCER, 1) < call_key(PRODUCER, 256) < call_key(b"\x01" + bytes(15), 0)
    for stray in (b"C", key[:-1], key + b"\x00", b"W" + key[1:]):
        assert parse_call_key(stray) is None
    value = records(FIXTURE_14)[call_key(PRODUCER, 2)]
    assert open_sealed(call_key(PRODUCER, 2), value) == pack(
        [1000.0, [[0, 3, 0, False], [0, 3, 0, True]]]
    )


def test_the_format_14_fixture_decodes_to_exactly_what_was_written(tmp_path: Path) -> None:
    """store-v14 (make_store.py) holds what store-v13 holds, and the records of two calls
    of one producer, each answering the enqueues of events the store holds as they were
    answered."""
    path = copy(FIXTURE_14, tmp_path)
    found = records(path)
    assert found[b"F"][4:] == bytes([0x91, 14])
    assert calls(found) == [call_key(PRODUCER, 1), call_key(PRODUCER, 2)]
    assert read_call(call_key(PRODUCER, 1), found[call_key(PRODUCER, 1)]) == CALL_1
    assert read_call(call_key(PRODUCER, 2), found[call_key(PRODUCER, 2)]) == CALL_2
    assert [(r.event_id, r.position, r.duplicate) for r in CALL_2.answer("orders")] == [
        ("orders:0:3", 0, False),
        ("orders:0:3", 0, True),
    ]
    one, zero = Namespace("orders", 1), Namespace("orders", 0)
    store = Store(path)
    try:
        with store.read() as txn:
            assert stored_call(txn, PRODUCER, 1) == CALL_1
            assert stored_call(txn, PRODUCER, 3) is None
            # Each answer names an event the store holds: the ids of its events 3, 4 and 5.
            events: dict[tuple[int, int], object] = {}
            for index, ns in ((1, one), (0, zero)):
                for key in ns.iter_event_keys(txn):
                    record = ns.get_event(txn, key)
                    assert record is not None
                    events[index, queue_key_sequence(key)] = unpack(record.event)["id"]
            answered = [(i, seq) for i, seq, _, _ in CALL_1.results + CALL_2.results]
            assert [events[where] for where in answered] == [3, 4, 5, 5]
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 66)
    finally:
        store.close()
    assert records(path) == found  # a store of this format is opened as it is


def test_the_format_13_fixture_is_migrated_by_its_format_record_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """store-v13, written by the format-13 code: the migration to format 14 rewrites no
    record (no store of format 13 holds a call record), only the format record says 14;
    ``dopool check`` finds it sound, and it differs from what make_store.py writes today
    (store-v14) by the two call records alone."""
    path = copy(FIXTURE_13, tmp_path)
    before = records(path)
    with caplog.at_level(logging.INFO, logger="dopool"):
        store = Store(path)  # opening migrates it
    try:
        assert "migrated from format 13 to 14 (0 records rewritten)" in caplog.text
        with store.read() as txn:
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 64)
    finally:
        store.close()
    after = records(path)
    assert after[b"F"] == seal_format(b"F")
    assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} == {b"F"}
    fourteen = records(FIXTURE_14)
    differ = {k for k in after.keys() | fourteen.keys() if after.get(k) != fourteen.get(k)}
    assert differ == {call_key(PRODUCER, 1), call_key(PRODUCER, 2)}


def test_the_format_14_fixture_checks_out_with_dopool_check(tmp_path: Path) -> None:
    """The fixture, read-only as the command reads it: nothing to report."""
    path = copy(FIXTURE_14, tmp_path)
    with open_view(path) as view:
        report = view.check()
    assert (report.ok, report.format_version, report.records) == (True, 14, 66)
    assert report.pools == {"invoices": 1, "mail": 1, "orders": 2}


# A trace context no propagator injects, each refused: a value or a key not a str, not a
# map, an empty map (nil says there is none), more fields or more characters than kept.
DAMAGED_TRACES = [
    pytest.param({"traceparent": 1}, id="int-value"),
    pytest.param({1: "00-01-01-01"}, id="int-key"),
    pytest.param(["traceparent", "00-01-01-01"], id="list"),
    pytest.param({}, id="empty"),
    pytest.param({f"k{n}": "v" for n in range(MAX_TRACE_FIELDS + 1)}, id="fields"),
    pytest.param({"traceparent": "x" * MAX_TRACE_TEXT}, id="text"),  # with its key's 11
]


def test_a_trace_at_its_limits_reads_back_as_written() -> None:
    """``MAX_TRACE_FIELDS`` fields, ``MAX_TRACE_TEXT`` characters in all (keys counted)."""
    key, at = Namespace("p", 0).queue_key(0, 0, 1.0), Namespace("p", 0).outbox_key(0)
    fields_limit = {f"k{n}": "v" for n in range(MAX_TRACE_FIELDS)}
    text_limit = {"traceparent": "x" * (MAX_TRACE_TEXT - len("traceparent"))}
    for trace in (TRACE_10, fields_limit, text_limit):
        record = EventRecord(pack("x"), 1.0, None, 0, trace=trace)
        assert read_event(key, seal_event(key, record)) == record
        entry = OutboxRecord("q", 1, 0, pack("x"), 1.0, None, 0, trace=trace)
        assert read_outbox(at, seal_outbox(at, entry)) == entry


@pytest.mark.parametrize("trace", DAMAGED_TRACES)
def test_a_trace_that_is_not_a_small_map_of_str_to_str_is_damaged(trace: object) -> None:
    """An event's or an outbox entry's ``trace``, in a record whose checksum holds, is nil
    or a map of str to str within its limits; anything else is damaged, naming the field."""
    key = Namespace("p", 0).queue_key(0, 0, 1.0)
    record = EventRecord(pack("x"), 1.0, None, 0, trace=trace)  # type: ignore[arg-type]
    with pytest.raises(DamagedRecordError, match="field 'trace' is ") as caught:
        read_event(key, seal_event(key, record))
    assert caught.value.key == key
    at = Namespace("p", 0).outbox_key(0)
    entry = OutboxRecord("q", 1, 0, pack("x"), 1.0, None, 0, trace=trace)  # type: ignore[arg-type]
    with pytest.raises(DamagedRecordError, match="field 'trace' is "):
        read_outbox(at, seal_outbox(at, entry))


@pytest.mark.parametrize("trace", DAMAGED_TRACES)
def test_an_event_with_a_damaged_trace_is_dead_lettered_as_damaged_and_never_run(
    tmp_path: Path, trace: object
) -> None:
    """Sealed under its own key, so that only its layout's checks can refuse it, an event
    whose trace no propagator injects is met at the head of its queue and dead-lettered as
    damaged, as found, instead of running; the event behind it runs, and ``dopool check``
    names the field."""
    path = tmp_path / "store"
    with Runtime.simulated(path, seed=0) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        pool.pause()
        pool.enqueue_many(["first", "second"])
    head = Namespace("p", 0).queue_key(0, 0, 0.0)  # "first"
    with raw_env(path) as env, env.begin(write=True) as txn:
        stored = read_event(head, txn.get(head) or b"")
        value = seal_event(head, stored._replace(trace=trace))  # type: ignore[arg-type]
        txn.put(head, value)
    with open_view(path) as view:
        [problem] = view.check().problems
        assert problem.key == head
        assert problem.what.startswith("damaged: field 'trace' is ")
    seen: list[object] = []
    with Runtime(path, clock=SimulatedClock(100.0), seed=0) as runtime:
        pool = runtime.define("p", execute=lambda ctx: seen.append(ctx.event))
        pool.resume()
        assert pool.join(timeout=10)
        assert seen == ["second"]
        [dead] = pool.dead_letters()
        assert (dead.sequence, dead.damaged, dead.event) == (0, True, value)
        assert dead.error.startswith("DamagedRecordError: field 'trace' is ")
        assert pool.redrive() == 0  # never redriven
        status = pool.status()
        assert (status.enqueued, status.succeeded, status.dead_lettered) == (2, 1, 1)
        assert status.instance(0).restarts == 0


def test_the_keys_of_the_alarm_and_work_indexes_have_their_documented_bytes() -> None:
    """``A <due:8> <pool> \\0 <index:u64>`` and ``U <pool> \\0 <index:u64>``."""
    alarm = alarm_entry_key(2.5, "orders", 7)
    assert alarm == b"A\xc0\x04" + bytes(6) + b"orders\x00" + (7).to_bytes(8, "big")
    assert parse_alarm_entry(alarm) == (2.5, "orders", 7)
    assert alarm_entry_key(-1.0, "a", 0) < alarm_entry_key(0.0, "z", 0) < alarm
    work = work_entry_key("orders", 2**40)
    assert work == b"Uorders\x00" + (2**40).to_bytes(8, "big")
    assert parse_work_entry(work) == ("orders", 2**40)
    for stray in (b"A", b"A" + bytes(8) + b"p\x00\x01", b"Uno-nul", b"Ubad name\x00" + bytes(8)):
        assert parse_alarm_entry(stray) is None
        assert parse_work_entry(stray) is None


def test_the_keys_and_records_of_leases_have_their_documented_bytes() -> None:
    assert lease_key("orders", 1) == b"Lorders\x00\x00\x00\x00\x01"
    lease = records(FIXTURE_6)[lease_key("orders", 0)]
    assert open_sealed(lease_key("orders", 0), lease) == pack([OWNER, 4121, "host", 2, 1030.0])
    presence = records(FIXTURE_6)[b"W" + OWNER.encode()]
    assert open_sealed(b"W" + OWNER.encode(), presence) == pack([4121, "host", 1030.0])


def _the_fixture_of_format_5_reads_as_written(path: Path, *, records: int) -> None:
    """What make_store.py's format-5 part wrote: an event index, remembered finished
    events and a cancelled event, over format 4's records."""
    store = Store(path)
    try:
        with store.read() as txn:
            zero, one = Namespace("orders", 0), Namespace("orders", 1)
            assert zero.load_meta(txn) == Meta(
                tail=6,
                pending=2,
                enqueued=6,
                succeeded=2,
                dead_lettered=1,
                paused=True,
                outbox_next=1,
                held_dead_letters=1,
                priorities={9: 1},
                links={"orders:1": 1},
                scheduled=1,
                next_due=1030.0,
                last_due=1000.0,
                duplicates=1,
                cancelled=1,
                remembered=4,
                last_started=1000.0,
            )
            assert one.load_meta(txn).remembered == 3
            events = EventIndex(zero)
            assert events.entries(txn) == [3, 4]
            assert events.finished(txn, 5) == FinishedRecord(
                "cancelled", 0, 1000.0, 1000.0, None, 1000.0, None, "bob", 0, None
            )
            assert events.finished(txn, 0) == FinishedRecord(
                "dead_lettered",
                1,
                1000.0,
                1000.0,
                1000.0,
                1000.0,
                "PermanentError: poisoned",
                "bob",
                3,
                "order-2",
            )
            assert zero.get_event(txn, zero.queue_key(9, 3, 1000.0)) == ID_5._replace(
                dedup_key="order-5"
            )
            assert [one.get_event(txn, key) for key in one.iter_event_keys(txn)] == [ID_3, ID_4]
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, records)
            assert list(Namespace("invoices", 0).iter_outbox(txn)) == [(1, REFUND_9)]
    finally:
        store.close()


def test_the_keys_and_records_of_the_event_index_have_their_documented_bytes() -> None:
    ns = Namespace("p", 0)
    store_key = ns.queue_key(5, 7, 1.5)
    entry = b"Ip:0\x00n" + (7).to_bytes(8, "big")
    value = seal(entry, pack((store_key[-20:-8],)))
    assert value[4:] == b"\x91\xc4\x0c\x7f\xff\xff\xfa\xbf\xf8\x00\x00\x00\x00\x00\x00"
    record = FinishedRecord("succeeded", 1, 1.0, 1.5, 2.0, 2.5, None, None, -1, "k")
    key = b"Ip:0\x00f" + (7).to_bytes(8, "big")
    assert seal(key, pack(record))[4:10] == b"\x9a\xa9succ"
    expiry = b"Ip:0\x00e" + bytes.fromhex("c004000000000000") + (7).to_bytes(8, "big")  # 2.5
    read_lifecycle(RecordKind.FORGET, expiry, seal(expiry, pack(())))


def test_the_keys_and_records_of_dedup_have_their_documented_bytes() -> None:
    index = DedupIndex("p")
    assert index.entry_key("k") == b"Kp\x00k"  # a short key names itself
    direct = "é" * 127 + "a"  # 255 bytes of UTF-8: the longest named as it is
    assert index.entry_key(direct) == b"Kp\x00" + direct.encode()
    long = direct + "a"
    digest = hashlib.blake2b(long.encode(), digest_size=16).digest()
    assert index.entry_key(long) == b"Kp\x00\xff" + digest
    finished = bytes.fromhex("c08f400000000000")  # 1000.0, as a due time is encoded
    assert parse_dedup_key(b"Ep\x00" + finished + b"k") == ("p", True, b"k", 1000.0)
    assert parse_dedup_key(b"Kp\x00\xff" + digest) == ("p", False, b"\xff" + digest, None)
    assert parse_dedup_key(b"Kp\x00\xff" + digest[1:]) is None  # a digest is 16 bytes
    assert parse_dedup_key(b"Kp\x00\xc3") is None  # not UTF-8
    assert parse_dedup_key(b"Kp\x00") is None
    key = b"Kp\x00k"
    record = DedupRecord("k", 1, 2, 3, -1, 1.5, None)
    value = seal(key, pack(record))
    assert value[4:] == b"\x97\xa1k\x01\x02\x03\xff\xcb?\xf8\x00\x00\x00\x00\x00\x00\xc0"
    assert read_dedup(key, value) == record
    assert read_dedup(key, seal(key, pack([*record[:6], 2.5]))).finished_at == 2.5


def test_the_format_4_fixture_runs_and_keeps_its_dedup_keys(tmp_path: Path) -> None:
    """Restarted, the index still holds: a pending key is a duplicate until its event
    has run, and for the pool's window after; then it is free again."""
    seen: list[object] = []
    clock = SimulatedClock(1010.0)
    with Runtime(copy(FIXTURE_4, tmp_path), clock=clock, seed=7) as runtime:
        pool = runtime.define(
            "orders", execute=lambda ctx: seen.append(ctx.event), concurrency=2, dedup_window=60.0
        )
        runtime.define("invoices", execute=lambda ctx: None)
        again = pool.enqueue({"id": 5}, partition_key="alice", dedup_key="order-5")
        assert (again.duplicate, again.event_id, again.position) == (True, "orders:0:3", 0)
        assert pool.enqueue({"id": 1}, dedup_key="order-1").duplicate  # finished at 1000.0
        pool.resume()
        assert pool.join(timeout=10)
        assert seen.count({"id": 5, "tags": ["x", "y"]}) == 1
        assert {"id": 5} not in seen
        assert pool.enqueue({"id": 5}, dedup_key="order-5").duplicate  # in its window
        clock.advance(61.0)
        fresh = pool.enqueue({"id": 1}, dedup_key="order-1")
        assert not fresh.duplicate
        assert pool.status().duplicates == 4  # the fixture's, and three here


# -- format 3, migrated in place when a runtime opens it -----------------------------------


def test_the_format_3_fixture_is_migrated_to_exactly_what_was_written(tmp_path: Path) -> None:
    """store-v3, written by the format-3 code: every record reads as it was written, with
    no dedup keys and no duplicates counted."""
    path = copy(FIXTURE_3, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 3])
    store = Store(path)
    try:
        with store.read() as txn:
            zero, one, invoices = (
                Namespace("orders", 0),
                Namespace("orders", 1),
                Namespace("invoices", 0),
            )
            assert (store.get_pool(txn, "orders"), store.get_pool(txn, "invoices")) == (2, 1)
            assert zero.load_meta(txn) == Meta(
                tail=5,
                pending=2,
                enqueued=5,
                succeeded=2,
                dead_lettered=1,
                paused=True,
                outbox_next=1,
                held_dead_letters=1,
                priorities={9: 1},
                links={"orders:1": 1},
                scheduled=1,
                next_due=1030.0,
                last_due=1000.0,
            )
            assert one.load_meta(txn) == Meta(
                tail=5,
                pending=2,
                enqueued=5,
                succeeded=3,
                paused=True,
                outbox_next=1,
                priorities={0: 1, -2: 1},
                links={"invoices:0": 1},
                last_due=1000.0,
            )
            assert invoices.load_meta(txn) == Meta(
                tail=3,
                enqueued=3,
                succeeded=3,
                outbox_next=2,
                outbox=1,
                links={"orders:0": 1, "orders:1": 1},
                last_due=1000.0,
            )
            assert list(invoices.iter_outbox(txn)) == [
                (1, OutboxRecord("orders", 1, 0, b"\x81\xa9refund_of\t", 1000.0, "alice", 1))
            ]
            assert list(zero.iter_marks(txn)) == [(("invoices", 0), 0)]
            assert list(one.iter_marks(txn)) == [(("orders", 0), 0)]
            assert list(invoices.iter_marks(txn)) == [(("orders", 1), 0)]
            assert list(zero.iter_event_keys(txn)) == [zero.queue_key(9, 3, 1000.0)]
            assert zero.get_event(txn, zero.queue_key(9, 3, 1000.0)) == ID_5
            assert list(zero.iter_delayed_keys(txn)) == [zero.delayed_key(2, 4, 1030.0)]
            assert zero.get_event(txn, zero.delayed_key(2, 4, 1030.0)) == EventRecord(
                b"\x81\xa2id\n", 1000.0, "bob", 2
            )
            assert [one.get_event(txn, key) for key in one.iter_event_keys(txn)] == [ID_3, ID_4]
            assert list(zero.iter_dead_letters(txn)) == [(0, POISON)]
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 22)
    finally:
        store.close()
    after = records(path)
    changed = sorted(
        key for key in before.keys() | after.keys() if before.get(key) != after.get(key)
    )
    # The format record, every meta, every event (due or scheduled: and format 12's trace)
    # and the dead letter, the outbox entry (format 7's due and format 12's trace), and an
    # index entry for each event.
    rewritten = [key for key in before if key[:1] == b"I" and key.split(b"\x00")[1][:1] in b"mqwdo"]
    assert len(rewritten) == 3 + 4 + 1 + 1
    assert len(entries(path)) == 4
    assert set(changed) == {
        b"F",
        *rewritten,
        *entries(path),
        *indexes(path),
        *nines(before, after),
    }


def test_the_keys_of_format_3_have_their_documented_bytes() -> None:
    ns = Namespace("p", 0)
    # q, rank 2**31 - 1 - 5, due 1.5 (0x3FF8... with its sign bit flipped), sequence 7
    assert ns.queue_key(5, 7, 1.5) == (
        b"Ip:0\x00q\x7f\xff\xff\xfa\xbf\xf8\x00\x00\x00\x00\x00\x00" + (7).to_bytes(8, "big")
    )
    # w, due -1.5 (every bit of 0xBFF8... flipped), rank 2**31 - 1, sequence 7
    assert ns.delayed_key(0, 7, -1.5) == (
        b"Ip:0\x00w\x40\x07\xff\xff\xff\xff\xff\xff\x7f\xff\xff\xff" + (7).to_bytes(8, "big")
    )
    assert ns.queue_key(0, 0, MIGRATED_DUE)[10:18] == bytes.fromhex("000fffffffffffff")


def test_the_format_3_fixture_runs_its_events_and_its_follow_up(tmp_path: Path) -> None:
    seen: list[tuple[str, int, int, object]] = []

    def record(ctx: EventContext) -> None:
        seen.append((ctx.pool_name, ctx.instance_index, ctx.sequence, ctx.event))

    with Runtime(copy(FIXTURE_3, tmp_path), clock=SimulatedClock(2000.0), seed=7) as runtime:
        pool = runtime.define("orders", execute=record, concurrency=2)
        runtime.define("invoices", execute=record)
        assert pool.status().scheduled == 1  # due since 1030.0: a paused instance looks later
        pool.resume()
        assert pool.join(timeout=10)
        assert sorted(seen, key=str) == sorted(
            [
                ("orders", 0, 3, {"id": 5, "tags": ["x", "y"]}),
                ("orders", 0, 4, {"id": 10}),
                ("orders", 1, 5, {"refund_of": 9}),
                ("orders", 1, 3, {"id": 3, "blob": b"\x00\xff"}),
                ("orders", 1, 4, {"id": 4}),
            ],
            key=str,
        )
        assert [event for _, index, _, event in seen if index == 0] == [
            {"id": 5, "tags": ["x", "y"]},  # priority 9, due at 1000.0
            {"id": 10},  # priority 2, due at 1030.0
        ]


# -- format 2, migrated in place when a runtime opens it -----------------------------------


def test_the_format_2_fixture_is_migrated_to_exactly_what_was_written(tmp_path: Path) -> None:
    """store-v2, written by the format-2 code: every record reads as it was written; its
    queue keys have the lowest due time, and its metas the new fields, empty."""
    path = copy(FIXTURE_2, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 2])
    store = Store(path)
    try:
        with store.read() as txn:
            zero, one, invoices = (
                Namespace("orders", 0),
                Namespace("orders", 1),
                Namespace("invoices", 0),
            )
            assert zero.load_meta(txn) == Meta(
                tail=4,
                pending=1,
                enqueued=4,
                succeeded=2,
                dead_lettered=1,
                paused=True,
                outbox_next=1,
                held_dead_letters=1,
                priorities={9: 1},
                links={"orders:1": 1},
            )
            assert one.load_meta(txn) == Meta(
                tail=5,
                pending=2,
                enqueued=5,
                succeeded=3,
                paused=True,
                outbox_next=1,
                priorities={0: 1, -2: 1},
                links={"invoices:0": 1},
            )
            assert invoices.load_meta(txn).links == {"orders:0": 1, "orders:1": 1}
            assert list(zero.iter_event_keys(txn)) == [zero.queue_key(9, 3, MIGRATED_DUE)]
            assert zero.get_event(txn, zero.queue_key(9, 3, MIGRATED_DUE)) == ID_5
            assert list(one.iter_event_keys(txn)) == [
                one.queue_key(0, 3, MIGRATED_DUE),
                one.queue_key(-2, 4, MIGRATED_DUE),
            ]
            assert [one.get_event(txn, key) for key in one.iter_event_keys(txn)] == [ID_3, ID_4]
            assert list(zero.iter_dead_letters(txn)) == [(0, POISON)]
            report = check_store(txn)
            assert (report.ok, report.format_version, report.records) == (True, 14, 20)
    finally:
        store.close()
    after = records(path)
    changed = sorted(
        key for key in before.keys() | after.keys() if before.get(key) != after.get(key)
    )
    # The format record, every meta, each pending event moved to its new key and
    # indexed (and format 12's trace), the dead letter (format 4's dedup key), and the
    # outbox entry (format 7's due and format 12's trace).
    old_queue = [key for key in before if b"\x00q" in key]
    new_queue = [key for key in after if b"\x00q" in key]
    assert len(old_queue) == len(new_queue) == 3
    metas = [b"Iinvoices:0\x00m", b"Iorders:0\x00m", b"Iorders:1\x00m"]
    dead = [key for key in before if b"\x00d" in key]
    assert len(entries(path)) == 3
    assert set(changed) == {
        b"F",
        *metas,
        *dead,
        *old_queue,
        *new_queue,
        *entries(path),
        *outbox(before),
        *indexes(path),
        *nines(before, after),
    }


def format_2_meta(**fields: object) -> list[object]:
    """A meta record's fields in format 2's layout (20 of them), defaults but ``fields``."""
    meta = Meta(**fields)  # type: ignore[arg-type]
    names = [
        "tail",
        "pending",
        "enqueued",
        "succeeded",
        "dead_lettered",
        "drained",
        "paused",
        "alarm",
        "current",
        "attempt",
        "running",
        "started_at",
        "retry_at",
        "restarts",
        "outbox_next",
        "outbox",
        "held_dead_letters",
        "priorities",
        "alarm_failures",
        "links",
    ]
    return [getattr(meta, name) for name in names]


def write_format_2_store(path: Path) -> dict[int, bytes]:
    """Pool ``h`` of format 2, by hand: event 0 started and waiting out its retry until
    t=50, 1 and 3 pending at priority 0 (3 damaged), 2 at priority 5. Its queue keys."""
    Store(path).close()  # a store of format 3, written over below
    prefix = Namespace("h", 0).prefix
    keys = {
        sequence: prefix
        + b"q"
        + (2**31 - 1 - priority).to_bytes(4, "big")
        + sequence.to_bytes(8, "big")
        for sequence, priority in ((0, 0), (1, 0), (2, 5), (3, 0))
    }
    meta = format_2_meta(
        tail=4,
        pending=4,
        enqueued=4,
        alarm=50.0,
        current=keys[0],
        attempt=1,
        retry_at=50.0,
        priorities={0: 3, 5: 1},
    )
    with raw_env(path) as env, env.begin(write=True) as txn:
        txn.put(b"F", seal(b"F", pack([2])))
        txn.put(b"Ph", seal(b"Ph", pack([1])))  # format 2 to 8: [concurrency]
        txn.put(prefix + b"m", seal(prefix + b"m", pack(meta)))
        for sequence, key in keys.items():
            record = (pack(sequence), 1.0, None, 5 if sequence == 2 else 0)  # format 2's
            value = seal_event(key, record)
            if sequence == 3:
                value = value[:-1] + bytes([value[-1] ^ 1])  # a flipped bit
            txn.put(key, value)
    return keys


def test_a_format_2_store_built_by_hand_keeps_its_order_and_its_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Migrated events keep their order, run before anything enqueued later of their
    priority, and the started one keeps its place and its backoff; a damaged one stays
    damaged under its new key."""
    path = tmp_path / "store"
    old_keys = write_format_2_store(path)
    seen: list[tuple[object, int, float]] = []
    clock = SimulatedClock(10.0)

    def record(ctx: EventContext) -> None:
        seen.append((ctx.event, ctx.attempt, clock.now()))

    with caplog.at_level(logging.INFO, logger="dopool"):
        runtime = Runtime(path, clock=clock)
    try:
        # 9 to format 4; its meta again, an index entry for each of 4 events, and the 3
        # sound ones rewritten (expires_at); its meta once more to format 10 and to 11; the
        # 3 sound events once more to 12 (trace)
        assert "migrated from format 2 to 14 (28 records rewritten)" in caplog.text
        ns = Namespace("h", 0)
        with runtime._store.read() as txn:
            meta = ns.load_meta(txn)
            assert meta.current == ns.queue_key(0, 0, MIGRATED_DUE)
            assert (meta.attempt, meta.retry_at, meta.scheduled, meta.last_due) == (
                1,
                50.0,
                0,
                None,
            )
            assert not any(txn.get(key) for key in old_keys.values())
            problems = [p.what for p in check_store(txn).problems]
            assert problems == ["damaged: checksum mismatch"]  # event 3, as before
        pool = runtime.define("h", execute=record)
        pool.enqueue("now")  # due at 10.0: behind the migrated events of its priority
        pool.enqueue("soon", delay=1.0)  # due at 11.0
        assert pool.join(timeout=10)
        assert seen == [
            (0, 2, 50.0),
            (2, 1, 50.0),
            (1, 1, 50.0),
            ("now", 1, 50.0),
            ("soon", 1, 50.0),
        ]
        [dead] = pool.dead_letters()
        assert (dead.sequence, dead.damaged) == (3, True)
    finally:
        runtime.close()


def test_a_format_2_store_is_refused_read_only(tmp_path: Path) -> None:
    path = copy(FIXTURE_2, tmp_path)
    with pytest.raises(StoreFormatError) as caught, open_view(path):
        pass
    assert (caught.value.found, caught.value.supported) == (2, FORMAT_VERSION)
    assert "migrates it in place" in str(caught.value)
    assert records(path) == records(FIXTURE_2)


def test_the_format_2_fixture_runs_its_pending_events_and_its_follow_up(tmp_path: Path) -> None:
    seen: list[object] = []

    def record(ctx: EventContext) -> None:
        seen.append((ctx.pool_name, ctx.instance_index, ctx.sequence, ctx.event))

    with Runtime(copy(FIXTURE_2, tmp_path), clock=SimulatedClock(2000.0), seed=7) as runtime:
        pool = runtime.define("orders", execute=record, concurrency=2)
        runtime.define("invoices", execute=record)
        pool.resume()
        assert pool.join(timeout=10)
        assert sorted(seen, key=str) == sorted(
            [
                ("orders", 0, 3, {"id": 5, "tags": ["x", "y"]}),
                ("orders", 1, 5, {"refund_of": 9}),
                ("orders", 1, 3, {"id": 3, "blob": b"\x00\xff"}),
                ("orders", 1, 4, {"id": 4}),
            ],
            key=str,
        )


def test_an_outbox_record_has_its_documented_layout() -> None:
    key = Namespace("p", 0).prefix + b"o" + (5).to_bytes(8, "big")
    record = OutboxRecord("q", 1, 2, b"\xa1x", 3.5, None, -1)
    value = seal_outbox(key, record)
    assert value[4:] == (
        b"\x99\xa1q\x01\x02\xc4\x02\xa1x\xcb@\x0c\x00\x00\x00\x00\x00\x00\xc0\xff\xc0\xc0"
    )
    assert read_outbox(key, value) == record
    delayed = record._replace(due=4.0)  # format 7: a delayed follow-up's due time
    value = seal_outbox(key, delayed)
    assert value[-11:] == b"\xff\xcb@\x10\x00\x00\x00\x00\x00\x00\xc0"
    assert read_outbox(key, value) == delayed
    traced = delayed._replace(trace={"traceparent": "t"})  # format 12: its trace, last
    value = seal_outbox(key, traced)
    assert value[-25:] == b"\xff\xcb@\x10\x00\x00\x00\x00\x00\x00\x81\xabtraceparent\xa1t"
    assert read_outbox(key, value) == traced


def test_records_naming_an_instance_take_a_per_key_pools_whole_range() -> None:
    """A per-key pool's instances reach 2**64 - 1: a follow-up's target and a dedup key's
    instance past 2**63 read back (they read as damaged before, so a follow-up resent at
    recovery was dropped); a negative one is damaged (msgpack holds none past 2**64 - 1)."""
    key = Namespace("p", 0).prefix + b"o" + (5).to_bytes(8, "big")
    for target in (2**63, PER_KEY - 1):
        record = OutboxRecord("q", target, 0, b"\xa1x", 3.5, "room", 0)
        assert read_outbox(key, seal_outbox(key, record)) == record
    with pytest.raises(DamagedRecordError, match="target"):
        read_outbox(key, seal_outbox(key, OutboxRecord("q", -1, 0, b"", 0.0, None, 0)))
    dedup_key = b"Dp\x00order"
    entry = DedupRecord("order", PER_KEY - 1, 0, 0, 0, 1.0)
    assert read_dedup(dedup_key, seal_dedup(dedup_key, entry)) == entry
    with pytest.raises(DamagedRecordError, match="instance"):
        read_dedup(dedup_key, seal_dedup(dedup_key, entry._replace(instance=-1)))


def test_a_delivery_mark_has_its_documented_key(store_path: Path) -> None:
    ns = Namespace("b", 3)
    store = Store(store_path)
    with store.write() as txn:
        ns.set_delivered(txn, "a", 258, 7)
    store.close()
    assert records(store_path)[b"Ib:3\x00sa\x00" + (258).to_bytes(8, "big")][4:] == b"\x91\x07"


# -- format 1, migrated in place when a runtime opens it -----------------------------------


def test_the_format_1_fixture_is_migrated_to_exactly_what_was_written(tmp_path: Path) -> None:
    """store-v1, written by the format-1 code: every record reads as it was written,
    with format 2's keys for the follow-up links (its pool was the only one), and
    format 3's queue keys and meta fields."""
    path = copy(FIXTURE_1, tmp_path)
    before = records(path)
    assert before[b"F"][4:] == bytes([0x91, 1])
    store = Store(path)
    try:
        with store.read() as txn:
            zero, one = Namespace("orders", 0), Namespace("orders", 1)
            assert store.get_pool(txn, "orders") == 2
            assert zero.load_meta(txn) == Meta(
                tail=3,
                pending=1,
                enqueued=3,
                succeeded=1,
                dead_lettered=1,
                paused=True,
                outbox_next=1,
                held_dead_letters=1,
                priorities={9: 1},
                links={"orders:1": 1},
            )
            assert one.load_meta(txn) == Meta(
                tail=4, pending=2, enqueued=4, succeeded=2, paused=True, priorities={0: 1, -2: 1}
            )
            assert zero.get_event(txn, zero.queue_key(9, 2, MIGRATED_DUE)) == ID_5
            assert [one.get_event(txn, key) for key in one.iter_event_keys(txn)] == [ID_3, ID_4]
            assert list(zero.iter_dead_letters(txn)) == [(0, POISON)]
            assert list(one.iter_marks(txn)) == [(("orders", 0), 0)]
            assert list(zero.iter_marks(txn)) == []
            assert check_store(txn).ok
    finally:
        store.close()
    after = records(path)
    assert after[b"F"] == seal_format(b"F")
    # The metas (orders:0's links, format 3's fields), the delivery mark, each pending
    # event's key (and format 12's trace) and the format record changed.
    changed = sorted(
        key for key in before.keys() | after.keys() if before.get(key) != after.get(key)
    )
    old_queue = [key for key in before if b"\x00q" in key]
    new_queue = [key for key in after if b"\x00q" in key]
    assert len(old_queue) == len(new_queue) == 3
    assert set(changed) == {
        b"F",
        b"Iorders:0\x00m",
        b"Iorders:1\x00m",
        b"Iorders:1\x00s\x00\x00\x00\x00",
        b"Iorders:1\x00sorders\x00" + bytes(8),  # its source's pool, and an 8-byte index
        *[key for key in before if b"\x00d" in key],  # format 4's dedup key
        *old_queue,
        *new_queue,
        *entries(path),
        *indexes(path),
        *nines(before, after),
    }


def test_the_format_1_fixture_runs_its_pending_events_in_order(tmp_path: Path) -> None:
    seen: list[object] = []

    def record(ctx: EventContext) -> None:
        seen.append((ctx.instance_index, ctx.sequence, ctx.event))

    with Runtime(copy(FIXTURE_1, tmp_path), clock=SimulatedClock(2000.0), seed=7) as runtime:
        pool = runtime.define("orders", execute=record, concurrency=2)
        pool.resume()
        assert pool.join(timeout=10)
        assert seen == [
            (0, 2, {"id": 5, "tags": ["x", "y"]}),
            (1, 2, {"id": 3, "blob": b"\x00\xff"}),
            (1, 3, {"id": 4}),
        ]
        [dead] = pool.dead_letters()
        assert (dead.event, dead.error) == ({"id": 2, "poison": True}, "PermanentError: poisoned")


def test_a_format_1_outbox_is_migrated_and_delivered_exactly_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """store-v1-outbox: orders:0 holds link 1 for orders:1 (link 0 was accepted)."""
    path = copy(FIXTURE_1_OUTBOX, tmp_path)
    seen: list[object] = []

    def record(ctx: EventContext) -> None:
        seen.append((ctx.instance_index, ctx.sequence, ctx.event))

    with caplog.at_level(logging.INFO, logger="dopool"):
        runtime = Runtime(path, clock=SimulatedClock(2000.0), seed=7)
    try:
        # 9 to format 4, and both metas again (no event is pending), to format 10 and to 11;
        # the outbox entry once more to format 12 (trace)
        assert "migrated from format 1 to 14 (25 records rewritten)" in caplog.text
        with runtime._store.read() as txn:
            zero, one = Namespace("orders", 0), Namespace("orders", 1)
            assert zero.load_meta(txn).links == {"orders:1": 2}
            assert one.load_meta(txn).links == {"orders:0": 1}
            assert list(zero.iter_outbox(txn)) == [
                (1, OutboxRecord("orders", 1, 1, b"\x81\xa8child_of\x03", 1000.0, "alice", 0))
            ]
            assert list(zero.iter_marks(txn)) == [(("orders", 1), 0)]
            assert list(one.iter_marks(txn)) == [(("orders", 0), 0)]
            assert check_store(txn).ok
        pool = runtime.define("orders", execute=record, concurrency=2)
        assert pool.join(timeout=10)
        assert seen == [(1, 2, {"child_of": 3})]  # link 1, once; links 0 are not taken again
        status = pool.status()
        assert (status.enqueued, status.succeeded, status.pending) == (6, 6, 0)
    finally:
        runtime.close()
    runtime = Runtime(path, clock=SimulatedClock(3000.0))  # format 2 now: opened as it is
    runtime.close()


def test_a_format_1_store_is_refused_read_only_and_left_as_it_was(tmp_path: Path) -> None:
    path = copy(FIXTURE_1_OUTBOX, tmp_path)
    before = (path / "data" / "data.mdb").read_bytes()
    with pytest.raises(StoreFormatError) as caught, open_view(path):
        pass
    assert (caught.value.found, caught.value.supported) == (1, FORMAT_VERSION)
    assert "a Runtime of this version migrates it in place" in str(caught.value)
    assert (path / "data" / "data.mdb").read_bytes() == before


def test_a_migration_is_one_transaction_all_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = copy(FIXTURE_1_OUTBOX, tmp_path)
    before = records(path)
    calls: list[int] = []
    real = migration._mark_1

    def fail_at_the_second_mark(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise lmdb.Error("the disk is full")
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(migration, "_mark_1", fail_at_the_second_mark)
    with pytest.raises(Exception, match="the disk is full"):
        Runtime(path, clock=SimulatedClock())
    assert records(path) == before  # still format 1, every record as it was
    monkeypatch.undo()
    with Runtime(path, clock=SimulatedClock()) as runtime:
        pool = runtime.define("orders", execute=lambda ctx: None, concurrency=2)
        assert pool.join(timeout=10)
        assert pool.status().enqueued == 6


def test_a_damaged_format_1_outbox_entry_stays_damaged_and_is_dropped_at_recovery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = copy(FIXTURE_1_OUTBOX, tmp_path)
    key = Namespace("orders", 0).outbox_key(1)
    with raw_env(path) as env, env.begin(write=True) as txn:
        value = bytearray(txn.get(key) or b"")
        value[-1] ^= 0x01
        txn.put(key, bytes(value))
    with (
        caplog.at_level(logging.ERROR, logger="dopool"),
        Runtime(path, clock=SimulatedClock()) as rt,
    ):
        with rt._store.read() as txn:
            assert [p.what for p in check_store(txn).problems] == ["damaged: checksum mismatch"]
        pool = rt.define("orders", execute=lambda ctx: None, concurrency=2)
        assert pool.join(timeout=10)
        assert "follow-up 1 dropped" in caplog.text
        assert pool.status().enqueued == 5


# -- the format record ---------------------------------------------------------------------


def test_a_new_store_records_its_format(store_path: Path) -> None:
    Store(store_path).close()
    with raw_env(store_path) as env, env.begin() as txn:
        assert txn.get(b"F") == seal_format(b"F")
    assert seal_format(b"F")[4:] == bytes([0x91, FORMAT_VERSION])


@pytest.mark.parametrize("version", [0, FORMAT_VERSION + 1])
def test_a_store_of_another_format_is_refused_and_left_as_it_was(
    store_path: Path, version: int
) -> None:
    Store(store_path).close()
    with raw_env(store_path) as env, env.begin(write=True) as txn:
        txn.put(b"F", seal(b"F", bytes([0x91, version])))
    before = (store_path / "data" / "data.mdb").read_bytes()
    for _ in range(2):  # and the lock was released
        with pytest.raises(StoreFormatError) as caught:
            Runtime(store_path)
        assert (caught.value.found, caught.value.supported) == (version, FORMAT_VERSION)
        assert f"format version {version};" in str(caught.value)
        assert "migrates" not in str(caught.value)
    with pytest.raises(StoreFormatError), open_view(store_path):
        pass
    assert (store_path / "data" / "data.mdb").read_bytes() == before


def test_a_store_without_a_format_record_that_holds_data_is_refused(store_path: Path) -> None:
    store_path.mkdir()
    with lmdb.open(str(store_path / "data"), subdir=True) as env, env.begin(write=True) as txn:
        txn.put(b"Porders", b"\x81\xabconcurrency\x02")  # as dopool 0.1 wrote it
    with pytest.raises(StoreFormatError) as caught:
        Runtime(store_path)
    assert caught.value.found is None
    assert "no format version" in str(caught.value)


# -- data files lost, emptied or cut short -------------------------------------------------------


def test_an_emptied_data_file_is_refused_not_recreated(store_path: Path) -> None:
    Store(store_path).close()
    (store_path / "data" / "data.mdb").write_bytes(b"")
    with pytest.raises(StoreDamagedError, match=r"data\.mdb is empty"):
        Runtime(store_path)
    with pytest.raises(StoreDamagedError), open_view(store_path):
        pass
    assert (store_path / "data" / "data.mdb").stat().st_size == 0


def test_a_lost_data_file_is_refused_not_recreated(store_path: Path) -> None:
    Store(store_path).close()
    (store_path / "data" / "data.mdb").unlink()
    with pytest.raises(StoreDamagedError, match=r"data\.mdb is missing"):
        Runtime(store_path)
    assert not (store_path / "data" / "data.mdb").exists()


def test_a_truncated_data_file_is_refused_before_any_page_is_read(store_path: Path) -> None:
    with Runtime.simulated(store_path) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        pool.pause()
        pool.enqueue_many([{"pad": "x" * 2000} for _ in range(40)])
    data = store_path / "data" / "data.mdb"
    size = data.stat().st_size
    assert size > 8 * 4096
    with data.open("r+b") as file:
        file.truncate(4 * 4096)
    with pytest.raises(StoreDamagedError, match="shorter than"):
        Runtime(store_path)
