"""Dedup keys through the public API and on the queue machine: a key held by an unfinished
event, or by one finished within the pool's window, stores nothing more (docs/api.md,
"enqueue"; docs/guarantees.md, "Dedup keys")."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

import dopool
from cli_support import invoke
from dopool import (
    ConfigurationError,
    DamagedRecordError,
    EventContext,
    EventTooLargeError,
    EventValidationError,
    PermanentError,
    QueueFullError,
    Runtime,
    SimulatedClock,
    WorkerPool,
)
from dopool._engine.options import PoolOptions
from dopool._machine.dedup import SWEEP, Dedup
from dopool._machine.machine import QueueMachine
from dopool._machine.types import Effects, Item
from dopool._ops.check import check_store
from dopool._store.environment import Store
from dopool._store.layout import DedupIndex, Meta, Namespace, pack, read_dedup, seal
from dopool._store.layout.keys import expiry_prefix
from dopool.chaos import FaultInjector

ROOT = Path(__file__).parents[2]


class Log:
    """A handler that records each event it ran; ``fail`` events raise PermanentError."""

    def __init__(self) -> None:
        self.ran: list[Any] = []

    def __call__(self, ctx: EventContext) -> None:
        self.ran.append(ctx.event)
        if isinstance(ctx.event, dict) and ctx.event.get("fail"):
            raise PermanentError("told to")


def define(runtime: Runtime, **options: Any) -> tuple[WorkerPool, Log]:
    log = Log()
    return runtime.define("p", execute=log, **options), log


def clock_of(runtime: Runtime) -> SimulatedClock:
    clock = runtime.clock
    assert isinstance(clock, SimulatedClock)
    return clock


def checks_out(runtime: Runtime) -> None:
    with runtime._store.read() as txn:
        report = check_store(txn)
    assert report.ok, report.problems


def entries(runtime: Runtime, pool: str = "p") -> int:
    with runtime._store.read() as txn:
        return sum(1 for _ in DedupIndex(pool).entries(txn))


# -- one key, one event --------------------------------------------------------------------


def test_a_second_enqueue_of_a_pending_key_stores_nothing_and_answers_the_first(
    sim: Runtime,
) -> None:
    pool, log = define(sim)
    pool.pause()
    first = pool.enqueue("a", dedup_key="k")
    pool.enqueue("x")
    second = pool.enqueue("b", dedup_key="k", priority=9, delay=5.0)
    assert not first.duplicate
    assert second.duplicate
    assert (second.event_id, second.sequence, second.instance_id, second.position) == (
        first.event_id,
        first.sequence,
        first.instance_id,
        first.position,
    )
    status = pool.status()
    assert (status.enqueued, status.pending, status.duplicates) == (2, 2, 1)
    assert status.instance(0).duplicates == 1
    checks_out(sim)
    pool.resume()
    assert pool.join(timeout=10)
    assert log.ran == ["a", "x"]


def test_with_no_window_a_finished_key_is_free_at_once(sim: Runtime) -> None:
    pool, log = define(sim)
    pool.enqueue("a", dedup_key="k")
    assert pool.join(timeout=10)
    again = pool.enqueue("b", dedup_key="k")
    assert not again.duplicate
    assert again.sequence == 1
    assert pool.join(timeout=10)
    assert log.ran == ["a", "b"]
    assert entries(sim) == 0  # removed at each finish


def test_a_finished_key_is_held_for_the_window_in_virtual_time(sim: Runtime) -> None:
    pool, log = define(sim, dedup_window=10.0)
    clock = clock_of(sim)
    pool.enqueue("a", dedup_key="k")
    assert pool.join(timeout=10)
    finished = clock.now()
    clock.advance(9.5)
    held = pool.enqueue("b", dedup_key="k")
    assert (held.duplicate, held.sequence, held.position) == (True, 0, 0)
    clock.advance(finished + 10.0 - clock.now())  # the window's end: free again
    fresh = pool.enqueue("c", dedup_key="k")
    assert not fresh.duplicate
    assert fresh.sequence == 1
    assert pool.join(timeout=10)
    assert log.ran == ["a", "c"]
    checks_out(sim)


def test_dead_letters_and_drains_finish_a_key_too(sim: Runtime) -> None:
    pool, _log = define(sim, dedup_window=5.0)
    clock = clock_of(sim)
    pool.enqueue({"fail": True}, dedup_key="dead")
    assert pool.join(timeout=10)
    [dead] = pool.dead_letters()
    assert dead.dedup_key == "dead"
    assert pool.enqueue("again", dedup_key="dead").duplicate
    pool.pause()
    pool.enqueue("drained", dedup_key="drain")
    assert pool.drain() == 1
    assert pool.enqueue("again", dedup_key="drain").duplicate  # drained: finished now
    clock.advance(5.0)
    assert not pool.enqueue("later", dedup_key="drain").duplicate
    checks_out(sim)


def test_keys_are_held_across_instances_and_each_pool_has_its_own(sim: Runtime) -> None:
    pool, _ = define(sim, concurrency=3)
    other = sim.define("q", execute=lambda ctx: None)
    pool.pause()
    other.pause()
    results = [pool.enqueue(n, dedup_key="k") for n in range(3)]  # round-robin: 3 instances
    assert [r.duplicate for r in results] == [False, True, True]
    assert {r.event_id for r in results} == {results[0].event_id}
    assert [s.duplicates for s in pool.status().instances] == [0, 1, 1]
    assert not other.enqueue("same key, other pool", dedup_key="k").duplicate
    assert pool.status().pending == 1
    checks_out(sim)


def test_enqueue_many_takes_one_key_per_event(sim: Runtime) -> None:
    pool, log = define(sim, concurrency=2)
    pool.pause()
    held = pool.enqueue("held", dedup_key="b")
    results = pool.enqueue_many(
        ["a1", "b1", "n1", "a2", "c1", "a3"], dedup_keys=["a", "b", None, "a", "c", "a"]
    )
    assert [r.duplicate for r in results] == [False, True, False, True, False, True]
    assert results[1].event_id == held.event_id
    assert results[3].event_id == results[5].event_id == results[0].event_id
    assert (pool.status().pending, pool.status().duplicates) == (4, 3)
    checks_out(sim)
    pool.resume()
    assert pool.join(timeout=10)
    assert sorted(log.ran) == ["a1", "c1", "held", "n1"]


def test_a_batch_of_duplicates_only_is_not_refused_by_a_full_queue(sim: Runtime) -> None:
    pool, _ = define(sim, max_queue_depth=1)
    pool.pause()
    first = pool.enqueue("a", dedup_key="k")
    assert [r.event_id for r in pool.enqueue_many(["b"], dedup_keys=["k"])] == [first.event_id]


def test_a_keyed_enqueue_into_a_full_queue_is_refused_and_claims_nothing(sim: Runtime) -> None:
    """One keyed enqueue claims its key as it stores the event: not before the full queue
    refuses it, so the key stays free."""
    pool, log = define(sim, max_queue_depth=1)
    pool.pause()
    pool.enqueue("a")
    with pytest.raises(QueueFullError):
        pool.enqueue("b", dedup_key="k")
    assert entries(sim) == 0
    pool.resume()
    assert pool.join(timeout=10)
    assert not pool.enqueue("c", dedup_key="k").duplicate
    assert pool.join(timeout=10)
    assert log.ran == ["a", "c"]


# -- what is refused ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "error", "attributes"),
    [
        (7, EventValidationError, {"position": None}),
        (b"k", EventValidationError, {"position": None}),
        ("", EventValidationError, {"position": None}),
        ("\ud800", EventValidationError, {"position": None}),
        ("é" * 1025, EventTooLargeError, {"what": "dedup_key", "size": 2050, "limit": 2048}),
    ],
)
def test_a_bad_key_is_refused_with_nothing_stored(
    sim: Runtime, key: Any, error: type[Exception], attributes: dict[str, Any]
) -> None:
    pool, _ = define(sim)
    with pytest.raises(error) as caught:
        pool.enqueue("a", dedup_key=key)
    for name, value in attributes.items():
        assert getattr(caught.value, name) == value
    assert "dedup_key" in str(caught.value)
    with pytest.raises(error) as caught:
        pool.enqueue_many(["a", "b"], dedup_keys=[None, key])
    assert getattr(caught.value, "position", None) == 1
    assert pool.status().enqueued == 0
    assert entries(sim) == 0


def test_a_key_of_the_largest_size_is_taken(sim: Runtime) -> None:
    pool, _ = define(sim)
    pool.pause()
    key = "é" * 1024  # 2048 bytes
    assert pool.enqueue_many(["a", "b"], dedup_keys=[key, key])[1].duplicate


@pytest.mark.parametrize("keys", [["k"], ["a", "b", "c"], "ab", None])
def test_dedup_keys_must_hold_one_key_per_event(sim: Runtime, keys: Any) -> None:
    pool, _ = define(sim)
    if keys is None:
        assert pool.enqueue_many([], dedup_keys=[]) == []
        return
    with pytest.raises(EventValidationError, match="dedup_keys"):
        pool.enqueue_many(["x", "y"], dedup_keys=keys)
    assert pool.status().enqueued == 0


@pytest.mark.parametrize("window", [-1.0, float("nan"), float("inf"), "5", True, None])
def test_a_bad_window_is_refused(sim: Runtime, window: Any) -> None:
    with pytest.raises(ConfigurationError, match="dedup_window"):
        sim.define("p", execute=lambda ctx: None, dedup_window=window)


def test_a_window_may_be_an_int() -> None:
    assert PoolOptions(execute=lambda ctx: None, dedup_window=3).dedup_window == 3.0


# -- restart, redrive, cleanup -----------------------------------------------------------------


def test_keys_survive_a_restart_with_their_window(store_path: Path) -> None:
    clock = SimulatedClock(100.0)
    with Runtime(store_path, clock=clock) as runtime:
        pool, _ = define(runtime, dedup_window=30.0)
        pool.pause()
        first = pool.enqueue("a", dedup_key="k")
    with Runtime(store_path, clock=clock) as runtime:
        pool, log = define(runtime, dedup_window=30.0)
        assert pool.enqueue("b", dedup_key="k").event_id == first.event_id
        pool.resume()
        assert pool.join(timeout=10)
        assert log.ran == ["a"]
    clock.advance(20.0)
    with Runtime(store_path, clock=clock) as runtime:
        pool, log = define(runtime, dedup_window=30.0)
        assert pool.enqueue("c", dedup_key="k").duplicate
        clock.advance(10.0)
        assert not pool.enqueue("d", dedup_key="k").duplicate
        assert pool.join(timeout=10)
        assert log.ran == ["d"]
        checks_out(runtime)


def test_a_redrive_takes_its_own_key_back_but_not_another_events(sim: Runtime) -> None:
    pool, log = define(sim, dedup_window=60.0)
    pool.enqueue({"fail": True, "n": 1}, dedup_key="mine")
    pool.enqueue({"fail": True, "n": 2}, dedup_key="taken")
    assert pool.join(timeout=10)
    assert pool.enqueue("again", dedup_key="mine").duplicate  # within the window
    pool.pause()
    clock_of(sim).advance(61.0)
    newer = pool.enqueue("newer", dedup_key="taken")  # past the window: a new event
    assert pool.redrive() == 1  # "mine" again; "taken" is newer's duplicate, removed
    assert pool.dead_letters() == []
    status = pool.status()
    assert (status.pending, status.duplicates) == (2, 2)
    assert pool.enqueue("x", dedup_key="taken").event_id == newer.event_id
    checks_out(sim)
    pool.resume()
    assert pool.join(timeout=10)
    assert log.ran[2:] == ["newer", {"fail": True, "n": 1}]


def test_entries_past_their_window_are_swept_without_being_reused(sim: Runtime) -> None:
    pool, _ = define(sim, dedup_window=5.0)
    pool.enqueue_many(list(range(20)), dedup_keys=[f"old-{n}" for n in range(20)])
    assert pool.join(timeout=10)
    assert entries(sim) == 20
    clock_of(sim).advance(10.0)
    pool.enqueue_many(list(range(10)), dedup_keys=[f"new-{n}" for n in range(10)])
    assert pool.join(timeout=10)
    assert entries(sim) == 10  # each finish removed SWEEP old ones, oldest first
    assert SWEEP * 10 >= 20
    with sim._store.read() as txn:
        assert DedupIndex("p").count_expiries(txn) == 10
    checks_out(sim)


def test_an_expiry_key_too_short_to_name_an_entry_never_stops_the_sweep(sim: Runtime) -> None:
    """A crafted key under the pool's expiry prefix with no time and name after it sorts
    first: it is deleted as it is met, and the entries behind it are swept (else the
    index would keep every finished entry for good)."""
    pool, _ = define(sim, dedup_window=5.0)
    stray = expiry_prefix("p") + b"\x01"
    with sim._store.write() as txn:
        txn.put(stray, seal(stray, pack(())))
    pool.enqueue_many(list(range(4)), dedup_keys=[f"old-{n}" for n in range(4)])
    assert pool.join(timeout=10)
    clock_of(sim).advance(10.0)
    pool.enqueue_many(list(range(4)), dedup_keys=[f"new-{n}" for n in range(4)])
    assert pool.join(timeout=10)
    assert entries(sim) == 4
    with sim._store.read() as txn:
        assert txn.get(stray) is None
    checks_out(sim)


def test_a_finish_reads_no_expiry_key_until_the_oldest_is_past_its_window(store: Store) -> None:
    """The sweep remembers when the oldest expiry key finished; a clock stepped back (a
    stamp older than that) lowers it, so that stamp is swept when its own window ends."""
    dedup, index, env = Dedup("p", 5.0), DedupIndex("p"), store._env
    with env.begin(write=True) as txn:
        for sequence, (key, now) in enumerate([("a", 100.0), ("b", 50.0), ("c", 56.0)]):
            index.claim(txn, [(key, 0, sequence, 0, 0, 0.0)], {})
            dedup.release(txn, key, 0, sequence, now)
        left = {read_dedup(key, value).dedup_key for key, value in index.entries(txn)}
    assert left == {"a", "c"}  # b's window ended at 55: c's finish swept it
    with env.begin(write=True) as txn:
        assert index.sweep(txn, 60.0, 5.0, SWEEP) == (0, 56.0)  # the oldest left: c


# -- damaged and stale entries ---------------------------------------------------------------


def _damage_entry(runtime: Runtime, key: str) -> bytes:
    index = DedupIndex("p")
    with runtime._store.write() as txn:
        entry_key = index.entry_key(key)
        value = bytearray(txn.get(entry_key))
        value[-1] ^= 1
        txn.put(entry_key, bytes(value))
    return entry_key


def test_a_damaged_entry_refuses_its_key_alone_and_is_reported(sim: Runtime) -> None:
    pool, log = define(sim)
    pool.pause()
    pool.enqueue("a", dedup_key="k")
    entry_key = _damage_entry(sim, "k")
    with pytest.raises(DamagedRecordError) as caught:
        pool.enqueue("b", dedup_key="k")
    assert caught.value.key == entry_key
    assert not pool.enqueue("c", dedup_key="other").duplicate  # the instance goes on
    assert pool.status().pending == 2
    with sim._store.read() as txn:
        problems = check_store(txn).problems
    assert [p.key for p in problems] == [entry_key]
    pool.resume()
    assert pool.join(timeout=10)  # its event finishes; the damaged entry stays
    assert log.ran == ["a", "c"]


def test_an_entry_sealed_with_a_priority_no_enqueue_takes_is_damaged(store_path: Path) -> None:
    """A crafted entry with a sound checksum: its priority fits no queue key, so the
    lookup of its event could not build one. Read, it is damaged: the owner's enqueue and
    a producer's refuse its key by name, and nothing else."""
    with Runtime.simulated(store_path) as runtime:
        pool, _ = define(runtime)
        pool.pause()
        pool.enqueue("a", dedup_key="k")
        entry_key = DedupIndex("p").entry_key("k")
        with runtime._store.write() as txn:
            record = read_dedup(entry_key, txn.get(entry_key))
            txn.put(entry_key, seal(entry_key, pack(record._replace(priority=2**31))))
        with pytest.raises(DamagedRecordError) as caught:
            pool.enqueue("b", dedup_key="k")
        assert caught.value.key == entry_key
        with dopool.connect(store_path) as connection:
            with pytest.raises(DamagedRecordError) as caught:
                connection.pool("p").enqueue("c", dedup_key="k")
            assert caught.value.key == entry_key
        assert not pool.enqueue("d", dedup_key="other").duplicate
        assert [s.restarts for s in pool.status().instances] == [0]


def test_a_damaged_entry_refuses_a_batch_that_names_its_key(sim: Runtime) -> None:
    pool, _ = define(sim)
    pool.pause()
    pool.enqueue_many(["a", "b"], dedup_keys=["j", "k"])
    entry_key = _damage_entry(sim, "k")
    with pytest.raises(DamagedRecordError) as caught:
        pool.enqueue_many(["c", "d", "e"], dedup_keys=["new", "j", "k"])
    assert caught.value.key == entry_key
    assert pool.status().pending == 2  # nothing of the batch was stored
    assert [r.duplicate for r in pool.enqueue_many(["f", "g"], dedup_keys=["new", "j"])] == [
        False,
        True,
    ]


def test_an_entry_naming_a_damaged_event_is_claimed_anew(sim: Runtime) -> None:
    pool, log = define(sim)
    pool.pause()
    first = pool.enqueue("a", dedup_key="k")
    ns = Namespace(pool.name, 0)
    with sim._store.write() as txn:
        [key] = list(ns.iter_event_keys(txn))
        txn.put(key, b"\0\0\0\0garbage")
    second = pool.enqueue("b", dedup_key="k")
    assert not second.duplicate
    assert second.sequence == first.sequence + 1
    pool.resume()
    assert pool.join(timeout=10)
    assert log.ran == ["b"]
    [dead] = pool.dead_letters()
    assert dead.damaged


def test_an_entry_naming_an_event_that_holds_another_key_is_claimed_anew(
    store_path: Path,
) -> None:
    """A crafted entry with a sound checksum names a stored, unfinished event that holds
    another key: it holds nothing, so an enqueue with its key is stored, not answered as
    a duplicate of an unrelated event (and lost), and ``dopool check`` names it."""
    with Runtime.simulated(store_path) as runtime:
        pool, log = define(runtime)
        pool.pause()
        other = pool.enqueue("a", dedup_key="other")
        index = DedupIndex("p")
        with runtime._store.write() as txn:
            record = index.get(txn, "other")
            assert record is not None
            index.put(txn, record._replace(dedup_key="k"))
            problems = check_store(txn).problems
        assert [p.what for p in problems] == [
            "dedup key 'k' names event 0 of p:0, which holds dedup key 'other'"
        ]
        fresh = pool.enqueue("b", dedup_key="k")
        assert not fresh.duplicate
        assert fresh.event_id != other.event_id
        pool.resume()
        assert pool.join(timeout=10)
        assert log.ran == ["a", "b"]
        checks_out(runtime)


def test_check_reports_an_index_that_disagrees_with_the_events(sim: Runtime) -> None:
    pool, _ = define(sim)
    pool.pause()
    pool.enqueue("a", dedup_key="lost")
    pool.enqueue("b", dedup_key="unindexed")
    ns = Namespace(pool.name, 0)
    index = DedupIndex("p")
    with sim._store.write() as txn:
        first = next(iter(ns.iter_event_keys(txn)))
        txn.delete(first)  # the event "lost" names is gone (the counters break too)
        txn.delete(index.entry_key("unindexed"))
        problems = [p.what for p in check_store(txn).problems]
    assert any("dedup key 'lost' names event 0 of p:0" in what for what in problems)
    assert any("holds dedup key 'unindexed'" in what for what in problems)


# -- on the queue machine: one transaction ------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "store", durability="async")
    yield store
    store.close()


def machine(index: int) -> QueueMachine:
    return QueueMachine(
        pool="p",
        index=index,
        rules=PoolOptions(execute=lambda ctx: None, concurrency=2).rules,
        seed=0,
        route=lambda key: 0,
        faults=FaultInjector(None, "p", index),
        fault_point=lambda point, fault: None,
        listening=lambda: False,
    )


def test_two_instances_bodies_in_one_group_commit_store_one(store: Store) -> None:
    """As GroupCommit runs them: each body a nested transaction of one."""
    machines, metas = [machine(0), machine(1)], [Meta(), Meta()]
    answers: list[list[Any]] = []
    env: Any = store._env
    with env.begin(write=True) as txn:
        for m, meta in zip(machines, metas, strict=True):
            with env.begin(write=True, parent=txn) as child:
                fx = Effects()
                item = Item(pack("e"), None, 0, None, "k")
                m.accept(child, meta, [("a", (item,)), ("b", (item,))], 0.0, fx)
                answers += [answer for _, answer in fx.answers if isinstance(answer, list)]
    assert [[r.duplicate for r in answer] for answer in answers] == [
        [False],
        [True],
        [True],
        [True],
    ]
    assert [meta.pending for meta in metas] == [1, 0]
    assert [meta.duplicates for meta in metas] == [1, 2]


# -- racing threads under the real clock ----------------------------------------------------


@pytest.mark.threaded
@pytest.mark.parametrize("durability", ["sync", "async"])
def test_racing_threads_store_one_event_per_key(store_path: Path, durability: str) -> None:
    threads, keys = 8, 5
    with Runtime(store_path, durability=durability) as runtime:
        pool, log = define(runtime, concurrency=4)
        pool.pause()
        barrier = threading.Barrier(threads)
        answers: list[list[Any]] = [[] for _ in range(threads)]

        def race(number: int) -> None:
            for key in range(keys):
                barrier.wait(timeout=10)
                answers[number].append(pool.enqueue((number, key), dedup_key=f"k{key}"))

        workers = [threading.Thread(target=race, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=30)
            assert not worker.is_alive()
        for key in range(keys):
            results = [answers[n][key] for n in range(threads)]
            assert sum(not r.duplicate for r in results) == 1
            assert len({r.event_id for r in results}) == 1
        status = pool.status()
        assert (status.enqueued, status.duplicates) == (keys, keys * (threads - 1))
        checks_out(runtime)
        pool.resume()
        assert pool.join(timeout=10)
        assert len(log.ran) == keys


def test_the_engine_under_a_real_clock_holds_a_key_for_its_window(store_path: Path) -> None:
    with Runtime(store_path) as runtime:
        pool, log = define(runtime, dedup_window=3600.0)
        first = pool.enqueue("a", dedup_key="k")
        assert pool.join(timeout=10)
        again = pool.enqueue("b", dedup_key="k")
        assert (again.duplicate, again.event_id, again.position) == (True, first.event_id, 0)
        assert log.ran == ["a"]


def test_lmdb_keys_of_the_index_fit_any_key_size(store_path: Path) -> None:
    """A long key is named by its digest: 2 KiB is far over LMDB's 511-byte keys."""
    with Runtime.simulated(store_path) as runtime:
        pool, _ = define(runtime)
        pool.enqueue("a", dedup_key="x" * 2048)
    with lmdb.open(str(store_path / "data"), readonly=True, lock=False) as env, env.begin() as txn:
        assert max(len(key) for key, _ in txn.cursor()) < 64


def test_the_api_reference_example_of_dedup_keys_runs() -> None:
    api = ROOT / "docs" / "api.md"
    text = api.read_text(encoding="utf-8")
    marker = "Under a `SimulatedClock` (this example runs in the tests):"
    block = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", text, re.DOTALL)
    assert block is not None
    exec(compile(block.group(1), str(api), "exec"), {})  # its asserts are the test


def test_the_readme_example_enqueues_with_delay_and_dedup_key(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Using it\s*```python\n(.*?)```", text, re.DOTALL)
    assert block is not None
    code = block.group(1).replace('Runtime("./data")', f"Runtime({str(tmp_path)!r})")
    exec(compile(code, "README.md", "exec"), {})  # its asserts are the test


# -- the command line ------------------------------------------------------------------------


def test_dopool_status_counts_duplicates_and_redrive_keeps_a_key(store_path: Path) -> None:
    with Runtime.simulated(store_path, start=5.0) as runtime:
        pool, _ = define(runtime, dedup_window=60.0)
        pool.enqueue({"fail": True}, dedup_key="k")
        assert pool.join(timeout=10)
        assert pool.enqueue("again", dedup_key="k").duplicate
    result = invoke("status", str(store_path))
    assert result.exit_code == 0, result.output
    assert "1 duplicates" in result.stdout
    listed = invoke("dead-letters", str(store_path))
    assert "dedup key k" in listed.stdout, listed.output
    assert '"dedup_key": "k"' in invoke("dead-letters", str(store_path), "--json").stdout
    assert invoke("dead-letters", str(store_path), "--pool", "p", "--redrive").exit_code == 0
    with Runtime.simulated(store_path, start=6.0) as runtime:
        pool, log = define(runtime)
        pool.pause()
        assert pool.enqueue("later", dedup_key="k").duplicate  # the redriven event holds it
        pool.resume()
        assert pool.join(timeout=10)
        assert log.ran == [{"fail": True}]
        checks_out(runtime)


# -- producers in other processes (dopool.connect) ------------------------------------------


def test_a_producer_checks_the_same_index_as_the_owner(store_path: Path) -> None:
    """A producer's enqueue and the owner's share one key space (here both in this
    process, as the store allows), with the window the producer's handle was given."""
    with Runtime(store_path) as runtime:
        pool, log = define(runtime, concurrency=2)
        pool.pause()
        mine = pool.enqueue("owner's", dedup_key="k")
        with dopool.connect(store_path) as connection:
            producer = connection.pool("p", dedup_window=60.0)
            again = producer.enqueue("producer's", dedup_key="k")
            assert (again.duplicate, again.event_id) == (True, mine.event_id)
            theirs = producer.enqueue_many(["a", "b"], dedup_keys=["j", "j"])
            assert [r.duplicate for r in theirs] == [False, True]
        assert pool.enqueue("owner's j", dedup_key="j").event_id == theirs[0].event_id
        assert pool.status().duplicates == 3
        checks_out(runtime)
        pool.resume()
        assert pool.join(timeout=10)
        assert sorted(log.ran) == ["a", "owner's"]
