"""The store's alarm and work indexes (docs/store-format.md): an instance's entries follow
its meta in the transaction that changes it, whatever the transition, and whoever
makes it (its actor, a producer, a migration)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import dopool
from dopool import EventContext, Runtime
from dopool._machine.invariants import index_violations
from dopool._machine.types import Effects, Item, Pause
from dopool._store.environment import Store
from dopool._store.layout import (
    Meta,
    Namespace,
    alarm_index,
    pack,
    parse_alarm_entry,
    parse_work_entry,
    work_entry_key,
    work_index,
)
from dopool._store.txn import Txn
from machine_rig import Rig


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "store", durability="async")
    yield store
    store.close()


def held(store: Store) -> tuple[list[tuple[float, str, int] | None], list[tuple[str, int] | None]]:
    """The alarm index's entries (earliest first) and the work index's, parsed."""
    with store.read() as txn:
        alarms = [parse_alarm_entry(key) for key in alarm_index(txn)]
        work = [parse_work_entry(key) for key in work_index(txn)]
    return alarms, work


def test_an_enqueue_indexes_its_alarm_and_its_work_and_the_outcome_removes_both(
    store: Store,
) -> None:
    rig = Rig(store)
    assert held(store) == ([], [])
    rig.enqueue("a", now=1.0)
    assert held(store) == ([(1.0, "p", 0)], [("p", 0)])
    rig.start(now=1.0)  # the attempt runs: no alarm, still work
    assert held(store) == ([], [("p", 0)])
    rig.succeed(now=2.0)
    assert held(store) == ([], [])
    assert rig.broken() == []


def test_a_delayed_event_is_indexed_at_its_due_time_and_moves_with_the_alarm(
    store: Store,
) -> None:
    rig = Rig(store)
    item = Item(pack("later"), None, 0, due=30.0)

    def delayed(txn: Txn, meta: Meta, fx: Effects) -> None:
        rig.machine.accept(txn, meta, [("t", (item,))], 0.0, fx)
        rig.machine.rearm(meta, 0.0)

    rig.step(delayed)
    assert held(store) == ([(30.0, "p", 0)], [("p", 0)])
    rig.enqueue("now", now=5.0)  # due at once: the alarm moves to 5.0, one entry
    assert held(store) == ([(5.0, "p", 0)], [("p", 0)])
    assert rig.broken() == []


def test_a_pause_clears_the_alarm_entry_and_keeps_the_work_entry(store: Store) -> None:
    rig = Rig(store)
    rig.enqueue("a", now=0.0)
    rig.step(lambda txn, meta, fx: rig.machine.control(txn, meta, Pause(), 0.0, fx))
    assert held(store) == ([], [("p", 0)])
    assert rig.broken() == []


def test_a_follow_up_in_the_outbox_is_work_until_its_target_has_it(store: Store) -> None:
    rig = Rig(store, route=lambda key: 1)  # follow-ups go to instance 1
    rig.enqueue("a", now=0.0)
    rig.start(now=0.0)
    rig.succeed(now=1.0, follow_ups=[(Item(pack("child"), "k", 0), None)])
    assert rig.meta.outbox == 1
    assert held(store) == ([], [("p", 0)])  # nothing pending, one follow-up to deliver
    assert rig.broken() == []


def test_an_index_entry_the_meta_does_not_bear_out_is_reported(store: Store) -> None:
    rig = Rig(store)
    rig.enqueue("a", now=1.0)
    with store.write() as txn:  # the entries as a save that forgot them would leave them
        namespace = Namespace("p", 0)
        meta = namespace.load_meta(txn)
        meta.indexed_alarm, meta.indexed_work = None, False  # "not indexed": both again
        meta.alarm = 7.0
        namespace.save_meta(txn, meta)  # a second alarm entry beside the first
    rig.meta = meta
    assert rig.broken() == ["p:0: alarm at 7.0, the alarm index holds [1.0, 7.0]"]


def test_index_violations_names_missing_entries_and_entries_of_no_instance(
    store: Store,
) -> None:
    with store.write() as txn:
        Namespace("p", 0).save_meta(txn, Meta(pending=1, alarm=3.0))
    with store.read() as txn:
        assert index_violations(txn, {"p": 1}) == []
    with store.write() as txn:
        txn.delete(work_entry_key("p", 0))  # a save that forgot its work entry
        Namespace("p", 5).save_meta(txn, Meta(pending=1, alarm=2.0))  # past concurrency 1
    with store.read() as txn:
        assert index_violations(txn, {"p": 1}) == [
            "p:0: 1 pending and 0 in the outbox, the work index lacks it",
            "p:5: the alarm index holds [2.0], for no instance",
            "p:5: the work index holds it, for no instance",
        ]
        assert index_violations(txn, {"q": 1}) == []  # p's entries are not judged


def noop(ctx: EventContext) -> None:
    pass


def test_a_runtime_and_a_producer_keep_the_indexes_of_every_instance(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=3)
        pool.pause(1)
        pool.enqueue_many(range(6))
        with runtime._store.read() as txn:
            assert index_violations(txn, {"p": 3}) == []
            assert {parse_work_entry(key) for key in work_index(txn)} == {
                ("p", 0),
                ("p", 1),
                ("p", 2),
            }
        assert not pool.join()  # instance 1 is paused: its events stay
        with runtime._store.read() as txn:
            assert [parse_work_entry(key) for key in work_index(txn)] == [("p", 1)]
            assert list(alarm_index(txn)) == []  # paused: no alarm
            assert index_violations(txn, {"p": 3}) == []
    with dopool.connect(store) as connection:
        producer = connection.pool("p")
        producer.enqueue("x", partition_key="k")
        producer.resume(1)
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=noop, concurrency=3)
        assert pool.join()
        with runtime._store.read() as txn:
            assert (list(work_index(txn)), list(alarm_index(txn))) == ([], [])
            assert index_violations(txn, {"p": 3}) == []


def test_join_reads_no_meta_of_an_instance_without_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool of 2,000 instances and one event: join drives the clock until it is done
    and asks the work index, not every instance's meta, after each step."""
    with Runtime.simulated(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=noop, concurrency=2_000)
        pool.enqueue("a", partition_key="k")
        loads = 0
        load_meta = Namespace.load_meta

        def counted(namespace: Namespace, txn: Txn) -> Meta:
            nonlocal loads
            loads += 1
            return load_meta(namespace, txn)

        monkeypatch.setattr(Namespace, "load_meta", counted)
        assert pool.join()
        assert loads < 50  # the instance that worked, a few times; once per instance: 2,000
