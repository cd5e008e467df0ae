"""Pools of up to 2**32 instances (docs/api.md, "concurrency"): defining one writes
nothing per instance, its leases cover units of its instances (at most 4,096 of them,
``dopool._cluster.units``), and status, dead letters, pause and a change of concurrency
read the instances used, not every index."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from activation import activate
from dopool import ConfigurationError, EventContext, PermanentError, Runtime, connect
from dopool._cluster.leases import lease_owner
from dopool._cluster.routing import stable_hash
from dopool._cluster.units import LEASE_UNITS, span, unit_of
from dopool._store.layout import all_leases

MILLION = 1_000_000
TIMEOUT = 30.0


def noop(ctx: EventContext) -> None:
    pass


def refuse_odd(ctx: EventContext) -> None:
    if ctx.event % 2:
        raise PermanentError("odd")


def test_a_million_instances_are_served_by_4096_leases_under_the_real_clock(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with Runtime(store, durability="async") as runtime:
        pool = runtime.define("rooms", execute=noop, concurrency=MILLION)
        results = [pool.enqueue(n, partition_key=f"room-{n}") for n in range(20)]
        assert pool.join(TIMEOUT)
        used = sorted({result.instance_index for result in results})
        status = pool.status()
        assert (status.concurrency, status.used, status.succeeded) == (MILLION, len(used), 20)
        assert [s.index for s in status.instances] == used
        with runtime._store.read() as txn:
            leases = list(all_leases(txn))
            owner = lease_owner(txn, "rooms", used[-1])
        assert len(leases) == LEASE_UNITS  # not a million
        assert {record.owner for _, _, record in leases} == {owner}
        assert owner is not None
        # Every unit is served here: an instance past the first 4,096 takes its events.
        high = next(r for r in results if r.instance_index >= LEASE_UNITS)
        assert status.instance(high.instance_index).succeeded >= 1
        shown = subprocess.run(  # beside it, from another process (as an operator would)
            [sys.executable, "-m", "dopool", "status", str(store), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        document = json.loads(shown.stdout)
    (shown,) = document["pools"]
    assert len(shown["leases"]) == LEASE_UNITS  # named by the instances each covers
    covered = span(unit_of(used[-1], MILLION), MILLION)
    assert shown["leases"][f"{covered.start}-{covered.stop - 1}"]["owner"] == owner


def test_a_producer_enqueues_into_a_large_pool_and_its_owner_runs_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Runtime(store, durability="async") as runtime:
        pool = runtime.define("rooms", execute=noop, concurrency=MILLION)
        with connect(store) as connection:
            stored = connection.pool("rooms").enqueue("hello", partition_key="room-42")
        assert (
            stored.instance_index == pool.enqueue("again", partition_key="room-42").instance_index
        )
        assert pool.join(TIMEOUT)
        assert pool.status().succeeded == 2


def test_a_whole_pool_pause_reaches_instances_first_used_after_it(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("rooms", execute=noop, concurrency=MILLION)
        before = pool.enqueue("a", partition_key="before")
        assert pool.join()
        pool.pause()  # one instance used: one message, and the pool's record
        status = pool.status()
        assert status.paused
        assert [s.state for s in status.instances] == ["paused"]
        later = pool.enqueue("b", partition_key="after")  # an instance never used
        assert later.instance_index != before.instance_index
        assert not pool.join()  # paused: it waits
        assert pool.status().instance(later.instance_index).pending == 1
        pool.resume(later.instance_index)  # that instance alone
        assert pool.join()
        assert pool.status().paused  # the others never used still start paused
        pool.resume()
        assert not pool.status().paused


def test_dead_letters_of_a_large_pool_are_read_from_the_instances_used(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=refuse_odd, concurrency=MILLION)
        pool.enqueue_many(list(range(10)), partition_key="k")
        pool.enqueue(3, partition_key="other")
        assert pool.join()
        assert sorted(letter.event for letter in pool.dead_letters()) == [1, 3, 3, 5, 7, 9]
        assert pool.redrive(error="odd") == 6
        assert pool.join()
        assert pool.purge_dead_letters() == 6
        assert pool.dead_letters() == []


def test_a_change_of_concurrency_reads_only_the_instances_used(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=MILLION)
        pool.pause()
        held = pool.enqueue("x", partition_key="k")
    with Runtime.simulated(store) as runtime, pytest.raises(ConfigurationError) as caught:
        runtime.define("p", execute=noop, concurrency=2 * MILLION)
    assert f"instance {held.instance_index}'s 1 pending events" in str(caught.value)
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=MILLION)
        assert pool.drain() == 1
    with Runtime.simulated(store) as runtime:  # nothing held: the change is taken
        assert runtime.define("p", execute=noop, concurrency=2 * MILLION).concurrency == 2 * MILLION


def test_a_shared_worker_serves_a_pool_of_2_to_the_32_by_its_lease_units(tmp_path: Path) -> None:
    with Runtime(tmp_path / "store", shared=True) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=2**32)
        assert pool._instances.cells.made() == []  # nothing started for them
        with runtime._store.read() as txn:
            assert len(list(all_leases(txn))) == LEASE_UNITS
        result = pool.enqueue(1, partition_key="k")
        assert pool.join(timeout=TIMEOUT)
        assert [cell.index for cell in pool._instances.cells.made()] == [result.instance_index]


def test_an_instance_running_but_never_used_reads_a_whole_pool_pause_made_meanwhile(
    tmp_path: Path,
) -> None:
    """A meta never stored is read anew in each transaction: the pool's pause decides it."""
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=noop, concurrency=MILLION)
        index = stable_hash("k") % MILLION
        activate(pool, index)  # started, as a message would, and nothing stored
        assert pool.status().used == 0
        assert index in [cell.index for cell in pool._instances.cells.made()]
        pool.pause()  # no instance used: the pool's record alone
        pool.enqueue("x", partition_key="k")  # to that running instance
        assert not pool.join()
        assert pool.status().instance(index).state == "paused"
