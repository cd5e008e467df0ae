"""The router actor: a pool's routing table, written by it alone, as placement changes.

Two ``Runtime(path, shared=True)`` in this process stand for two worker processes, as
in ``tests/handles/test_shared_runtime.py``. With a long ``lease_ttl`` no renewal of the
keepers' own falls within a test: each one is forced, and a lease clock read ahead (an
offset on one store's ``lease_time``) makes the other worker's leases expired. Nothing sleeps to
wait for the engine: tables are asked of the actor, conditions waited for.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dopool import RetryPolicy, Runtime
from dopool._cluster.routing import Router, RoutingTable
from dopool._engine.keeper import LeaseKeeper
from worker_support import WAIT, Ran, until


def test_a_shared_workers_cancel_reaches_an_instance_another_serves(
    store_path: Path, opened: list[Runtime]
) -> None:
    ran = Ran()
    # No poll within the test: only wake-ups make a worker look at its instances.
    a, b = _split(store_path, ran, opened, poll_interval=3600)
    pool = a.pools["jobs"]
    later = pool.enqueue_many([{"n": n} for n in range(4)], delay=3600)  # one per instance
    assert {result.instance_index for result in later} == {0, 1, 2, 3}
    assert all(pool.cancel(result.event_id) for result in later)  # 2 and 3 in the store
    assert [i.cancelled for i in pool.status().instances] == [1, 1, 1, 1]
    assert pool.status().pending == 0
    assert not pool.cancel(later[3].event_id)  # finished (cancelled) already
    assert b.pools["jobs"].event(later[3].event_id) is None  # keep_finished 0: forgotten
    # An event of b's in backoff holds up the next; cancelled from a, b is woken (there is
    # no poll) and runs the next one
    # (Both enqueued in b, its own instance's: no wake-up of theirs is left to run it.)
    key, theirs = _key_for(3), b.pools["jobs"]
    stuck = theirs.enqueue({"stuck": True}, partition_key=key)
    until(lambda: pool.status().instance(3).state == "backoff", "the stuck event's backoff")
    after = theirs.enqueue({"x": 1}, partition_key=key)
    assert pool.cancel(stuck.event_id)
    until(lambda: ran.who_ran(after) == {"b"}, "b running the event after the cancelled one")


def _key_for(index: int) -> str:
    """A partition key that routes to instance ``index`` of the four."""
    router = Router(4)
    return next(f"k{n}" for n in range(1000) if router.choose(f"k{n}") == index)


def _worker(path: Path, who: str, ran: Ran, opened: list[Runtime], **options: Any) -> Runtime:
    runtime = Runtime(path, shared=True, **{"lease_ttl": 30.0, **options})
    opened.append(runtime)
    runtime.define("jobs", execute=ran.handler(who), concurrency=4, retry=RetryPolicy())
    return runtime


def _split(path: Path, ran: Ran, opened: list[Runtime], **options: Any) -> tuple[Runtime, Runtime]:
    """Two workers on the store, settled: ``a`` serves instances 0 and 1, ``b`` 2 and 3,
    and each table says so (a renewal of a's, then of b's, then of a's again)."""
    a = _worker(path, "a", ran, opened, **options)
    b = _worker(path, "b", ran, opened, **options)
    _renew(a)
    until(lambda: _released(a), "a's excess released")
    _renew(b)
    _renew(a)
    assert _table(a).here == frozenset({0, 1})
    return a, b


def _keeper(runtime: Runtime) -> LeaseKeeper:
    keeper = runtime._keeper
    assert keeper is not None
    return keeper


def _renew(runtime: Runtime) -> None:
    """One renewal of ``runtime``'s keeper, now."""
    keeper = _keeper(runtime)
    with keeper._lock:
        keeper._renew_now()


def _table(runtime: Runtime) -> RoutingTable:
    """The table the router actor published once it handled what it was told."""
    return runtime._pools["jobs"].placement.current(timeout=WAIT)


def _owner(runtime: Runtime) -> str:
    return _keeper(runtime).book.worker.owner


def _released(runtime: Runtime) -> bool:
    keeper = _keeper(runtime)
    with keeper._lock:
        return not keeper._stopping


def test_the_table_follows_the_leases_taken_released_and_lost(
    store_path: Path, opened: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = Ran()
    a = _worker(store_path, "a", ran, opened)
    first = _table(a)
    owner_a = _owner(a)
    assert (first.here, first.owners) == (frozenset(range(4)), (owner_a,) * 4)
    assert first.version == 1  # told once, by the renewal that took every lease
    b = _worker(store_path, "b", ran, opened)
    owner_b = _owner(b)
    assert _table(b).here == frozenset()  # a holds every live lease
    assert _table(b).owners == (owner_a,) * 4
    _renew(a)  # two workers: a releases its excess
    released = _table(a)
    assert (released.here, released.version) == (frozenset({0, 1}), 2)
    until(lambda: _released(a), "a's excess released")
    _renew(b)  # b takes the released leases
    taken = _table(b)
    assert (taken.here, taken.owners) == (frozenset({2, 3}), (owner_a,) * 2 + (owner_b,) * 2)
    _renew(a)  # a learns who serves 2 and 3 now
    assert _table(a).owners == taken.owners
    assert _table(a).version == 3
    _renew(a)  # nothing moved: no new table
    assert _table(a).version == 3
    # b reads the lease clock past a's leases' expiry: b takes them over, a loses them.
    lease_time = b._store.lease_time
    monkeypatch.setattr(b._store, "lease_time", lambda: lease_time() + 60.0)
    _renew(b)
    assert _table(b).here == frozenset(range(4))
    _renew(a)
    lost = _table(a)
    assert (lost.here, lost.owners) == (frozenset(), (owner_b,) * 4)
    assert isinstance(lost, RoutingTable)
    with pytest.raises(AttributeError):
        lost.here = frozenset({0})  # type: ignore[misc]  # a snapshot: frozen


def test_only_the_router_actor_writes_the_table(
    store_path: Path, opened: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    slot = Router.__dict__["table"]
    writes: list[tuple[str, str]] = []

    def write(router: Router, table: RoutingTable) -> None:
        writes.append((sys._getframe(1).f_code.co_name, threading.current_thread().name))
        slot.__set__(router, table)

    monkeypatch.setattr(Router, "table", property(slot.__get__, write))
    ran = Ran()
    a, b = _split(store_path, ran, opened)
    assert _table(a).version == 3
    assert _table(b).version == 2
    made = [write for write in writes if write[0] == "__init__"]
    assert len(made) == 2  # each router made with its first table, before its actor runs
    published = [write for write in writes if write[0] != "__init__"]
    assert len(published) == 5
    assert set(published) == {("_publish", "dopool-router-jobs")}


def test_a_shared_workers_enqueue_to_an_instance_another_serves_is_stored_and_run_there(
    store_path: Path, opened: list[Runtime]
) -> None:
    ran = Ran()
    # No poll within the test: only the wake-up of the owner the table names starts them.
    a, b = _split(store_path, ran, opened, poll_interval=3600)
    assert _table(a).owners[2:] == (_owner(b),) * 2
    pool = a.pools["jobs"]
    singles = [pool.enqueue({"n": n}) for n in range(8)]  # round-robin: all four instances
    batch = pool.enqueue_many([{"m": m} for m in range(8)])  # each instance's share
    keyed = pool.enqueue_many([{"k": k} for k in range(3)], partition_key="one-key")
    results = [*singles, *batch, *keyed]
    assert {result.instance_index for result in results} == {0, 1, 2, 3}
    until(lambda: all(ran.who_ran(result) for result in results), "every event's run")
    for result in results:  # each once, by the worker serving its instance
        assert ran.who_ran(result) == {"a" if result.instance_index < 2 else "b"}
    # Read from the store, as before: every instance's successes, here and there.
    until(lambda: pool.status().succeeded == len(results), "every success committed")


def test_a_simulated_runtime_has_a_router_actor_with_every_instance_here(
    sim: Runtime,
) -> None:
    pool = sim.define("jobs", execute=lambda _ctx: None, concurrency=3)
    table = sim._pools["jobs"].placement.current(timeout=WAIT)
    assert table == RoutingTable.local(3)  # never told anything: no leases here
    pool.enqueue({"x": 1})
    assert pool.join(timeout=WAIT)


def test_closing_a_runtime_stops_its_router_actors(store_path: Path) -> None:
    runtime = Runtime(store_path)
    runtime.define("jobs", execute=lambda _ctx: None, concurrency=2)
    runtime.define("other", execute=lambda _ctx: None, concurrency=1)
    assert _table(runtime).here == frozenset({0, 1})  # exclusive: all here, told at start
    names = {"dopool-router-jobs", "dopool-router-other"}
    assert names <= {thread.name for thread in threading.enumerate()}
    runtime.close()
    assert not names & {thread.name for thread in threading.enumerate()}


def test_a_shared_workers_pause_drain_and_resume_reach_the_instances_another_serves(
    store_path: Path, opened: list[Runtime]
) -> None:
    ran = Ran()
    # No poll within the test: only wake-ups make a worker look at its instances.
    a, _ = _split(store_path, ran, opened, poll_interval=3600)
    pool = a.pools["jobs"]
    pool.pause()  # the whole pool: none used yet, its record says so
    status = pool.status()
    assert [status.instance(i).state for i in range(4)] == ["paused"] * 4
    results = pool.enqueue_many([{"n": n} for n in range(8)])
    assert {result.instance_index for result in results} == {0, 1, 2, 3}
    assert pool.status().pending == 8  # paused everywhere: nothing started
    assert pool.drain(3) == 2  # b's instance, from a
    assert pool.drain() == 6
    pool.resume()  # each used now: 0 and 1 by message, 2 and 3 in the store (b woken)
    assert [i.state for i in pool.status().instances] == ["idle"] * 4
    after = pool.enqueue_many([{"m": m} for m in range(4)])
    until(lambda: pool.status().succeeded == 4, "the events after the resume running")
    for result in after:
        assert ran.who_ran(result) == {"a" if result.instance_index < 2 else "b"}
    pool.pause()  # the same way
    assert [i.state for i in pool.status().instances] == ["paused"] * 4
