"""``dopool check``: every record and counter of a store verified offline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest

from cli_support import invoke
from dopool import EventContext, Runtime
from dopool._ops.check import check_store
from dopool._store.layout import (
    LeaseRecord,
    Meta,
    Namespace,
    OutboxRecord,
    PoolRecord,
    PresenceRecord,
    StoredValues,
    alarm_entry_key,
    call_key,
    encode_due,
    lease_key,
    pack,
    put_lease,
    put_presence,
    read_call,
    read_dedup,
    read_schedule,
    seal,
    seal_pool,
    work_entry_key,
)
from dopool._store.txn import Txn

FIXTURE = Path(__file__).parents[1] / "support" / "fixtures" / "store-v14"  # (make_store.py)
QUEUED = Namespace("orders", 1).queue_key(-2, 4, 1000.0)  # a pending event of the fixture
STORED = StoredValues(Namespace("orders", 1))  # holds "billed" and two long keys
INVOICES = Namespace("invoices", 0)  # holds a follow-up for orders:1, link 0, in its outbox
PRODUCER = bytes.fromhex("00112233445566778899aabbccddeeff")  # its calls 1 and 2 are recorded


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    shutil.copytree(FIXTURE, path)
    return path


@contextmanager
def edit(path: Path) -> Iterator[Txn]:
    with lmdb.open(str(path / "data"), subdir=True) as env, env.begin(write=True) as txn:
        yield txn


def problems(path: Path) -> list[str]:
    result = invoke("check", str(path), "--json")
    document = json.loads(result.stdout)
    assert result.exit_code == (0 if document["ok"] else 1), result.output
    return [f"{p['instance']}: {p['what']}" for p in document["problems"]]


def test_a_sound_store_checks_out(store: Path) -> None:
    result = invoke("check", str(store))
    assert result.exit_code == 0, result.output
    pools = "pools: invoices (1), mail (1), orders (2)"
    assert f"format 14, 66 records, 4 instances; {pools}" in result.stdout
    assert "ok: every record and every counter checks out" in result.stdout


def test_a_live_store_checks_out_beside_its_runtime(store_path: Path) -> None:
    with Runtime.simulated(store_path) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None, concurrency=3)
        pool.enqueue_many(range(20))
        pool.pause(1)
        assert not pool.join(timeout=10)
        # Another process: LMDB refuses a second handle on one store in a process.
        command = [sys.executable, "-m", "dopool", "check", str(store_path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert "ok: every record and every counter checks out" in done.stdout


def test_a_flipped_bit_in_a_record_is_reported_alone(store: Path) -> None:
    with edit(store) as txn:
        value = bytearray(txn.get(QUEUED))
        value[-1] ^= 0x10
        txn.put(QUEUED, bytes(value))
    result = invoke("check", str(store))
    assert result.exit_code == 1
    assert "1 problems:" in result.stdout
    assert "orders:1: damaged: checksum mismatch" in result.stdout
    assert result.stderr == ""


def test_counters_that_do_not_add_up_are_reported(store: Path) -> None:
    with edit(store) as txn:
        txn.delete(QUEUED)
    assert problems(store) == [
        "orders:1: meta counts 2 pending events, the store holds 1",
        # its index entry stays, naming no event
        "orders:1: 0 pending events without an index entry, 1 entries of no pending event",
        "orders:1: meta counts {0: 1, -2: 1} per priority, the keys {0: 1}",
    ]


def test_pending_work_with_no_alarm_is_reported_unless_the_instance_is_stalled(
    store: Path,
) -> None:
    ns = Namespace("orders", 1)  # paused, with 2 events pending and no alarm
    with edit(store) as txn:
        meta = ns.load_meta(txn)
        meta.paused = False  # nothing would ever start them
        ns.save_meta(txn, meta)
    assert problems(store) == ["orders:1: 2 pending events, no alarm set, and not stalled"]
    with edit(store) as txn:
        meta.alarm_failures = 7  # the alarm was given up (alarm_retries=6): stalled
        ns.save_meta(txn, meta)
    assert problems(store) == []


def test_keys_of_no_known_kind_and_misplaced_instances_are_reported(store: Path) -> None:
    with edit(store) as txn:
        txn.put(b"Zstray", b"1")
        txn.put(b"Iorders:5\x00m", txn.get(b"Iorders:1\x00m"))  # sealed under another key
        txn.put(b"Pbad name", seal_pool(b"Pbad name", PoolRecord(1)))
    assert problems(store) == [
        "orders:5: damaged: checksum mismatch",
        "None: pool record of an invalid name 'bad name'",
        "None: a key of no known kind",
        "orders:5: instance beyond the pool's stored concurrency 2",
    ]


def test_instances_a_shrink_left_behind_empty_are_not_problems(tmp_path: Path) -> None:
    """define() lets a pool shrink when the instances it drops hold nothing; their metas
    stay (lifetime counters), and are no problem until one holds something."""
    path = tmp_path / "shrunk"
    with Runtime(path, durability="async") as runtime:
        pool = runtime.define("p", execute=lambda ctx: None, concurrency=4)
        for number in range(8):
            pool.enqueue(number)
        assert pool.join(timeout=10)
    with Runtime(path, durability="async") as runtime:
        runtime.define("p", execute=lambda ctx: None, concurrency=2)
    assert problems(path) == []
    with edit(path) as txn:
        ns = Namespace("p", 3)
        meta = ns.load_meta(txn)
        meta.pending, meta.enqueued, meta.tail = 1, meta.enqueued + 1, meta.tail + 1
        ns.save_meta(txn, meta)
        ns.add_event(txn, meta.tail - 1, pack(7), 0.0, None, 0, 0.0)
    assert "p:3: instance beyond the pool's stored concurrency 2" in problems(path)


def test_a_missing_format_record_is_reported(store: Path) -> None:
    with edit(store) as txn:
        txn.delete(b"F")
    result = invoke("check", str(store))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: store ")
    assert "no format version" in result.stderr


def test_check_store_reads_a_snapshot_in_one_pass(store: Path) -> None:
    with lmdb.open(str(store / "data"), readonly=True, lock=False) as env, env.begin() as txn:
        report = check_store(txn)
    assert report.ok
    assert (report.format_version, report.records, report.instances) == (14, 66, 4)
    assert report.pools == {"invoices": 1, "mail": 1, "orders": 2}


def test_check_of_a_path_with_no_store_is_one_line(tmp_path: Path) -> None:
    result = invoke("check", str(tmp_path / "nowhere"))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no dopool store at")


# -- follow-up links between instances, of one pool or two ----------------------------------


def edit_meta(txn: Txn, namespace: Namespace, change: Callable[[Meta], None]) -> None:
    meta = namespace.load_meta(txn)
    change(meta)
    namespace.save_meta(txn, meta)


def test_a_follow_up_neither_accepted_nor_in_the_outbox_is_reported_lost(store: Path) -> None:
    with edit(store) as txn:
        INVOICES.delete_outbox(txn, 1)
        edit_meta(txn, INVOICES, lambda meta: setattr(meta, "outbox", 0))
    assert problems(store) == [
        "invoices:0: 1 follow-up link(s) for orders:1 between 0 and 0 are neither accepted "
        "nor in its outbox (lost)"
    ]


def test_a_link_accepted_but_never_handed_out_is_reported(store: Path) -> None:
    with edit(store) as txn:
        Namespace("orders", 0).set_delivered(txn, "invoices", 0, 1)
    assert problems(store) == [
        "orders:0: accepted follow-up link 1 from invoices:0, which handed out links below 1 only"
    ]


def test_a_mark_of_another_pools_source_is_not_taken_for_one_of_this_pool(store: Path) -> None:
    """orders:0 accepted link 0 from invoices:0; a mark for orders:0's own pool's
    instance 0 is another source's, with links of its own."""
    with edit(store) as txn:
        Namespace("orders", 0).set_delivered(txn, "orders", 0, 0)
    assert problems(store) == [
        "orders:0: accepted follow-up link 0 from orders:0, which handed out links below 0 only"
    ]


def test_an_outbox_link_past_the_next_one_or_held_twice_is_reported(store: Path) -> None:
    record = OutboxRecord("orders", 1, 5, pack("x"), 1000.0, "alice", 0)
    with edit(store) as txn:
        INVOICES.put_outbox(txn, 7, record)
        INVOICES.put_outbox(txn, 8, record)
        edit_meta(txn, INVOICES, lambda meta: setattr(meta, "outbox", 3))
    assert problems(store) == [
        "invoices:0: its outbox holds a link for orders:1 twice",
        "invoices:0: its outbox holds link 5 for orders:1, at or past its next link 1",
    ]


def test_an_outbox_entry_for_no_pool_or_beyond_one_is_reported(store: Path) -> None:
    with edit(store) as txn:
        INVOICES.put_outbox(txn, 7, OutboxRecord("ghosts", 0, 0, pack("x"), 1.0, None, 0))
        INVOICES.put_outbox(txn, 8, OutboxRecord("orders", 2, 0, pack("x"), 1.0, None, 0))

        def handed(meta: Meta) -> None:
            meta.outbox = 3
            meta.links.update({"ghosts:0": 1, "orders:2": 1})

        edit_meta(txn, INVOICES, handed)
        Namespace("orders", 1).set_delivered(txn, "nobody", 0, 0)
    assert problems(store) == [
        "invoices:0: a follow-up for pool 'ghosts', which has no pool record",
        "invoices:0: a follow-up for orders:2, beyond its concurrency 2",
        "orders:1: a delivery mark of pool 'nobody', which has no pool record",
        "orders:1: accepted follow-ups from nobody:0, which has no meta",
    ]


def test_a_damaged_mark_is_reported_alone_not_as_broken_links(store: Path) -> None:
    with edit(store) as txn:
        key = next(k for k, _ in txn.cursor() if k.startswith(b"Iorders:0\x00s"))
        txn.put(key, b"\x00\x00\x00\x00\x91\x00")
    assert problems(store) == ["orders:0: damaged: checksum mismatch"]


def test_a_live_store_with_follow_ups_between_pools_checks_out(store_path: Path) -> None:
    def relay(ctx: EventContext) -> None:
        if ctx.event > 0:
            target = "b" if ctx.pool_name == "a" else "a"
            ctx.enqueue(ctx.event - 1, partition_key=str(ctx.event), pool=target)

    with Runtime.simulated(store_path) as runtime:
        a = runtime.define("a", execute=relay, concurrency=3)
        b = runtime.define("b", execute=relay, concurrency=2)
        a.enqueue_many(range(5, 25))
        clock = runtime.clock
        for _ in range(40):  # mid-flight: follow-ups in outboxes, some accepted
            clock.step()  # type: ignore[attr-defined]
            with runtime._store.read() as txn:
                assert check_store(txn).problems == []
        for pool in (a, b, a):
            assert pool.join(timeout=10)
        with runtime._store.read() as txn:
            report = check_store(txn)
    assert report.problems == []
    assert report.pools == {"a": 3, "b": 2}


def test_status_shows_the_follow_ups_on_their_way_to_each_pool(store: Path) -> None:
    result = invoke("status", str(store))
    assert result.exit_code == 0, result.output
    assert "1 follow-ups on their way, in outboxes: invoices:0 (1)" in result.stdout
    document = json.loads(invoke("status", str(store), "--json").stdout)
    waiting = {pool["name"]: pool["follow_ups_in_outboxes"] for pool in document["pools"]}
    assert waiting == {"invoices": {}, "mail": {}, "orders": {"invoices:0": 1}}


def test_leases_and_presences_are_checked(store: Path) -> None:
    with edit(store) as txn:
        put_lease(txn, "ghost", 0, LeaseRecord("w-1-a", 1, "h", 1, 1000.0))  # no such pool
        put_lease(txn, "orders", 2, LeaseRecord("w-1-a", 1, "h", 1, 1000.0))  # of 2
        put_lease(txn, "orders", 1, LeaseRecord("two words", 1, "h", 1, 1000.0))
        txn.put(lease_key("invoices", 0), b"\0\0\0\0junk")
        txn.put(b"Wbad-presence", b"\0\0\0\0junk")
        put_presence(txn, "w-1-a", PresenceRecord(1, "h", 1000.0))  # sound
    found = problems(store)
    assert any("lease unit 0 of pool 'ghost', which no pool record has" in p for p in found), found
    assert any("lease unit 2 of pool 'orders', which no pool record has" in p for p in found), found
    assert any("a lease naming no worker ('two words')" in p for p in found), found
    assert sum("damaged: checksum mismatch" in p for p in found) == 2, found
    assert len(found) == 5, found


def test_status_passes_over_a_damaged_lease_and_check_names_it(store: Path) -> None:
    """A damaged lease names no worker: ``dopool status`` shows the pools without it,
    instead of refusing the whole store, and ``dopool check`` reports it."""
    with edit(store) as txn:
        txn.put(lease_key("orders", 0), b"\0\0\0\0junk")
        txn.put(lease_key("orders", 0)[:-1], b"\0\0\0\0junk")  # a key that names no instance
    result = invoke("status", str(store), "--json")
    assert result.exit_code == 0, result.output
    assert [pool["name"] for pool in json.loads(result.stdout)["pools"]] == [
        "invoices",
        "mail",
        "orders",
    ]
    assert sorted(problems(store)) == [
        "None: a key of no known kind",
        "None: damaged: checksum mismatch",
    ]


def test_an_event_index_entry_naming_neither_key_of_its_event_is_reported(store: Path) -> None:
    """A crafted entry with a sound checksum: a lookup of its event falls back to a scan
    (logged) each time, and check names it."""
    entry = Namespace("orders", 1).prefix + b"n" + (4).to_bytes(8, "big")
    with edit(store) as txn:
        txn.put(entry, seal(entry, pack([bytes(12)])))
    assert problems(store) == [
        "orders:1: the event index entry of event 4 names neither of its keys"
    ]


def test_a_finished_dedup_entry_without_its_expiry_key_is_reported(store: Path) -> None:
    """Never swept, it would hold its key until a time a crafted entry may set far off
    (every enqueue of the key answered as a duplicate): check names it."""
    entry = b"Korders\x00order-1"
    with edit(store) as txn:
        record = read_dedup(entry, txn.get(entry))
        txn.put(entry, seal(entry, pack(record._replace(finished_at=1e18))))
    assert problems(store) == ["None: dedup key 'order-1' finished at 1e+18 has no expiry key"]


def test_a_schedule_whose_cron_expression_does_not_parse_is_reported(store: Path) -> None:
    """A crafted record with a sound checksum: it would fire once more, then never."""
    key = Namespace("orders", 0).prefix + b"rnightly"
    with edit(store) as txn:
        record = read_schedule(key, txn.get(key))
        txn.put(key, seal(key, pack(record._replace(cron="not a cron"))))
    [found] = problems(store)
    assert found.startswith("orders:0: a cron expression no definition takes: "), found


def test_alarm_and_work_index_entries_the_metas_do_not_bear_out_are_reported(
    store: Path,
) -> None:
    """A stale alarm entry, a lost work entry, an entry of no pool, and one with a value:
    each named; the store stays a store of sound records."""
    with edit(store) as txn:
        txn.put(alarm_entry_key(5.0, "orders", 0), b"")  # orders:0 is paused: no alarm
        txn.delete(work_entry_key("orders", 1))  # orders:1 holds two events
        txn.put(work_entry_key("ghost", 0), b"")
        txn.put(work_entry_key("invoices", 0), b"x")  # an entry is its key
    assert sorted(problems(store)) == [
        "None: an index entry holds a value",
        "None: an index entry of pool 'ghost', which has no pool record",
        "None: orders:0: alarm at None, the alarm index holds [5.0]",
        "None: orders:1: 2 pending and 0 in the outbox, the work index lacks it",
    ]


# -- an instance's own storage ---------------------------------------------------------


def test_a_stored_value_that_fails_its_checksum_is_reported_alone(store: Path) -> None:
    key = STORED.key("é" * 200 + "x")  # a long key's, named by its digest
    with edit(store) as txn:
        value = bytearray(txn.get(key))
        value[-1] ^= 0x01
        txn.put(key, bytes(value))
    assert problems(store) == ["orders:1: damaged: checksum mismatch"]


def test_stored_values_the_meta_does_not_count_are_reported(store: Path) -> None:
    with edit(store) as txn:
        txn.delete(STORED.key("billed"))  # a value lost
        StoredValues(Namespace("orders", 0)).put(txn, "stray", pack(1))  # one never counted
    assert problems(store) == [
        "orders:0: meta counts 0 stored values, the store holds 1",
        "orders:1: meta counts 3 stored values, the store holds 2",
    ]


def test_a_stored_value_that_does_not_decode_is_reported(store: Path) -> None:
    """A crafted record with a sound checksum: a read of it would raise in the handler."""
    key = STORED.key("billed")
    with edit(store) as txn:
        txn.put(key, seal(key, pack(["billed", b"\xc1"])))  # 0xC1: no msgpack value
    assert problems(store) == ["orders:1: its value does not decode (FormatError)"]


def test_a_partition_key_bucket_and_its_expiry_are_checked_against_each_other(
    store: Path,
) -> None:
    """mail:0 holds ada's bucket (4600.0) and its expiry: one without the other is
    reported; a damaged bucket is reported as that alone, its expiry not with it."""
    mail = Namespace("mail", 0).prefix
    expiry = mail + b"x" + encode_due(4600.0).to_bytes(8, "big") + b"ada"
    stray = mail + b"x" + encode_due(10.0).to_bytes(8, "big") + b"bob"
    with edit(store) as txn:
        value = txn.get(expiry)
        assert value is not None
        txn.delete(expiry)
        txn.put(stray, seal(stray, pack([])))
    assert sorted(problems(store)) == [
        "mail:0: a bucket expiry at t=10 of no bucket then",
        "mail:0: a rate limit bucket with no expiry at t=4600",
    ]
    with edit(store) as txn:
        txn.delete(stray)
        txn.put(expiry, value)
        txn.put(mail + b"bada", b"\0\0\0\0junk")
    assert problems(store) == ["mail:0: damaged: checksum mismatch"]


# -- producers' call records ------------------------------------------------------------


def test_a_sound_call_record_checks_out(store: Path) -> None:
    """The fixture's two call records are read (the sound store checks out, above); one
    more, written as an owner writes it, is no problem either: it names no pool."""
    key = call_key(PRODUCER, 3)
    with edit(store) as txn:
        value = txn.get(call_key(PRODUCER, 2))
        assert value is not None
        assert read_call(call_key(PRODUCER, 2), value).at == 1000.0
        txn.put(key, seal(key, pack([1001.0, [[0, 9, 4, False]]])))
    assert problems(store) == []
    with lmdb.open(str(store / "data"), readonly=True, lock=False) as env, env.begin() as txn:
        assert check_store(txn).records == 67


@pytest.mark.parametrize(
    ("value", "what"),
    [
        pytest.param(b"\0\0\0\0junk", "damaged: checksum mismatch", id="checksum"),
        pytest.param([1000.0], "damaged: not an array of 2 fields", id="fields"),
        pytest.param([1000, []], "damaged: field 'at' is 1000", id="at"),
        pytest.param([1000.0, [[0, 3, 0]]], "damaged: field 'results' is [[0, 3, 0]]", id="result"),
        pytest.param(
            [1000.0, [[0, -1, 0, False]]],
            "damaged: field 'results' is [[0, -1, 0, False]]",
            id="seq",
        ),
    ],
)
def test_a_damaged_call_record_is_reported_naming_it(store: Path, value: object, what: str) -> None:
    key = call_key(PRODUCER, 1)
    with edit(store) as txn:
        txn.put(key, value if isinstance(value, bytes) else seal(key, pack(value)))
    result = invoke("check", str(store), "--json")
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["problems"] == [{"instance": None, "key": repr(key), "what": what}]
    text = invoke("check", str(store))
    assert f"store: {what} (key {key!r})" in text.stdout


def test_a_call_key_of_the_wrong_shape_is_a_stray_key(store: Path) -> None:
    """A ``C`` key one byte short or long, sealed or not, is no call record."""
    short, long = call_key(PRODUCER, 1)[:-1], call_key(PRODUCER, 1) + b"\0"
    with edit(store) as txn:
        txn.put(short, seal(short, pack([1000.0, []])))
        txn.put(long, b"junk")
        txn.put(b"C", b"")
    result = invoke("check", str(store), "--json")
    assert result.exit_code == 1, result.output
    found = [(p["key"], p["what"]) for p in json.loads(result.stdout)["problems"]]
    assert sorted(found) == sorted(
        (repr(key), "a key of no known kind") for key in (short, long, b"C")
    )
