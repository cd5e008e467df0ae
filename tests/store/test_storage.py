"""The storage layer on its own: namespaces, key order, encoding, transactions, the lock."""

from __future__ import annotations

import errno
import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dopool import EventValidationError, StoreLockedError
from dopool._errors import StorageError
from dopool._store.environment import Store
from dopool._store.layout import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    DeadRecord,
    EventRecord,
    InstanceKey,
    Meta,
    Namespace,
    OutboxRecord,
    RecordKind,
    dead_letter_sequence,
    encode_event,
    format_1_mark,
    mark_source,
    outbox_sequence,
    parse_instance_key,
    queue_key_priority,
    queue_key_sequence,
    seal_event,
    started_event,
    unpack,
)
from dopool._store.txn import Txn
from worker_support import parent_of_a_lingering_child


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    store = Store(store_path)
    yield store
    store.close()


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One store for property tests; each example takes fresh namespaces."""
    store = Store(tmp_path_factory.mktemp("shared") / "store", durability="async")
    yield store
    store.close()


_fresh = itertools.count()


def fresh_pool() -> str:
    return f"prop{next(_fresh)}"


def record(tag: str = "e", *, priority: int = 0) -> EventRecord:
    return EventRecord(encode_event(tag), 1.5, None, priority)


def put(store: Store, ns: Namespace, priority: int, sequence: int) -> bytes:
    key = ns.queue_key(priority, sequence, 0.0)
    with store.write() as txn:
        ns.put_event(txn, key, record(f"{priority}/{sequence}", priority=priority))
    return key


def first_key(ns: Namespace, txn: Txn) -> bytes | None:
    first = ns.first_event(txn)
    return None if first is None else first[0]


# -- meta ----------------------------------------------------------------------


def test_meta_defaults_when_absent(store: Store) -> None:
    with store.read() as txn:
        assert Namespace("a", 0).load_meta(txn) == Meta()
    assert Meta().alarm is None
    assert Meta().priorities == {}


def test_meta_round_trips_every_field(store: Store) -> None:
    ns = Namespace("a", 0)
    meta = Meta(
        tail=42,
        pending=3,
        enqueued=45,
        succeeded=30,
        dead_lettered=10,
        drained=2,
        paused=True,
        alarm=1234.5,
        current=ns.queue_key(-7, 39, 0.0),
        attempt=2,
        running=True,
        started_at=1200.25,
        retry_at=1300.0,
        restarts=4,
        outbox_next=9,
        outbox=1,
        held_dead_letters=8,
        priorities={0: 2, -7: 1, PRIORITY_MAX: 0},
    )
    with store.write() as txn:
        ns.save_meta(txn, meta)
    with store.read() as txn:
        loaded = ns.load_meta(txn)
        assert Namespace("a", 1).load_meta(txn) == Meta()
    assert loaded == meta
    assert isinstance(loaded.current, bytes)


def test_pool_records_round_trip(store: Store) -> None:
    with store.write() as txn:
        assert store.get_pool(txn, "orders") is None
        store.put_pool(txn, "orders", 4)
    with store.read() as txn:
        assert store.get_pool(txn, "orders") == 4
        assert store.get_pool(txn, "order") is None


# -- queue keys ----------------------------------------------------------------


def test_queue_key_decodes_priority_and_sequence() -> None:
    ns = Namespace("a", 3)
    for priority, sequence in [(0, 0), (PRIORITY_MAX, 2**64 - 1), (PRIORITY_MIN, 7), (-1, 1)]:
        key = ns.queue_key(priority, sequence, 0.0)
        assert key.startswith(ns.prefix)
        assert queue_key_priority(key) == priority
        assert queue_key_sequence(key) == sequence


def test_each_kind_of_key_has_its_parser() -> None:
    ns = Namespace("a", 3)
    assert dead_letter_sequence(ns.dead_letter_key(2**64 - 1)) == 2**64 - 1
    assert outbox_sequence(ns.outbox_key(7)) == 7
    keys = {
        ns.meta_key: RecordKind.META,
        ns.queue_key(-1, 5, 0.0): RecordKind.EVENT,
        ns.dead_letter_key(5): RecordKind.DEAD_LETTER,
        ns.outbox_key(5): RecordKind.OUTBOX,
    }
    for key, kind in keys.items():
        assert parse_instance_key(key) == InstanceKey("a", 3, kind)
    assert parse_instance_key(ns.dead_letter_key(5)[:-1]) is None  # too short: no key of ours


def test_a_delivery_mark_names_its_source_pool_and_index(store: Store) -> None:
    ns = Namespace("a", 3)
    with store.write() as txn:
        ns.set_delivered(txn, "other-pool.2", 4095, 1)
    with store.read() as txn:
        [(kind, key)] = list(ns.iter_keys(txn))
    assert kind is RecordKind.DELIVERY_MARK
    assert parse_instance_key(key) == InstanceKey("a", 3, RecordKind.DELIVERY_MARK)
    assert mark_source(key) == ("other-pool.2", 4095)
    assert format_1_mark(key) is None
    # Format 1's mark, keyed by the source's index alone, is no key of format 2's.
    old = ns.mark_prefix + (7).to_bytes(4, "big")
    assert parse_instance_key(old) is None
    assert format_1_mark(old) == ("a", 3, 7)
    for bad in (b"", b"p", b"p\x00", b"p\x00\x00\x00\x01", b"p q\x00\x00\x00\x00\x01"):
        assert parse_instance_key(ns.mark_prefix + bad) is None, bad


def test_the_started_event_is_read_from_the_meta() -> None:
    ns = Namespace("a", 3)
    assert started_event(Meta().current) is None
    assert started_event(ns.queue_key(-7, 39, 0.0)) == (-7, 39)


def test_events_round_trip(store: Store) -> None:
    ns = Namespace("a", 0)
    key = ns.queue_key(5, 0, 0.0)
    stored = EventRecord(encode_event({"id": 1}), 10.0, "user-1", 5)
    with store.write() as txn:
        ns.put_event(txn, key, stored)
    with store.read() as txn:
        got = ns.get_event(txn, key)
        assert ns.get_event(txn, ns.queue_key(5, 1, 0.0)) is None
    assert got == stored
    assert got is not None
    assert unpack(got.event) == {"id": 1}


def test_an_event_added_from_its_fields_is_stored_as_its_record_would_be(store: Store) -> None:
    ns = Namespace("a", 0)
    stored = EventRecord(encode_event({"id": 1}), 10.0, None, -3)
    with store.write() as txn:
        ns.add_event(txn, 4, stored.event, stored.enqueued_at, None, -3, 0.0)
        ns.put_event(txn, ns.queue_key(-3, 5, 0.0), stored)
    with store.read() as txn:
        added, put = txn.get(ns.queue_key(-3, 4, 0.0)), txn.get(ns.queue_key(-3, 5, 0.0))
        assert ns.get_event(txn, ns.queue_key(-3, 4, 0.0)) == stored
    assert added == seal_event(ns.queue_key(-3, 4, 0.0), stored)
    assert added[4:] == put[4:]


@given(
    entries=st.lists(
        st.tuples(
            st.one_of(st.integers(-3, 3), st.integers(PRIORITY_MIN, PRIORITY_MAX)),
            st.integers(0, 2**64 - 1),
        ),
        min_size=1,
        max_size=30,
        unique_by=lambda entry: entry[1],  # sequences are unique within an instance
    )
)
def test_queue_order_is_priority_descending_then_sequence(
    shared_store: Store, entries: list[tuple[int, int]]
) -> None:
    pool = fresh_pool()
    ns, neighbour = Namespace(pool, 1), Namespace(pool, 10)  # adjacent in key order
    with shared_store.write() as txn:
        for priority, sequence in entries:  # in the drawn (random) order
            ns.put_event(txn, ns.queue_key(priority, sequence, 0.0), record(priority=priority))
        neighbour.put_event(txn, neighbour.queue_key(PRIORITY_MAX, 0, 0.0), record())
    expected = sorted(entries, key=lambda entry: (-entry[0], entry[1]))
    with shared_store.read() as txn:
        first = first_key(ns, txn)
        keys = list(ns.iter_event_keys(txn))
    assert first is not None
    assert (queue_key_priority(first), queue_key_sequence(first)) == expected[0]
    assert [(queue_key_priority(k), queue_key_sequence(k)) for k in keys] == expected
    with shared_store.write() as txn:
        assert ns.delete_events(txn) == len(entries)
        assert neighbour.delete_events(txn) == 1


def test_first_event_of_an_empty_queue_is_none_despite_neighbours(store: Store) -> None:
    a1, a10, ab1 = Namespace("a", 1), Namespace("a", 10), Namespace("ab", 1)
    with store.write() as txn:
        # a:1 holds everything but events: a dead letter sorts before its queue, a
        # delivery mark after it; a:10 and ab:1 hold events right after a:1's keys.
        a1.put_dead_letter(txn, 0, dead_record())
        a1.set_delivered(txn, "a", 0, 5)
        a10.put_event(txn, a10.queue_key(0, 0, 0.0), record())
        ab1.put_event(txn, ab1.queue_key(0, 0, 0.0), record())
    with store.read() as txn:
        assert first_key(a1, txn) is None
        assert list(a1.iter_event_keys(txn)) == []
        assert first_key(a10, txn) == a10.queue_key(0, 0, 0.0)


def test_first_event_at_the_end_of_the_database(store: Store) -> None:
    with store.read() as txn:
        assert first_key(Namespace("zzz", 0), txn) is None


def test_delete_event_removes_one_key(store: Store) -> None:
    ns = Namespace("a", 0)
    keys = [put(store, ns, 0, seq) for seq in range(3)]
    with store.write() as txn:
        ns.delete_event(txn, keys[0])
    with store.read() as txn:
        assert ns.first_event(txn) == (keys[1], record("0/1"))
        assert list(ns.iter_event_keys(txn)) == keys[1:]


# -- isolation between namespaces ------------------------------------------------


def fill(store: Store, ns: Namespace, events: int, dead: int) -> None:
    with store.write() as txn:
        for seq in range(events):
            ns.put_event(txn, ns.queue_key(seq % 3, seq, 0.0), record())
        for seq in range(dead):
            ns.put_dead_letter(txn, seq, dead_record())
        ns.save_meta(txn, Meta(tail=events))
        ns.put_outbox(txn, 0, outbox_record())
        ns.set_delivered(txn, "a", 1, 3)


def counts(store: Store, ns: Namespace) -> tuple[int, int, int]:
    with store.read() as txn:
        return ns.count_pending(txn), ns.count_dead_letters(txn), ns.count_outbox(txn)


@pytest.mark.parametrize(
    ("target", "others"),
    [
        (("a", 1), [("a", 10), ("a", 0), ("a", 2), ("ab", 1), ("b", 1)]),
        (("a", 10), [("a", 1), ("a", 100), ("a", 11)]),
        (("ab", 1), [("a", 1), ("abc", 1), ("ab", 10)]),
        (("z", 9), [("a", 9), ("z", 90)]),  # the last keys of the database
    ],
)
def test_deletes_touch_only_their_own_instance(
    store: Store, target: tuple[str, int], others: list[tuple[str, int]]
) -> None:
    mine = Namespace(*target)
    neighbours = [Namespace(*other) for other in others]
    fill(store, mine, events=5, dead=4)
    for n, ns in enumerate(neighbours):
        fill(store, ns, events=2 + n, dead=1 + n)

    with store.write() as txn:
        assert mine.delete_events(txn) == 5
    assert counts(store, mine) == (0, 4, 1)
    with store.write() as txn:
        assert mine.delete_dead_letters(txn) == 4
        assert mine.delete_events(txn) == 0
        assert mine.delete_dead_letters(txn) == 0
    assert counts(store, mine) == (0, 0, 1)

    with store.read() as txn:
        assert mine.load_meta(txn) == Meta(tail=5)
        assert mine.last_delivered(txn, "a", 1) == 3
    for n, ns in enumerate(neighbours):
        assert counts(store, ns) == (2 + n, 1 + n, 1), ns.prefix


# -- dead letters, outbox, delivery marks ------------------------------------------


def dead_record(error: str = "boom", partition_key: str | None = None) -> DeadRecord:
    return DeadRecord(encode_event({"x": b"\x00"}), error, 3, 1.0, 9.5, partition_key, -2)


def outbox_record(target: int = 1, pool: str = "a") -> OutboxRecord:
    return OutboxRecord(pool, target, 0, encode_event(["follow", "up"]), 4.0, "k", 1)


def test_dead_letters_round_trip_in_sequence_order(store: Store) -> None:
    ns = Namespace("a", 0)
    records = {7: dead_record("seven", "pk"), 2: dead_record("two"), 300: dead_record("big")}
    with store.write() as txn:
        for seq, rec in records.items():
            ns.put_dead_letter(txn, seq, rec)
    with store.read() as txn:
        assert list(ns.iter_dead_letters(txn)) == sorted(records.items())
    with store.write() as txn:
        assert ns.pop_dead_letter(txn, 7) == records[7]
        assert ns.pop_dead_letter(txn, 7) is None
        assert ns.pop_dead_letter(txn, 8) is None
    with store.read() as txn:
        assert [seq for seq, _ in ns.iter_dead_letters(txn)] == [2, 300]
    assert unpack(records[7].event) == {"x": b"\x00"}


def test_outbox_round_trips(store: Store) -> None:
    ns = Namespace("a", 0)
    with store.write() as txn:
        ns.put_outbox(txn, 1, outbox_record(2, "other.pool"))
        ns.put_outbox(txn, 0, outbox_record(0))
    with store.read() as txn:
        assert list(ns.iter_outbox(txn)) == [
            (0, outbox_record(0)),
            (1, outbox_record(2, "other.pool")),
        ]
    with store.write() as txn:
        assert ns.delete_outbox(txn, 0) is True
        assert ns.delete_outbox(txn, 0) is False
    with store.read() as txn:
        assert list(ns.iter_outbox(txn)) == [(1, outbox_record(2, "other.pool"))]
        assert Namespace("a", 1).count_outbox(txn) == 0


def test_last_delivered_per_source(store: Store) -> None:
    ns = Namespace("a", 0)
    with store.read() as txn:
        assert ns.last_delivered(txn, "a", 0) == -1
    with store.write() as txn:
        ns.set_delivered(txn, "a", 0, 5)
        ns.set_delivered(txn, "a", 3, 2**64 - 1)
    with store.write() as txn:
        ns.set_delivered(txn, "a", 0, 6)
    with store.read() as txn:
        assert ns.last_delivered(txn, "a", 0) == 6
        assert ns.last_delivered(txn, "a", 3) == 2**64 - 1
        assert ns.last_delivered(txn, "a", 1) == -1
        assert Namespace("a", 1).last_delivered(txn, "a", 0) == -1


def test_sources_of_two_pools_have_marks_of_their_own(store: Store) -> None:
    """A mark is keyed by its source's pool and index: "a:0", "ab:0" and "b:0" are three."""
    ns = Namespace("b", 2)
    with store.write() as txn:
        ns.set_delivered(txn, "a", 0, 5)
        ns.set_delivered(txn, "ab", 0, 7)
        ns.set_delivered(txn, "b", 0, 9)  # its own pool's instance 0
    with store.read() as txn:
        assert ns.last_delivered(txn, "a", 0) == 5
        assert ns.last_delivered(txn, "ab", 0) == 7
        assert ns.last_delivered(txn, "b", 0) == 9
        assert ns.last_delivered(txn, "a", 1) == -1
        assert list(ns.iter_marks(txn)) == [(("a", 0), 5), (("ab", 0), 7), (("b", 0), 9)]
        kinds = [kind for kind, _ in ns.iter_keys(txn)]
        assert kinds == [RecordKind.DELIVERY_MARK] * 3


# -- transactions ----------------------------------------------------------------


def test_an_exception_inside_a_write_rolls_it_back(store: Store) -> None:
    ns = Namespace("a", 0)
    put(store, ns, 0, 0)

    def failing_write() -> None:
        with store.write() as txn:
            ns.put_event(txn, ns.queue_key(0, 1, 0.0), record())
            ns.delete_event(txn, ns.queue_key(0, 0, 0.0))
            ns.save_meta(txn, Meta(tail=2))
            ns.put_dead_letter(txn, 0, dead_record())
            raise RuntimeError("handler blew up")

    with pytest.raises(RuntimeError, match="handler blew up"):
        failing_write()
    with store.read() as txn:
        assert list(ns.iter_event_keys(txn)) == [ns.queue_key(0, 0, 0.0)]
        assert ns.load_meta(txn) == Meta()
        assert list(ns.iter_dead_letters(txn)) == []


def test_lmdb_errors_are_mapped_to_storage_error(store: Store) -> None:
    with pytest.raises(StorageError) as info, store.write() as txn:
        txn.put(b"k" * 1000, b"v")  # over LMDB's maximum key size
    assert isinstance(info.value.__cause__, lmdb.Error)
    with store.read() as txn:
        assert txn.get(b"k" * 1000) is None


def test_a_read_does_not_see_a_later_commit(store: Store) -> None:
    ns = Namespace("a", 0)
    with store.read() as txn:
        put(store, ns, 0, 0)
        assert first_key(ns, txn) is None
    with store.read() as txn:
        assert first_key(ns, txn) == ns.queue_key(0, 0, 0.0)


# -- encoding --------------------------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        {1, 2},
        frozenset({1}),
        object(),
        {"nested": [1, {2}]},
        2**64,
        -(2**63) - 1,
        "\ud800",
        {"key": "bad \udc80 surrogate"},
        1j,
    ],
    ids=lambda event: "object()" if type(event) is object else repr(event),  # no address
)
def test_encode_event_rejects_what_msgpack_cannot_encode(event: Any) -> None:
    with pytest.raises(EventValidationError, match="not msgpack-encodable") as info:
        encode_event(event)
    assert info.value.position is None
    assert info.value.__cause__ is not None


def test_encode_event_carries_the_position() -> None:
    with pytest.raises(EventValidationError) as info:
        encode_event({1}, position=3)
    assert info.value.position == 3


@pytest.mark.parametrize(
    ("event", "decoded"),
    [
        ((1, "two", (3,)), [1, "two", [3]]),
        (b"\x00\xff", b"\x00\xff"),
        (
            {"a": [None, True, 1.5, -(2**63), 2**64 - 1]},
            {"a": [None, True, 1.5, -(2**63), 2**64 - 1]},
        ),
        ({1: "int keys"}, {1: "int keys"}),
        ("", ""),
    ],
)
def test_encode_event_round_trips(event: Any, decoded: Any) -> None:
    data = encode_event(event)
    assert isinstance(data, bytes)
    assert unpack(data) == decoded
    assert type(unpack(data)) is type(decoded)


# -- durability modes and reopening -------------------------------------------------


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_committed_data_survives_close_and_reopen(store_path: Path, durability: str) -> None:
    ns = Namespace("a", 0)
    first = Store(store_path, durability=durability)
    try:
        put(first, ns, 1, 0)
        with first.write() as txn:
            ns.save_meta(txn, Meta(tail=1, pending=1, enqueued=1))
    finally:
        first.close()
    second = Store(store_path, durability=durability)
    try:
        with second.read() as txn:
            assert list(ns.iter_event_keys(txn)) == [ns.queue_key(1, 0, 0.0)]
            assert ns.load_meta(txn) == Meta(tail=1, pending=1, enqueued=1)
    finally:
        second.close()


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_no_mode_writes_through_the_memory_map(store_path: Path, durability: str) -> None:
    """LMDB's ``writemap`` would make async commits ~3x cheaper, but a full disk then kills
    the process with SIGBUS where plain writes fail with an error (docs/benchmarks.md)."""
    store = Store(store_path, durability=durability)
    try:
        assert store._env.flags()["writemap"] is False
    finally:
        store.close()


def test_store_creates_missing_directories(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "store"
    Store(path).close()
    assert (path / "data").is_dir()


def test_close_is_idempotent(store_path: Path) -> None:
    store = Store(store_path)
    store.close()
    store.close()


# -- the store lock --------------------------------------------------------------


def test_a_second_store_in_this_process_is_refused(store: Store, store_path: Path) -> None:
    with pytest.raises(StoreLockedError) as info:
        Store(store_path)
    assert info.value.path == str(store_path)
    assert f"pid {os.getpid()} " in info.value.holder
    assert info.value.holder.endswith("(this process)")
    assert info.value.holder in str(info.value)
    # A refused open must not disturb the holder: still locked, still usable.
    with pytest.raises(StoreLockedError):
        Store(store_path)
    put(store, Namespace("a", 0), 0, 0)


_OPEN_IN_CHILD = textwrap.dedent(
    """
    import json, sys
    from dopool import StoreLockedError
    from dopool._store.environment import Store
    try:
        Store(sys.argv[1]).close()
    except StoreLockedError as exc:
        print(json.dumps({"outcome": "locked", "holder": exc.holder, "path": exc.path}))
    else:
        print(json.dumps({"outcome": "opened"}))
    """
)


def open_in_child(path: Path) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_IN_CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, str] = json.loads(done.stdout)
    return result


def test_a_store_in_another_process_is_refused_naming_this_pid(
    store: Store, store_path: Path
) -> None:
    result = open_in_child(store_path)
    assert result["outcome"] == "locked"
    assert result["path"] == str(store_path)
    assert result["holder"].startswith(f"pid {os.getpid()} ")
    assert "(this process)" not in result["holder"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_keep_a_dead_parents_store_lock(store_path: Path) -> None:
    # The child's copy of the lock file held the flock after the parent died: the next
    # runtime was refused ('locked by another runtime') for as long as the child lived.
    before = """
        import sys
        from dopool._store.environment import Store
        store = Store(sys.argv[1])
        """
    after = """
        print("forked", flush=True)
        os._exit(0)  # dies without closing the store
        """
    with parent_of_a_lingering_child(before, after, str(store_path)) as line:
        assert line == "forked\n"
        assert open_in_child(store_path) == {"outcome": "opened"}


def test_after_close_the_store_can_be_opened_again(store_path: Path) -> None:
    Store(store_path).close()
    assert open_in_child(store_path) == {"outcome": "opened"}
    reopened = Store(store_path)
    reopened.close()


# -- stores that cannot be opened for writing ------------------------------------------------


def refuse_opening_the_lock(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Make opening ``<store>/lock`` fail as on a read-only mount or directory.

    Tests run as root, which permission bits do not stop, so the refusal is injected.
    """
    real_open = os.open

    def refusing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(path).name == "lock":
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_a_lock_file_that_cannot_be_opened_is_a_storage_error(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    Store(store_path).close()
    refuse_opening_the_lock(monkeypatch, code)
    with pytest.raises(StorageError) as info:
        Store(store_path)
    assert not isinstance(info.value, StoreLockedError)
    assert str(store_path / "lock") in str(info.value)
    assert os.strerror(code) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


def test_a_directory_in_place_of_the_lock_file_is_a_storage_error(store_path: Path) -> None:
    (store_path / "lock").mkdir(parents=True)
    with pytest.raises(StorageError, match="lock"):
        Store(store_path)


def test_a_lock_file_that_cannot_be_written_is_a_storage_error_and_stays_unlocked(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_args: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patched:
        patched.setattr(os, "pwrite", full)
        with pytest.raises(StorageError, match="No space left"):
            Store(store_path)
    Store(store_path).close()  # the failed open released its lock


def test_a_store_path_that_is_a_file_is_a_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(StorageError, match="file"):
        Store(path)


def test_close_releases_the_lock_even_if_the_lock_file_cannot_be_truncated(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(store_path)

    def failing(*_args: Any) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with monkeypatch.context() as patched:
        patched.setattr(os, "ftruncate", failing)
        store.close()
    Store(store_path).close()


def test_a_symlinked_lock_file_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    store_path = tmp_path / "store"
    store_path.mkdir()
    target = tmp_path / "precious"
    target.write_text("keep me")
    (store_path / "lock").symlink_to(target)
    with pytest.raises(StorageError) as info:
        Store(store_path)
    assert str(store_path / "lock") in str(info.value)
    assert "symbolic link" in str(info.value)
    assert target.read_text() == "keep me"
    assert not (store_path / "data").exists()


def test_a_dangling_lock_symlink_does_not_create_its_target(tmp_path: Path) -> None:
    store_path = tmp_path / "store"
    store_path.mkdir()
    target = tmp_path / "created-through-the-link"
    (store_path / "lock").symlink_to(target)
    with pytest.raises(StorageError, match="symbolic link"):
        Store(store_path)
    assert not target.exists()


def test_a_lock_file_that_is_not_a_regular_file_is_refused(store_path: Path) -> None:
    store_path.mkdir()
    os.mkfifo(store_path / "lock")
    with pytest.raises(StorageError) as info:
        Store(store_path)
    assert str(store_path / "lock") in str(info.value)
    assert "not a regular file" in str(info.value)
