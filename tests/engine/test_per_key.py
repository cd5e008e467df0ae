"""A pool with an instance per partition key (``concurrency="per-key"``, docs/api.md): a
key's instance is its 64-bit hash, kept with the key it was first sent; an event
without a key is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from dopool import (
    EventContext,
    EventValidationError,
    PermanentError,
    Runtime,
    ScheduleDefinitionError,
    connect,
)
from dopool._cluster.routing import stable_hash
from dopool._ops.check import check_store
from dopool._store.layout import PER_KEY, get_pool_record, pool_key

TIMEOUT = 30.0
ROOMS = [f"room-{n}" for n in range(50)]


def noop(ctx: EventContext) -> None:
    pass


def test_every_key_is_its_own_instance_and_status_names_it(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "store") as runtime:
        rooms = runtime.define("rooms", execute=noop, concurrency="per-key")
        assert rooms.concurrency == PER_KEY
        results = [rooms.enqueue({"said": n}, partition_key=key) for n, key in enumerate(ROOMS)]
        assert [r.instance_index for r in results] == [stable_hash(key) for key in ROOMS]
        assert (
            rooms.enqueue("again", partition_key="room-7").instance_index
            == results[7].instance_index
        )
        assert rooms.join()
        status = rooms.status()
        assert (status.used, status.succeeded) == (50, 51)
        assert {s.key for s in status.instances} == set(ROOMS)
        assert status.instance(results[7].instance_index).enqueued == 2
        with runtime._store.read() as txn:
            assert get_pool_record(txn, "rooms") is not None
            assert txn.get(pool_key("rooms"))[4:] == b"\x92\xa7per-key\xc2"  # as stored
            assert check_store(txn).ok


def test_an_event_without_a_key_is_refused_by_name_and_nothing_is_stored(tmp_path: Path) -> None:
    seen: list[str] = []

    def forward(ctx: EventContext) -> None:
        try:
            ctx.enqueue("orphan", pool="rooms")
        except EventValidationError as exc:
            seen.append(str(exc))

    with Runtime.simulated(tmp_path / "store") as runtime:
        rooms = runtime.define("rooms", execute=noop, concurrency="per-key")
        lobby = runtime.define("lobby", execute=forward)
        for refused in (
            lambda: rooms.enqueue("x"),
            lambda: rooms.enqueue_many(["x", "y"]),
        ):
            with pytest.raises(
                EventValidationError, match="'rooms' has an instance per partition key"
            ):
                refused()
        with pytest.raises(ScheduleDefinitionError) as caught:
            rooms.schedule("tick", "t", every=60)
        assert caught.value.argument == "partition_key"
        lobby.enqueue("go")
        assert lobby.join()
        [error] = seen  # raised in the handler, at the call
        assert "pool 'rooms' has an instance per partition key (concurrency='per-key')" in error
        assert rooms.status().enqueued == 0
        rooms.schedule("tick", "t", every=60, partition_key="room-1")  # with one, it is taken
    with connect(tmp_path / "store") as connection:
        producer = connection.pool("rooms")
        with pytest.raises(EventValidationError, match="per partition key"):
            producer.enqueue("x")
        assert producer.enqueue("y", partition_key="room-9").instance_index == stable_hash("room-9")
        assert producer.status().enqueued == 1


def test_follow_ups_from_instances_past_2_to_the_32_are_delivered_once(tmp_path: Path) -> None:
    """A delivery mark names its source by an 8-byte index: a per-key instance's hash."""
    got: list[object] = []

    def fan(ctx: EventContext) -> None:
        ctx.enqueue({"from": ctx.partition_key}, partition_key="all", pool="log")

    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        log = runtime.define("log", execute=lambda ctx: got.append(ctx.event))
        rooms = runtime.define("rooms", execute=fan, concurrency="per-key")
        for key in ROOMS:
            rooms.enqueue("hi", partition_key=key)
        assert any(stable_hash(key) >= 2**32 for key in ROOMS)
        assert rooms.join()
        assert log.join()
        assert sorted(item["from"] for item in got) == sorted(ROOMS)  # type: ignore[index]
        with runtime._store.read() as txn:
            assert check_store(txn).ok


def test_a_per_key_pool_runs_under_the_real_clock_and_reopens_with_its_keys(
    tmp_path: Path,
) -> None:
    def refuse_odd(ctx: EventContext) -> None:
        if ctx.event % 2:
            raise PermanentError("odd")

    store = tmp_path / "store"
    with Runtime(store, durability="async") as runtime:
        users = runtime.define("users", execute=refuse_odd, concurrency="per-key")
        for n in range(40):
            users.enqueue(n, partition_key=f"user-{n}")
        assert users.join(TIMEOUT)
    with Runtime(store, durability="async") as runtime:
        users = runtime.define("users", execute=refuse_odd, concurrency="per-key")
        status = users.status()
        assert (status.used, status.succeeded, status.dead_lettered) == (40, 20, 20)
        assert {s.key for s in status.instances} == {f"user-{n}" for n in range(40)}
        letters = users.dead_letters()
        assert {letter.partition_key for letter in letters} == {
            f"user-{n}" for n in range(1, 40, 2)
        }
