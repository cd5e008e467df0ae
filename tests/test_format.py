"""The store format: its version record, its pinned layout, and stores that are refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import lmdb
import pytest

from dopool import (
    EventContext,
    Runtime,
    SimulatedClock,
    StoreDamagedError,
    StoreFormatError,
)
from dopool._layout import (
    FORMAT_VERSION,
    DeadRecord,
    EventRecord,
    Meta,
    Namespace,
    OutboxRecord,
    read_outbox,
    seal,
    seal_format,
    seal_outbox,
)
from dopool._sim.storeview import open_view
from dopool._storage import Store

FIXTURE = Path(__file__).parent / "fixtures" / "store-v1"


@pytest.fixture
def fixture_store(tmp_path: Path) -> Path:
    """A copy of the committed format-1 store (``tests/fixtures/make_store.py``)."""
    path = tmp_path / "store"
    shutil.copytree(FIXTURE, path)
    return path


def raw_env(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path / "data"), subdir=True)


# -- the committed store of format 1 ----------------------------------------------------


def test_the_format_1_fixture_decodes_to_exactly_what_was_written(fixture_store: Path) -> None:
    """A change of layout that misreads stores of format 1 fails here."""
    store = Store(fixture_store)
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
                links={1: 1},
            )
            assert one.load_meta(txn) == Meta(
                tail=4, pending=2, enqueued=4, succeeded=2, paused=True, priorities={0: 1, -2: 1}
            )
            assert zero.get_event(txn, zero.queue_key(9, 2)) == EventRecord(
                b"\x82\xa2id\x05\xa4tags\x92\xa1x\xa1y", 1000.0, "bob", 9
            )
            assert [one.get_event(txn, key) for key in one.iter_event_keys(txn)] == [
                EventRecord(b"\x82\xa2id\x03\xa4blob\xc4\x02\x00\xff", 1000.0, "alice", 0),
                EventRecord(b"\x81\xa2id\x04", 1000.0, "alice", -2),
            ]
            assert list(zero.iter_dead_letters(txn)) == [
                (
                    0,
                    DeadRecord(
                        b"\x82\xa2id\x02\xa6poison\xc3",
                        "PermanentError: poisoned",
                        1,
                        1000.0,
                        1000.0,
                        "bob",
                        3,
                        False,
                    ),
                )
            ]
            assert one.last_delivered(txn, 0) == 0
            assert zero.last_delivered(txn, 1) == -1
    finally:
        store.close()


def test_the_format_1_fixture_runs_its_pending_events_in_order(fixture_store: Path) -> None:
    seen: list[object] = []

    def record(ctx: EventContext) -> None:
        seen.append((ctx.instance_index, ctx.sequence, ctx.event))

    with Runtime(fixture_store, clock=SimulatedClock(2000.0), seed=7) as runtime:
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


def test_an_outbox_record_has_its_documented_layout() -> None:
    key = Namespace("p", 0).prefix + b"o" + (5).to_bytes(8, "big")
    record = OutboxRecord(1, 2, b"\xa1x", 3.5, None, -1)
    value = seal_outbox(key, record)
    assert value[4:] == b"\x96\x01\x02\xc4\x02\xa1x\xcb@\x0c\x00\x00\x00\x00\x00\x00\xc0\xff"
    assert read_outbox(key, value) == record


# -- the format record ---------------------------------------------------------------------


def test_a_new_store_records_its_format(store_path: Path) -> None:
    Store(store_path).close()
    with raw_env(store_path) as env, env.begin() as txn:
        assert txn.get(b"F") == seal_format(b"F")
    assert seal_format(b"F")[4:] == bytes([0x91, FORMAT_VERSION])


def test_a_store_of_another_format_is_refused_and_left_as_it_was(store_path: Path) -> None:
    Store(store_path).close()
    with raw_env(store_path) as env, env.begin(write=True) as txn:
        txn.put(b"F", seal(b"F", bytes([0x91, FORMAT_VERSION + 1])))
    before = (store_path / "data" / "data.mdb").read_bytes()
    for _ in range(2):  # and the lock was released
        with pytest.raises(StoreFormatError) as caught:
            Runtime(store_path)
        assert (caught.value.found, caught.value.supported) == (FORMAT_VERSION + 1, FORMAT_VERSION)
        assert "format version 2" in str(caught.value)
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
