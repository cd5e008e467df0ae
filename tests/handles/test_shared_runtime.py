"""Shared runtimes: several workers serving one store, each the instances it leases.

Two ``Runtime(path, shared=True)`` in this process stand for two worker processes
(each has its own store lock descriptor, owner id, keeper and wake-up socket); the
real-process tests are ``tests/handles/test_lease_processes.py``. Nothing here sleeps to wait
for the engine: it waits for a condition, with a timeout.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dopool
from cli_support import invoke
from dopool import (
    ConfigurationError,
    EventContext,
    InstanceCrashedError,
    NotLeasedError,
    PermanentError,
    Runtime,
    SimulatedClock,
    StoreLockedError,
)
from dopool._cluster.leases import LeaseBook
from dopool._cluster.routing import Router
from dopool._engine.router import Placement, RouterActor
from dopool._engine.supervisor import Supervisor
from dopool._ops.storeview import open_view
from dopool._store.layout import LeaseRecord, Namespace, all_leases, get_lease, put_lease
from worker_support import WAIT, Ran, until

TTL = 0.6  # renewed every 0.2 s


def _shared(path: Path, who: str, ran: Ran, **options: Any) -> Runtime:
    options = {"lease_ttl": TTL, **options}
    runtime = Runtime(path, shared=True, poll_interval=0.05, **options)
    runtime.define("jobs", execute=ran.handler(who), concurrency=4)
    return runtime


def _held(runtime: Runtime) -> set[int]:
    keeper = runtime._keeper
    assert keeper is not None
    return {index for _, index in keeper.book.held}


def _leases(where: Path | Runtime) -> dict[int, LeaseRecord]:
    """The store's leases, read through an open runtime's store (LMDB opens a store once
    per process), or from a closed store's path."""
    if isinstance(where, Runtime):
        with where._store.read() as txn:
            return {index: record for _, index, record in all_leases(txn)}
    with open_view(where) as view:
        return {index: record for (_, index), record in view.leases().items()}


def _book(runtime: Runtime) -> LeaseBook:
    assert runtime._keeper is not None
    return runtime._keeper.book


def _leases_of(runtime: Runtime) -> list[tuple[str, int]]:
    """Every lease the store holds, as (pool, index)."""
    with runtime._store.read() as txn:
        return [(pool, index) for pool, index, _ in all_leases(txn)]


def _leave_work(path: Path, concurrency: int, delay: float = 1.0) -> None:
    """Leave an event due in ``delay`` seconds on each instance of a pool ``jobs``,
    enqueued by an exclusive runtime, closed since: a shared worker that takes the leases
    starts them."""
    with Runtime(path) as runtime:
        pool = runtime.define("jobs", execute=lambda _event: None, concurrency=concurrency)
        results = [pool.enqueue({"early": n}, delay=delay) for n in range(concurrency)]
        assert {result.instance_index for result in results} == set(range(concurrency))


def _metas(runtime: Runtime) -> list[Any]:
    with runtime._store.read() as txn:
        return [Namespace("jobs", index).load_meta(txn) for index in range(4)]


@pytest.fixture
def ran() -> Ran:
    return Ran()


def test_shared_needs_a_real_clock(store_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="shared=True needs a real clock"):
        Runtime(store_path, shared=True, clock=SimulatedClock())
    with pytest.raises(ConfigurationError, match="shared must be True or False"):
        Runtime(store_path, shared="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="lease_ttl"):
        Runtime(store_path, lease_ttl=0)


def test_exclusive_and_shared_runtimes_exclude_each_other(store_path: Path) -> None:
    with Runtime(store_path), pytest.raises(StoreLockedError, match="this process"):
        Runtime(store_path, shared=True)
    first = Runtime(store_path, shared=True)
    second = Runtime(store_path, shared=True)  # shared workers coexist
    try:
        with pytest.raises(StoreLockedError) as refused:
            Runtime(store_path)
        assert refused.value.holder.count("(shared) (this process)") == 2
    finally:
        first.close()
        second.close()
    Runtime(store_path).close()  # and once they are gone, an exclusive one opens


def test_an_exclusive_runtime_leases_every_instance_and_removes_them_at_close(
    store_path: Path, ran: Ran
) -> None:
    runtime = Runtime(store_path)
    runtime.define("jobs", execute=ran.handler("x"), concurrency=3)
    leases = _leases(runtime)
    keeper = runtime._keeper
    assert keeper is not None
    assert sorted(leases) == [0, 1, 2]
    assert {record.owner for record in leases.values()} == {keeper.book.worker.owner}
    runtime.close()
    assert _leases(store_path) == {}
    with Runtime.simulated(store_path) as simulated:  # a simulated one leases nothing
        simulated.define("jobs", execute=ran.handler("s"), concurrency=3)
        assert _leases(simulated) == {}


def test_define_returns_with_the_table_routing_to_the_instances_it_leased(
    store_path: Path, ran: Ran, opened: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """So an app's enqueues right after ``define`` reach this worker's instances (emitted,
    counted by ``dopool.metrics``), not the store as a producer's write."""
    # The router actor publishes nothing until someone asks it for the current table: a
    # define that returned without asking would find the table serving no instance.
    asked = threading.Event()
    publish, current = RouterActor._publish, Placement.current

    def held(actor: RouterActor, placed: Any) -> None:
        asked.wait(TTL * 10)
        publish(actor, placed)

    def ask(placement: Placement, timeout: float | None = None) -> Any:
        asked.set()
        return current(placement, timeout)

    monkeypatch.setattr(RouterActor, "_publish", held)
    monkeypatch.setattr(Placement, "current", ask)
    seen: list[str] = []
    try:
        a = _shared(store_path, "a", ran)
        opened.append(a)
        a.subscribe(lambda event: seen.append(event.kind))
        pool = a.pools["jobs"]
        table = pool._router.table
        assert _held(a) == {0, 1, 2, 3}
        assert all(table.serves(index) for index in range(4))
        pool.enqueue_many([{"n": n} for n in range(4)])
        assert seen.count("enqueued") == 4
    finally:
        asked.set()


def test_two_shared_runtimes_split_the_instances_and_serve_producers_in_order(
    store_path: Path, ran: Ran, opened: list[Runtime]
) -> None:
    a = _shared(store_path, "a", ran)
    opened.append(a)
    assert _held(a) == {0, 1, 2, 3}  # alone: every instance
    b = _shared(store_path, "b", ran)
    opened.append(b)
    until(lambda: len(_held(a)) == 2 and len(_held(b)) == 2, "a fair split")
    until(lambda: len({r.owner for r in _leases(a).values()}) == 2, "the split committed")
    assert _held(a) | _held(b) == {0, 1, 2, 3}
    # A cancel of an instance not here is made in the store: no such event there yet.
    assert not a.pools["jobs"].cancel(f"jobs:{min(_held(b))}:0")
    with dopool.connect(store_path) as connection:
        producer = connection.pool("jobs")
        for number in range(80):
            producer.enqueue({"n": number}, partition_key=f"k{number % 8}")
        until(lambda: producer.status().succeeded == 80, "80 successes")
    by_index: dict[int, list[int]] = defaultdict(list)
    who: dict[int, set[str]] = defaultdict(set)
    for runtime, index, sequence in ran.log:
        by_index[index].append(sequence)
        who[index].add(runtime)
    assert sum(map(len, by_index.values())) == 80  # each once
    for index, sequences in by_index.items():
        assert sequences == sorted(sequences), f"instance {index} out of order"
        assert who[index] == {"a" if index in _held(a) else "b"}


def test_a_graceful_close_hands_the_instances_over_at_once_without_a_restart(
    store_path: Path, ran: Ran, opened: list[Runtime]
) -> None:
    a = _shared(store_path, "a", ran, lease_ttl=30.0)  # expiry would take 30 s
    b = _shared(store_path, "b", ran, lease_ttl=30.0)
    opened.append(b)
    a.close()  # deletes its leases: b's next renewal (10 s) takes them; force it now
    keeper = b._keeper
    assert keeper is not None
    with keeper._lock:
        keeper._renew_now()
    assert _held(b) == {0, 1, 2, 3}
    assert [record.epoch for record in _leases(b).values()] == [1, 1, 1, 1]
    assert [meta.restarts for meta in _metas(b)] == [0, 0, 0, 0]


def test_a_hung_worker_loses_its_leases_and_commits_nothing_more(
    store_path: Path, ran: Ran, opened: list[Runtime]
) -> None:
    # Due in an hour: still pending when b takes the instances over, so that a, and then
    # b, start every instance at once.
    _leave_work(store_path, 4, delay=3600.0)
    a = _shared(store_path, "a", ran)
    opened.append(a)
    keeper_a = a._keeper
    assert keeper_a is not None
    keeper_a._stop.set()  # a stops renewing, as a hung (SIGSTOPped) worker would
    keeper_a._thread.join()
    b = _shared(store_path, "b", ran)
    opened.append(b)
    owner_b = b._keeper.book.worker.owner if b._keeper else ""
    until(
        lambda: {record.owner for record in _leases(b).values()} == {owner_b},
        "b taking every expired lease over",
    )
    assert {record.epoch for record in _leases(b).values()} == {2}
    # Taken after expiry: each instance with work recovers as after a crash, a restart.
    until(lambda: [meta.restarts for meta in _metas(b)] == [1, 1, 1, 1], "b's recoveries")
    before = sum(meta.enqueued for meta in _metas(b))
    # a's instances, where they still run, have every transaction fenced off: an
    # enqueue there commits nothing; once one has stopped (vacant), a's enqueue is
    # stored as a producer's, and b runs it.
    try:
        late = a.pools["jobs"].enqueue({"late": True}, partition_key="x")
    except InstanceCrashedError:
        assert sum(meta.enqueued for meta in _metas(b)) == before  # nothing committed
    else:
        assert sum(meta.enqueued for meta in _metas(b)) == before + 1
        until(lambda: ("b", late.instance_index, late.sequence) in ran.log, "b running it")
    # The instance the enqueue reached stops there (its transaction fenced off).
    index = a.pools["jobs"]._instances.router.choose("x")
    until(lambda: a.pools["jobs"]._instances.cells[index].mailbox.closed, "a's instance stopping")


def test_an_instance_whose_lease_names_another_worker_commits_nothing(
    store_path: Path, opened: list[Runtime]
) -> None:
    started, go = threading.Event(), threading.Event()

    def gated(_ctx: EventContext) -> None:
        started.set()
        go.wait(WAIT)

    a = Runtime(store_path, shared=True, lease_ttl=30.0)  # no renewal during the test
    opened.append(a)
    pool = a.pools.get("jobs") or a.define("jobs", execute=gated, concurrency=4)
    index = pool.enqueue({"first": True}, partition_key="p").instance_index
    assert started.wait(WAIT)
    with a._store.write() as txn:  # another worker took it over (a planted record)
        record = get_lease(txn, "jobs", index)
        assert record is not None
        put_lease(txn, "jobs", index, record._replace(owner="someone-else", epoch=9))
    go.set()  # the handler returns: its outcome's transaction is fenced off
    until(lambda: pool._instances.cells[index].mailbox.closed, "the instance stopping")
    # Vacant here now: an enqueue is stored as a producer's, for the lease's holder.
    second = pool.enqueue({"second": True}, partition_key="p")
    assert second.instance_index == index
    assert pool.cancel(second.event_id)  # in the store too, for the lease's holder
    meta = _metas(a)[index]
    assert (meta.enqueued, meta.succeeded, meta.pending) == (2, 0, 1)  # its success lost
    assert meta.cancelled == 1
    assert meta.current is not None  # the attempt stays started: the holder's recovery


def test_a_producer_wakes_the_shared_worker_its_lease_names_through_its_socket(
    store_path: Path, opened: list[Runtime]
) -> None:
    ran = threading.Event()
    # No poll within the test: only the wake-up socket can start the event.
    a = Runtime(store_path, shared=True, poll_interval=3600)
    opened.append(a)
    a.define("jobs", execute=lambda _ctx: ran.set(), concurrency=2)
    keeper = a._keeper
    assert keeper is not None
    socket_file = store_path / "wake" / f"{keeper.book.worker.owner}.sock"
    assert socket_file.is_socket()
    assert not (store_path / "wake.sock").exists()  # an exclusive runtime's only
    with dopool.connect(store_path) as connection:
        connection.pool("jobs").enqueue({"x": 1})
        assert ran.wait(WAIT)
        ran.clear()
        assert invoke("pause", str(store_path), "--pool", "jobs").exit_code == 0
        connection.pool("jobs").enqueue({"x": 2})
        assert not ran.is_set()  # paused: stored, not started (no wait: nothing runs it)
        assert invoke("resume", str(store_path), "--pool", "jobs").exit_code == 0
        assert ran.wait(WAIT)  # the resume woke the lease's owner
    a.close()
    assert not socket_file.exists()


def test_follow_ups_reach_instances_the_other_worker_serves(
    store_path: Path, opened: list[Runtime]
) -> None:
    """A pipeline across two workers: each stage-1 event sends a follow-up into its own
    pool (another partition) and one into stage 2; about half of them go to instances the
    other worker serves, delivered from this worker's outbox in one transaction."""
    finals: list[tuple[str, int, Any]] = []
    lock = threading.Lock()

    def first(ctx: EventContext) -> None:
        n = ctx.event["n"]
        if not ctx.event.get("again"):
            ctx.enqueue({"n": n, "again": True}, partition_key=f"again-{n}")
        ctx.enqueue(
            {"n": n, "again": ctx.event.get("again", False)}, partition_key=f"s-{n}", pool="second"
        )

    def make_second(who: str) -> Callable[[EventContext], None]:
        def second(ctx: EventContext) -> None:
            with lock:
                finals.append((who, ctx.instance_index, (ctx.event["n"], ctx.event["again"])))

        return second

    runtimes = []
    for who in ("a", "b"):
        runtime = Runtime(store_path, shared=True, lease_ttl=TTL, poll_interval=3600)
        opened.append(runtime)
        runtime.define("first", execute=first, concurrency=2)
        runtime.define("second", execute=make_second(who), concurrency=2)
        runtimes.append(runtime)
    a, b = runtimes
    until(
        lambda: [len(_book(r).held) for r in (a, b)] == [2, 2] and len(_leases_of(a)) == 4,
        "each worker holding one instance of each pool",
    )
    with dopool.connect(store_path) as connection:
        for n in range(40):
            connection.pool("first").enqueue({"n": n}, partition_key=f"p-{n}")
    until(lambda: len(finals) == 80, "every follow-up's run")  # no poll: wake-ups only
    assert sorted(value for _, _, value in finals) == sorted(
        (n, again) for n in range(40) for again in (False, True)
    )  # each once
    assert {who for who, _, _ in finals} == {"a", "b"}

    def outboxes() -> list[int]:
        with a._store.read() as txn:
            return [Namespace("first", i).load_meta(txn).outbox for i in range(2)]

    until(lambda: outboxes() == [0, 0], "every delivery acknowledged")  # (local acks: async)


def _poison(ctx: EventContext) -> None:
    raise PermanentError("refused")


def test_redrive_and_purge_of_another_workers_dead_letters_are_made_in_the_store(
    store_path: Path, opened: list[Runtime]
) -> None:
    """A shared worker's redrive and purge of an instance another worker serves are that
    instance's own transition made in the store, then its worker is woken (the poll is an
    hour here); a kill of it is not this process's to make."""
    a, b = (Runtime(store_path, shared=True, lease_ttl=TTL, poll_interval=3600) for _ in "ab")
    opened.extend([a, b])
    pools = {
        runtime: runtime.define("poison", execute=_poison, concurrency=2) for runtime in (a, b)
    }
    until(lambda: len(_held(a)) == 1 and len(_held(b)) == 1, "a split")
    mine, theirs = min(_held(a)), min(_held(b))
    for number in range(4):  # round-robin from a: two on b's instance, stored for it
        pools[a].enqueue({"n": number})
    until(lambda: pools[a].status().dead_lettered == 4, "4 dead letters")
    assert pools[a].redrive(index=theirs) == 2  # b runs them again: dead again
    until(lambda: pools[a].status().dead_lettered == 6, "the redriven ones dead again")
    assert pools[a].redrive(error="refused") == 4  # the whole pool: a's own two, b's two
    until(lambda: pools[a].status().dead_lettered == 10, "all four dead again")
    assert pools[a].purge_dead_letters(index=theirs) == 2
    assert [len(pools[a].dead_letters(index=i)) for i in (mine, theirs)] == [2, 0]
    assert pools[a].purge_dead_letters() == 2
    with pytest.raises(NotLeasedError) as raised:
        a.kill("poison", theirs)
    assert raised.value.instance_id == f"poison:{theirs}"


def test_a_worker_not_serving_instance_0_defines_and_removes_schedules_in_the_store(
    store_path: Path, opened: list[Runtime]
) -> None:
    """Every worker's app defines its schedules at start-up (docs/deployment.md); in the
    worker another one's instance 0 is served by, that is instance 0's own transition made
    in the store, then its owner is woken (the poll is an hour here)."""
    fired = threading.Event()

    def tick(ctx: EventContext) -> None:
        fired.set()

    runtimes = [Runtime(store_path, shared=True, lease_ttl=TTL, poll_interval=3600) for _ in "ab"]
    opened.extend(runtimes)
    a, b = (runtime.define("ticks", execute=tick, concurrency=2) for runtime in runtimes)
    until(lambda: len(_held(runtimes[0])) == 1 and len(_held(runtimes[1])) == 1, "a split")
    other = b if 0 in _held(runtimes[0]) else a
    assert other.schedule("tick", "tick", every=0.2).name == "tick"
    assert other.schedule("tick", "tick", every=0.2).every == 0.2  # again: the same one
    assert fired.wait(WAIT)  # the owner re-armed at once
    assert [info.name for info in a.schedules()] == ["tick"]
    assert other.unschedule("tick")
    assert not other.unschedule("tick")
    assert b.schedules() == []


def test_a_worker_cannot_change_the_concurrency_other_live_workers_route_by(
    store_path: Path, ran: Ran, opened: list[Runtime]
) -> None:
    """A rolling deploy that changes a pool's concurrency: the new worker is refused while
    an old one lives (it would route by 4 while producers route by 2, and leave events
    on instances nobody serves); once the old ones are gone, the change is made."""
    a = _shared(store_path, "a", ran)  # concurrency 4
    opened.append(a)
    b = Runtime(store_path, shared=True, lease_ttl=TTL, poll_interval=0.05)
    opened.append(b)
    with pytest.raises(ConfigurationError, match=r"concurrency 4 by other live workers \(pid"):
        b.define("jobs", execute=ran.handler("b"), concurrency=2)
    assert a.pools["jobs"].status().concurrency == 4  # nothing changed
    a.close()  # gracefully: its presence goes with it
    assert b.define("jobs", execute=ran.handler("b"), concurrency=2).status().concurrency == 2


def test_renewals_stay_on_time_while_many_instances_start(
    store_path: Path, ran: Ran, opened: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting an instance takes time (its actor, its recovery); a renewal that waited
    for its instances to start came after the ttl once there were enough of them, and
    the workers took each other's leases over, back and forth. Here each of the 64
    instances has work when the leases are taken, and each start takes 30 ms, so 64
    take three ttls: the leases must not move all the same."""
    _leave_work(store_path, 64)
    activate = Supervisor.activate

    def slow_activate(supervisor: Supervisor, *args: Any) -> None:
        busy = time.monotonic() + 0.03  # a slow start: CPU-bound, as a loaded machine's
        while time.monotonic() < busy:
            pass
        activate(supervisor, *args)

    monkeypatch.setattr(Supervisor, "activate", slow_activate)
    a = Runtime(store_path, shared=True, lease_ttl=TTL, poll_interval=0.05)
    opened.append(a)
    a.define("jobs", execute=ran.handler("a"), concurrency=64)
    b = Runtime(store_path, shared=True, lease_ttl=TTL, poll_interval=0.05)
    opened.append(b)
    b.define("jobs", execute=ran.handler("b"), concurrency=64)
    until(lambda: [len(_held(a)), len(_held(b))] == [32, 32], "a fair split")
    with dopool.connect(store_path) as connection:
        producer = connection.pool("jobs")
        results = [producer.enqueue({"n": n}) for n in range(64)]
        assert {result.instance_index for result in results} == set(range(64))
        until(lambda: producer.status().succeeded == 128, "every instance's events run")
    records = _leases(a)
    assert {record.epoch for record in records.values()} == {1}  # never taken over
    with a._store.read() as txn:
        assert {Namespace("jobs", i).load_meta(txn).restarts for i in range(64)} == {0}


def test_a_lease_retaken_while_define_starts_its_instance_loses_that_instance_alone(
    store_path: Path, ran: Ran, opened: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker takes instance 1's lease between this worker's renewal and the
    instance's start (planted here; each instance has work, so define starts them all):
    its recovery is fenced off, and define() goes on with the others instead of raising
    NotLeasedError."""
    _leave_work(store_path, 4)
    activate = Supervisor.activate

    def retaken_first(supervisor: Supervisor, *args: Any) -> None:
        if supervisor.mailbox.key == "jobs:1":
            with runtime._store.write() as txn:
                record = get_lease(txn, "jobs", 1)
                assert record is not None
                put_lease(txn, "jobs", 1, record._replace(owner="someone-else", epoch=9))
        activate(supervisor, *args)

    monkeypatch.setattr(Supervisor, "activate", retaken_first)
    runtime = Runtime(store_path, shared=True, lease_ttl=30.0)
    opened.append(runtime)
    pool = runtime.define("jobs", execute=ran.handler("a"), concurrency=4)
    cells = pool._instances.cells
    until(lambda: (cells.get(1) or cells[1]).mailbox.vacant, "instance 1 stopping")
    with runtime._store.read() as txn:
        assert [Namespace("jobs", i).load_meta(txn).restarts for i in range(4)] == [0] * 4
    results = [pool.enqueue({"n": n}) for n in range(12)]
    served = sum(result.instance_index != 1 for result in results)
    assert served == 9  # round-robin: instance 1's are stored for the lease's holder
    # (and the early event of each instance but 1)
    until(lambda: pool.status().succeeded == served + 3, "the other instances serving")


def _gated_on_instance_2(path: Path, opened: list[Runtime], go: threading.Event) -> Runtime:
    """A shared worker alone on a pool ``jobs`` of 4, its instance 2 in a handler that
    waits for ``go`` (returned once the handler runs)."""
    started = threading.Event()

    def gated(ctx: EventContext) -> None:
        if ctx.event.get("gate"):
            started.set()
            go.wait(WAIT)

    runtime = Runtime(path, shared=True, lease_ttl=TTL, poll_interval=0.05)
    opened.append(runtime)
    pool = runtime.define("jobs", execute=gated, concurrency=4)
    key = next(f"k{n}" for n in range(1000) if Router(4).choose(f"k{n}") == 2)
    pool.enqueue({"gate": True}, partition_key=key)
    assert started.wait(WAIT)
    return runtime


def test_a_long_handler_does_not_hold_up_the_release_of_the_other_instances(
    store_path: Path, opened: list[Runtime]
) -> None:
    """A worker releasing its excess stops those instances together; one still running a
    handler must not keep the others' leases from the worker that joined."""
    go = threading.Event()
    _gated_on_instance_2(store_path, opened, go)
    try:
        b = _shared(store_path, "b", Ran())
        opened.append(b)
        # a releases 2 and 3, 2 first; 2's handler runs on: 3 reaches b all the same.
        until(lambda: 3 in _held(b), "b taking instance 3 while 2's handler runs")
        assert 2 not in _held(b)
    finally:
        go.set()
    until(lambda: _held(b) == {2, 3}, "b taking instance 2 once its handler returned")


def test_a_close_gives_an_instance_it_was_releasing_the_grace_and_keeps_its_lease(
    store_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    """A close while a released instance's handler still runs waits for it as for any
    other, and abandons it with a warning after the grace, its lease left to expire: were
    the lease deleted, the worker that joined would run the instance while the handler
    still ran here, and the process's exit would cut that handler short unannounced."""
    go = threading.Event()
    a = _gated_on_instance_2(store_path, opened, go)
    owner_a = _book(a).worker.owner
    try:
        b = _shared(store_path, "b", Ran())
        opened.append(b)
        until(lambda: 3 in _held(b), "a releasing instances 2 and 3, 2's handler running")
        a.close(timeout=0.3)
        assert "abandoned" in caplog.text
        assert "jobs:2" in caplog.text
        assert _leases(b)[2].owner == owner_a  # left to expire, not handed on
        assert 2 not in _held(b)
    finally:
        go.set()
    until(lambda: _held(b) == {0, 1, 2, 3}, "b taking every lease, 2's once it expired")
