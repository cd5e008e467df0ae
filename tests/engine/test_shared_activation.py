"""Shared workers activate instances on demand (docs/guarantees.md, "Instances started when
first used"; docs/deployment.md, "Several workers on one store").

A shared worker serves the instances of the lease units it holds as an exclusive runtime
serves every instance: taking a unit starts only those with work or an alarm (found from
the store's indexes), the rest start when something comes for them, each is evicted when
idle, and the worker's ``max_active`` bounds its actors. A unit released or lost drops its
instances here and gives their slots back. In-process runtimes stand for worker processes
here (each has its own owner id, keeper and wake-up socket); the last test runs two real
``dopool worker`` processes on a per-key pool, fed through ``dopool.connect``.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dopool
from cli_support import invoke
from dopool import EventContext, PoolEvent, Runtime
from dopool._cluster.units import LEASE_UNITS, unit_of
from dopool._store.layout import all_leases
from dopool._store.layout.limits import PER_KEY
from worker_support import Evidence, Worker, until

TTL = 0.6  # seconds; renewed every 0.2 s
MILLION = 1_000_000


class Seen:
    """What the handlers ran, by partition key, and each runtime's pool events."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: dict[str | None, list[tuple[str, Any]]] = defaultdict(list)
        self.events: list[tuple[str, PoolEvent]] = []

    def handler(self, who: str) -> Callable[[EventContext], None]:
        def run(ctx: EventContext) -> None:
            with self.lock:
                self.ran[ctx.partition_key].append((who, ctx.event))

        return run

    def subscriber(self, who: str) -> Callable[[PoolEvent], None]:
        def seen(event: PoolEvent) -> None:
            with self.lock:
                self.events.append((who, event))

        return seen

    def kinds(self, who: str, kind: str) -> list[PoolEvent]:
        with self.lock:
            return [event for w, event in self.events if w == who and event.kind == kind]

    def count(self) -> int:
        with self.lock:
            return sum(len(ran) for ran in self.ran.values())


@pytest.fixture
def seen() -> Seen:
    return Seen()


def _worker(
    store: Path, who: str, seen: Seen, opened: list[Runtime], **pool: Any
) -> dopool.WorkerPool:
    """A shared runtime (one worker) defining pool ``rooms``."""
    max_active = pool.pop("max_active", None)
    runtime = Runtime(store, shared=True, lease_ttl=TTL, poll_interval=0.05, max_active=max_active)
    opened.append(runtime)
    runtime.subscribe(seen.subscriber(who))
    return runtime.define("rooms", execute=seen.handler(who), **pool)


def _held(runtime: Runtime) -> set[int]:
    keeper = runtime._keeper
    assert keeper is not None
    return {unit for _, unit in keeper.book.held}


def test_a_shared_worker_serves_a_per_key_pool_starting_only_the_keys_it_runs(
    store_path: Path, seen: Seen, opened: list[Runtime]
) -> None:
    rooms = _worker(store_path, "a", seen, opened, concurrency="per-key")
    runtime = opened[0]
    assert len(_held(runtime)) == LEASE_UNITS  # alone: every unit of 2**64 instances
    assert rooms._instances.cells.made() == []  # and nothing started for them
    keys = [f"room-{n}" for n in range(40)]
    for round_ in range(3):
        for key in keys:
            rooms.enqueue({"round": round_}, partition_key=key)
    until(lambda: seen.count() == 120, "every room's events")
    for key in keys:  # each room's events in order
        assert [event["round"] for _, event in seen.ran[key]] == [0, 1, 2]
    assert len(rooms._instances.cells.made()) <= len(keys)
    assert len(seen.kinds("a", "activated")) == len(keys)
    status = rooms.status()
    assert (status.succeeded, status.used) == (120, 40)


def test_a_shared_worker_evicts_idle_instances_and_wakes_one_for_its_alarm(
    store_path: Path, seen: Seen, opened: list[Runtime]
) -> None:
    """An evicted instance of a shared worker starts again for its delayed event, from the
    runtime's timer of evicted alarms, and for the next enqueue."""
    rooms = _worker(store_path, "a", seen, opened, concurrency=8, idle_timeout=0.2)
    cells = rooms._instances.cells
    rooms.enqueue({"now": True}, partition_key="k")
    index = rooms._instances.router.choose("k")
    until(lambda: seen.count() == 1, "the first event")
    until(lambda: cells.get(index) is None, "the instance evicted")
    assert seen.kinds("a", "evicted")
    # Delayed past its idle_timeout: evicted again while it waits, then started for it.
    rooms.enqueue({"later": True}, partition_key="k", delay=0.6)
    until(lambda: seen.count() == 2, "the delayed event, run by a started instance")
    assert len(seen.kinds("a", "activated")) >= 2
    until(lambda: cells.get(index) is None, "evicted once more")
    rooms.enqueue({"again": True}, partition_key="k")
    until(lambda: seen.count() == 3, "the event that started it again")
    assert [event for _, event in seen.ran["k"]] == [
        {"now": True},
        {"later": True},
        {"again": True},
    ]
    assert rooms.status().instance(index).restarts == 0  # an eviction is not a crash


def test_a_shared_worker_runs_at_most_max_active_instances_at_once(
    store_path: Path, seen: Seen, opened: list[Runtime]
) -> None:
    running = {"now": 0, "peak": 0}
    lock = threading.Lock()

    def busy(ctx: EventContext) -> None:
        with lock:
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
        threading.Event().wait(0.01)
        with lock:
            running["now"] -= 1
        seen.handler("a")(ctx)

    runtime = Runtime(store_path, shared=True, lease_ttl=TTL, poll_interval=0.05, max_active=2)
    opened.append(runtime)
    rooms = runtime.define("rooms", execute=busy, concurrency="per-key")
    results = [rooms.enqueue({"n": n}, partition_key=f"k{n % 12}") for n in range(48)]
    assert len({result.instance_index for result in results}) == 12
    until(lambda: seen.count() == 48, "every event")
    assert running["peak"] <= 2
    for n in range(12):  # each key's events in order, whatever the waits
        assert [event["n"] for _, event in seen.ran[f"k{n}"]] == list(range(n, 48, 12))


def test_taking_a_unit_starts_only_its_instances_with_work_and_a_release_gives_slots_back(
    store_path: Path, seen: Seen, opened: list[Runtime]
) -> None:
    """Work left in a pool of a million: the worker that takes the units starts those three
    instances, not the million; when a second worker joins, the first drops the instances
    of the units it releases, and their slots go back."""
    with Runtime(store_path) as exclusive:  # leaves an event due in a second on three
        pool = exclusive.define("rooms", execute=lambda _ctx: None, concurrency=MILLION)
        left = [pool.enqueue({"left": n}, partition_key=f"key-{n}", delay=1.0) for n in range(3)]
    a = _worker(store_path, "a", seen, opened, concurrency=MILLION, idle_timeout=3600.0)
    cells, slots = a._instances.cells, opened[0]._slots
    indexes = sorted(result.instance_index for result in left)
    assert sorted(cell.index for cell in cells.made()) == indexes  # those three alone
    until(lambda: seen.count() == 3, "the three events left")
    assert slots._active == 3  # still running: idle for less than an hour
    b = _worker(store_path, "b", seen, opened, concurrency=MILLION, idle_timeout=3600.0)
    until(lambda: len(_held(opened[0])) == LEASE_UNITS // 2, "a fair split")
    until(lambda: len(_held(opened[1])) == LEASE_UNITS // 2, "b's half")
    mine = _held(opened[0])
    kept = [index for index in indexes if unit_of(index, MILLION) in mine]
    until(
        lambda: sorted(cell.index for cell in cells.made()) == kept,
        "a's instances in the units it released dropped",
    )
    until(lambda: slots._active == len(kept), "their slots back")
    theirs = next(i for i in range(0, MILLION, 997) if unit_of(i, MILLION) not in mine)
    assert cells[theirs].mailbox.vacant  # another worker's: refused here, and not kept
    assert cells.get(theirs) is None
    # Either worker's enqueue runs where the key's unit is served.
    keys = [f"x{n}" for n in range(40)]
    for n, key in enumerate(keys):
        (a if n % 2 else b).enqueue({"x": n}, partition_key=key)
    until(lambda: seen.count() == 43, "every event, wherever it is served")
    for key in keys:
        unit = unit_of(a._instances.router.choose(key), MILLION)
        with seen.lock:
            assert [who for who, _ in seen.ran[key]] == ["a" if unit in mine else "b"]


def _lease_pids(store: Path) -> Counter[int]:
    with dopool.connect(store) as connection, connection.reading("jobs") as txn:
        return Counter(record.pid for _, _, record in all_leases(txn))


def test_two_worker_processes_serve_a_per_key_pool_fed_through_connect(
    store_path: Path, worker: Callable[..., Worker]
) -> None:
    """Two ``dopool worker --max-active 8`` processes split a per-key pool's 4,096 lease
    units; 200 keys, three events each, come through ``dopool.connect``. Each key runs in
    the worker holding its unit, its events in order; the instances are evicted when idle
    (0.3 s) and started again, and neither worker ever has more than 8 running (counted
    from its ``activated`` and ``evicted`` events, each written before its slot is taken
    back or after it is taken)."""
    evidence = Evidence()
    args = ("--lease-ttl", "1.5", "--poll-interval", "0.1", "--max-active", "8")
    options: dict[str, Any] = {"concurrency": "per-key", "idle_timeout": 0.3}
    first = worker(store_path, evidence, *args, **options).ready()
    second = worker(store_path, evidence, *args, **options).ready()
    pids = [first.proc.pid, second.proc.pid]
    half = LEASE_UNITS // 2
    until(lambda: _lease_pids(store_path) == Counter(dict.fromkeys(pids, half)), "a fair split")
    with dopool.connect(store_path, durability="async") as connection:
        jobs = connection.pool("jobs")
        for round_ in range(3):
            for n in range(200):
                jobs.enqueue({"p": round_, "k": n}, partition_key=f"room-{n}")
    evidence.wait(lambda lines: sum(line["e"] == "end" for line in lines) == 600, "the 600 events")
    with dopool.connect(store_path) as connection, connection.reading("jobs") as txn:
        owner = {unit: record.pid for _, unit, record in all_leases(txn)}
    lines = evidence.snapshot()
    ends = [line for line in lines if line["e"] == "end"]
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in ends:
        by_key[line["key"]].append(line)
    assert len(by_key) == 200
    for key, ran in by_key.items():
        assert [line["p"] for line in ran] == [0, 1, 2], key
        assert {line["pid"] for line in ran} == {owner[unit_of(ran[0]["index"], PER_KEY)]}
    assert {line["pid"] for line in ends} == set(pids)  # both served some
    for pid in pids:
        running = peak = 0
        for line in lines:
            if line["e"] == "pool" and line["pid"] == pid:
                running += {"activated": 1, "evicted": -1}.get(line["kind"], 0)
                peak = max(peak, running)
        assert 0 < peak <= 8
    evicted = [line for line in lines if line["e"] == "pool" and line["kind"] == "evicted"]
    assert evicted  # idle instances went, and the line moved
    assert first.stop() == 0
    assert second.stop() == 0
    assert invoke("check", str(store_path)).exit_code == 0


def test_a_restart_owed_to_an_instance_taken_over_is_counted_whoever_starts_it(
    store_path: Path, seen: Seen, opened: list[Runtime]
) -> None:
    """A unit taken over after its lease expired owes each instance with work a restart;
    the store's poll (or a wake-up) may start one before the keeper does, and the restart
    is counted all the same (CI once saw it lost that way)."""
    rooms = _worker(store_path, "a", seen, opened, concurrency=4)
    cells = rooms._instances.cells
    dropped = cells.unserve({1})  # as if lost, then taken again after its expiry
    assert dropped == {}
    cells.serve(1, [1])
    cell = cells.ready(1)  # the poll's start, not the keeper's
    assert cell is not None
    until(lambda: rooms.status().instance(1).restarts == 1, "the restart counted")
    assert rooms.status().instance(0).restarts == 0
