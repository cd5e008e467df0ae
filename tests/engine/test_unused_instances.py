"""An instance costs no write until it is first used (docs/store-format.md, "Keys")."""

from __future__ import annotations

from pathlib import Path

import pytest

from dopool import ConfigurationError, EventContext, Runtime, SimulatedClock
from dopool._ops.check import check_store
from dopool._store.layout import Namespace


def noop(ctx: EventContext) -> None:
    pass


def used(runtime: Runtime, pool: str, concurrency: int) -> list[int]:
    """The instances of ``pool`` that have a meta record."""
    with runtime._store.read() as txn:
        return [i for i in range(concurrency) if Namespace(pool, i).meta_bytes(txn) is not None]


def test_defining_and_reopening_write_nothing_for_instances_never_used(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=200)
        assert used(runtime, "p", 200) == []
        status = pool.status()
        assert (status.instances, status.used, status.concurrency) == ([], 0, 200)
        assert [status.instance(i).state for i in range(200)] == ["idle"] * 200
        result = pool.enqueue("a", partition_key="k")
        assert pool.join()
        assert used(runtime, "p", 200) == [result.instance_index]
        listed = pool.status().instances  # only the instance ever used
        assert [(i.index, i.succeeded) for i in listed] == [(result.instance_index, 1)]
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=200)
        assert used(runtime, "p", 200) == [result.instance_index]
        assert pool.status().succeeded == 1
        with runtime._store.read() as txn:
            assert check_store(txn).ok


def test_a_crash_of_an_unused_instance_is_counted_in_its_first_record(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=noop, concurrency=3)
        runtime.kill("p", 2)
        assert isinstance(runtime.clock, SimulatedClock)
        runtime.clock.run_until_idle()
        assert used(runtime, "p", 3) == [2]
        status = pool.status()
        assert [(i.index, i.restarts) for i in status.instances] == [(2, 1)]
        assert [status.instance(i).restarts for i in range(3)] == [0, 0, 1]


def test_a_pause_of_an_unused_instance_is_stored(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=noop, concurrency=3)
        pool.pause(1)
        assert used(runtime, "p", 3) == [1]
        status = pool.status()
        assert [(i.index, i.state) for i in status.instances] == [(1, "paused")]
        assert [status.instance(i).state for i in range(3)] == ["idle", "paused", "idle"]


def test_status_sums_the_whole_pool_and_lists_the_instances_chosen_among_those_used(
    tmp_path: Path,
) -> None:
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=noop, concurrency=100_000)
        for index in (7, 70, 700, 7_000, 70_000):
            pool.pause(index)
        results = pool.enqueue_many(range(50), partition_key="k")  # one instance's
        statuses = pool.status()
        assert (statuses.enqueued, statuses.succeeded) == (50, 0)
        assert statuses.pending == 50 - statuses.instance(results[0].instance_index).succeeded
        used = sorted({7, 70, 700, 7_000, 70_000, results[0].instance_index})
        assert statuses.used == len(used)
        assert [s.index for s in statuses.instances] == used
        page = pool.status(instances=range(71, 100_000), limit=2)
        assert [s.index for s in page.instances] == [i for i in used if i > 70][:2]
        assert (page.used, page.concurrency) == (len(used), 100_000)
        chosen = pool.status(instances=[70_000, 5, 7])  # 5 was never used: not listed
        assert [s.index for s in chosen.instances] == [7, 70_000]
        assert pool.status(limit=0).instances == []
        for bad in ({"limit": -1}, {"limit": True}, {"instances": [100_000]}, {"instances": "7"}):
            with pytest.raises(ConfigurationError, match=r"limit|instances"):
                pool.status(**bad)
