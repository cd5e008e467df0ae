"""An instance's own storage (``ctx.storage``, docs/api.md): writes commit with the event's
success and are discarded with a failed attempt, so a retried event never applies its
change twice; a handler reads its own writes; ``pool.storage(...)`` reads from outside."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dopool import (
    ConfigurationError,
    EventContext,
    PermanentError,
    PoolEvent,
    RetryPolicy,
    Runtime,
    StorageItemError,
    connect,
)
from dopool._cluster.routing import stable_hash
from dopool._ops.check import check_store
from dopool.chaos import FaultPlan

RETRY = RetryPolicy(max_attempts=8, initial_delay=0.5, jitter=0.0)
TIMEOUT = 30.0
LONG = "x" * 400  # a key's first 400 UTF-8 bytes: longer keys that share them sort by digest


def count(ctx: EventContext) -> None:
    """Add one to the instance's counter, and keep the event under its number."""
    storage = ctx.storage
    storage.put("count", storage.get("count", 0) + 1)
    storage.put(f"seen:{ctx.event['n']:04}", ctx.event)


def test_writes_commit_with_the_success_and_a_handler_reads_its_own(sim: Runtime) -> None:
    read: list[Any] = []

    def handle(ctx: EventContext) -> None:
        count(ctx)
        read.append(ctx.storage.get("count"))  # its own write, before any commit
        read.append(ctx.storage.get_many(["count", "nothing", f"seen:{ctx.event['n']:04}"]))

    pool = sim.define("p", execute=handle, concurrency="per-key")
    for n in range(4):
        pool.enqueue({"n": n}, partition_key="a" if n % 2 else "b")
    assert pool.join(timeout=TIMEOUT)
    a = pool.storage(partition_key="a")
    assert a.get("count") == 2
    assert a.list() == {"count": 2, "seen:0001": {"n": 1}, "seen:0003": {"n": 3}}
    assert a.get("missing", "none") == "none"
    first = read[1]  # the first handler's: its counter and its own event, nothing else
    assert read[0] == 1
    assert first["count"] == 1
    assert len(first) == 2
    status = pool.status()
    assert status.stored == 6
    assert [i.stored for i in status.instances] == [3, 3]


def test_a_failed_attempt_discards_its_writes(sim: Runtime) -> None:
    def handle(ctx: EventContext) -> None:
        if ctx.event == "seed":
            ctx.storage.put("keep", "me")
            return
        ctx.storage.put(f"attempt:{ctx.attempt}", ctx.attempt)
        assert ctx.storage.delete("keep") is (ctx.event != "later" or ctx.attempt < 9)
        if ctx.event == "poison":
            raise PermanentError("never")
        if ctx.attempt < 3:
            raise RuntimeError(f"attempt {ctx.attempt} fails")

    pool = sim.define("p", execute=handle, retry=RETRY)
    pool.enqueue("seed")
    pool.enqueue("poison")
    assert pool.join(timeout=TIMEOUT)
    assert pool.storage(instance=0).list() == {"keep": "me"}  # nothing of a dead letter
    pool.enqueue("later")
    assert pool.join(timeout=TIMEOUT)
    assert pool.storage(instance=0).list() == {"attempt:3": 3}  # attempts 1 and 2 failed
    assert pool.status().stored == 1


@pytest.mark.parametrize("seed", range(12))
def test_a_crash_never_applies_an_events_writes_twice_nor_loses_them(seed: int) -> None:
    """Crashes before and after the handler over many events: each key's counter is its
    instance's successes, exactly, under both backends."""
    plan = FaultPlan(seed=seed, crash_before_execute=0.15, crash_after_execute=0.3)
    keys = [f"k{n}" for n in range(5)]
    backend = ("greenlet", "threads")[seed % 2]
    with Runtime.simulated(seed=seed, faults=plan, backend=backend) as runtime:
        pool = runtime.define("p", execute=count, concurrency="per-key", retry=RETRY)
        for n in range(60):
            pool.enqueue({"n": n}, partition_key=keys[(n * 7 + seed) % len(keys)])
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()
        assert status.succeeded + status.dead_lettered == 60
        assert sum(i.restarts for i in status.instances) > 0  # the plan crashed some
        for key in keys:
            succeeded = status.instance(stable_hash(key)).succeeded
            stored = pool.storage(partition_key=key).list()
            assert stored.get("count", 0) == succeeded
            assert len(stored) == succeeded + (succeeded > 0)  # one record per success
        with runtime._store.read() as txn:
            assert check_store(txn).ok


def test_a_real_clock_commits_writes_that_a_reopened_store_and_a_producer_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Runtime(path) as runtime:
        pool = runtime.define("p", execute=count, concurrency="per-key")
        for n in range(6):
            pool.enqueue({"n": n}, partition_key=f"room-{n % 2}")
        assert pool.join(timeout=TIMEOUT)
        assert pool.storage(partition_key="room-1").get("count") == 3
    with connect(path) as connection:
        producer = connection.pool("p")
        assert producer.storage(partition_key="room-0").list(prefix="seen:") == {
            f"seen:000{n}": {"n": n} for n in (0, 2, 4)
        }
        assert producer.status().stored == 8
    with Runtime(path) as runtime:
        pool = runtime.define("p", execute=count, concurrency="per-key")
        pool.enqueue({"n": 6}, partition_key="room-0")
        assert pool.join(timeout=TIMEOUT)
        assert pool.storage(partition_key="room-0").get("count") == 4
        with runtime._store.read() as txn:
            assert check_store(txn).ok


def test_keys_and_values_over_their_limits_are_refused_by_name_with_nothing_buffered(
    sim: Runtime,
) -> None:
    refused: list[StorageItemError] = []

    def handle(ctx: EventContext) -> None:
        storage = ctx.storage
        storage.put("k", "kept")
        attempts: list[Callable[[], object]] = [
            lambda: storage.put(7, "v"),  # type: ignore[arg-type]
            lambda: storage.put("é" * 1025, "v"),  # 2,050 bytes of UTF-8
            lambda: storage.put("\udc80", "v"),
            lambda: storage.put("k", object()),
            lambda: storage.put("k", {(1, 2): "tuple key"}),
            lambda: storage.put("k", b"\0" * (128 * 1024)),
            lambda: storage.put_many({"a": 1, "k": object()}),
            lambda: storage.get(None),  # type: ignore[arg-type]
        ]
        for attempt in attempts:
            with pytest.raises(StorageItemError) as caught:
                attempt()
            refused.append(caught.value)
        storage.put("big", b"\0" * (128 * 1024 - 5))  # 128 KiB encoded, bin's header in it

    pool = sim.define("p", execute=handle)
    pool.enqueue("go")
    assert pool.join(timeout=TIMEOUT)
    assert pool.status().succeeded == 1
    assert pool.storage(instance=0).get("k") == "kept"
    assert set(pool.storage(instance=0).list()) == {"big", "k"}  # "a" went with put_many
    assert [(e.what, e.size, e.limit) for e in refused] == [
        ("key", None, None),
        ("key", 2050, 2048),
        ("key", None, None),
        ("value", None, None),
        ("value", None, None),
        ("value", 128 * 1024 + 5, 128 * 1024),
        ("value", None, None),
        ("key", None, None),
    ]
    assert "a key is a str, not int" in str(refused[0])
    assert "encodes but does not decode" in refused[4].reason


def test_storage_is_read_only_once_the_attempt_ended(sim: Runtime) -> None:
    kept: list[EventContext] = []

    def handle(ctx: EventContext) -> None:
        kept.append(ctx)
        if ctx.event == "writes":
            ctx.storage.put("k", 1)

    pool = sim.define("p", execute=handle)
    pool.enqueue("writes")
    pool.enqueue("reads nothing")
    assert pool.join(timeout=TIMEOUT)
    for ctx in kept:  # one used storage in its attempt, one never did
        with pytest.raises(ConfigurationError, match="after its attempt ended"):
            ctx.storage.put("k", 2)
        assert ctx.storage.get("k") == 1
    assert pool.storage(instance=0).get("k") == 1


def test_pool_storage_names_one_instance(sim: Runtime) -> None:
    pool = sim.define("p", execute=count, concurrency=4)
    with pytest.raises(ConfigurationError, match="one of partition_key= and instance="):
        pool.storage()
    with pytest.raises(ConfigurationError, match="one of partition_key= and instance="):
        pool.storage(partition_key="a", instance=1)
    with pytest.raises(ConfigurationError, match="no instance 4"):
        pool.storage(instance=4)
    with pytest.raises(ConfigurationError, match="must be a str"):
        pool.storage(partition_key=3)  # type: ignore[arg-type]
    pool.enqueue({"n": 0}, partition_key="a")
    assert pool.join(timeout=TIMEOUT)
    assert pool.storage(instance=stable_hash("a") % 4).get("count") == 1
    assert pool.storage(partition_key="a").get("count") == 1
    with pytest.raises(ConfigurationError, match="limit must be"):
        pool.storage(instance=0).list(limit=-1)


# -- listing: in key order, through the buffered writes -----------------------------------

KEYS = st.sampled_from(["", "a", "ab", "b", "é", "z", LONG, LONG + "a", LONG + "b", LONG + "é"])
OPS = st.lists(st.tuples(st.sampled_from(["put", "delete"]), KEYS, st.integers(0, 9)))
BOUNDS = st.one_of(st.none(), KEYS)


@settings(max_examples=40, deadline=None)
@given(
    committed=OPS,
    buffered=OPS,
    prefix=st.sampled_from(["", "a", LONG, LONG + "a"]),
    start=BOUNDS,
    end=BOUNDS,
    limit=st.one_of(st.none(), st.integers(0, 6)),
)
def test_list_reads_committed_values_with_the_attempts_writes_over_them_in_key_order(
    committed: list[tuple[str, str, int]],
    buffered: list[tuple[str, str, int]],
    prefix: str,
    start: str | None,
    end: str | None,
    limit: int | None,
) -> None:
    model: dict[str, int] = {}
    listed: list[dict[str, Any]] = []

    def apply(ctx: EventContext, ops: list[tuple[str, str, int]]) -> None:
        for op, key, value in ops:
            if op == "put":
                ctx.storage.put(key, value)
                model[key] = value
            else:
                ctx.storage.delete(key)
                model.pop(key, None)

    def handle(ctx: EventContext) -> None:
        apply(ctx, committed if ctx.event == "first" else buffered)
        if ctx.event == "second":
            listed.append(ctx.storage.list(prefix=prefix, start=start, end=end, limit=limit))
            raise PermanentError("its writes are discarded")

    with Runtime.simulated() as runtime:
        pool = runtime.define("p", execute=handle)
        pool.enqueue("first")
        assert pool.join(timeout=TIMEOUT)
        stored = dict(model)
        pool.enqueue("second")
        assert pool.join(timeout=TIMEOUT)
        expected = [
            (key, model[key])
            for key in sorted(model)
            if key.startswith(prefix)
            and (start is None or key >= start)
            and (end is None or key < end)
        ][:limit]
        assert list(listed[0].items()) == expected
        assert pool.storage(instance=0).list() == dict(sorted(stored.items()))
        assert pool.status().stored == len(stored)


def test_a_handler_reading_storage_on_the_real_clock_sees_a_snapshot_of_its_own(
    tmp_path: Path,
) -> None:
    """Under the real clock a handler's reads are read transactions on its thread, beside
    other instances' commits."""
    started, go = threading.Event(), threading.Event()
    seen: list[Any] = []

    def handle(ctx: EventContext) -> None:
        if ctx.event == "slow":
            ctx.storage.put("slow", 1)
            started.set()
            assert go.wait(TIMEOUT)
            seen.append(ctx.storage.list())
        else:
            ctx.storage.put("fast", ctx.event)

    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=handle, concurrency=2)
        pool.enqueue("slow", partition_key="a")
        assert started.wait(TIMEOUT)
        other = next(
            f"k{n}" for n in range(100) if stable_hash(f"k{n}") % 2 != stable_hash("a") % 2
        )
        pool.enqueue("x", partition_key=other)
        go.set()
        assert pool.join(timeout=TIMEOUT)
    assert seen == [{"slow": 1}]  # another instance's values are its own


def test_each_outcome_says_how_many_storage_rows_its_handler_read_and_wrote(
    sim: Runtime,
) -> None:
    """The rows a Durable Object's storage would bill (docs/api.md, PoolEvent): a key a
    get or get_many asks for, or a list returns (at least one a call), is read; a key a
    put, put_many or delete names is written, and only a success commits any."""
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    def handle(ctx: EventContext) -> None:
        if ctx.event == "plain":
            return
        storage = ctx.storage
        storage.get("a")  # 1 read, found or not
        storage.get_many(["a", "b", "c"])  # 3
        storage.list(prefix="nothing")  # 1: an empty list is a row too
        storage.put("a", 1)  # 1 written
        storage.put_many({"b": 2, "c": 3})  # 2
        storage.delete("z")  # 1
        if ctx.event == "fail" and ctx.attempt == 1:
            raise ValueError("once")

    pool = sim.define(
        "p", execute=handle, retry=RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0.0)
    )
    for event in ("plain", "store", "fail"):
        pool.enqueue(event)
    assert pool.join(timeout=TIMEOUT)
    outcomes = [
        (e.kind, e.sequence, e.rows_read, e.rows_written)
        for e in seen
        if e.kind in ("succeeded", "retry_scheduled", "dead_lettered")
    ]
    assert outcomes == [
        ("succeeded", 0, None, None),  # its handler never touched ctx.storage
        ("succeeded", 1, 5, 4),
        ("retry_scheduled", 2, 5, None),  # read, but nothing it wrote is committed
        ("succeeded", 2, 5, 4),
    ]
    line = next(e for e in seen if e.kind == "succeeded" and e.sequence == 1).to_json_dict()
    assert (line["rows_read"], line["rows_written"]) == (5, 4)
    assert "rows_read" not in seen[0].to_json_dict()


def test_a_dead_letter_says_how_many_rows_its_last_attempt_read(sim: Runtime) -> None:
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    def handle(ctx: EventContext) -> None:
        ctx.storage.list()  # nothing stored: one row
        ctx.storage.put("never", "committed")
        raise PermanentError("no")

    pool = sim.define("p", execute=handle)
    pool.enqueue("x")
    assert pool.join(timeout=TIMEOUT)
    dead = next(e for e in seen if e.kind == "dead_lettered")
    assert (dead.rows_read, dead.rows_written) == (1, None)
