"""An instance costs no write until it is first used (docs/store-format.md, "Keys")."""

from __future__ import annotations

from pathlib import Path

from dopool import EventContext, Runtime, SimulatedClock
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
        assert [i.state for i in pool.status().instances] == ["idle"] * 200
        result = pool.enqueue("a", partition_key="k")
        assert pool.join()
        assert used(runtime, "p", 200) == [result.instance_index]
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
        assert [i.restarts for i in pool.status().instances] == [0, 0, 1]


def test_a_pause_of_an_unused_instance_is_stored(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=noop, concurrency=3)
        pool.pause(1)
        assert used(runtime, "p", 3) == [1]
        assert [i.state for i in pool.status().instances] == ["idle", "paused", "idle"]
