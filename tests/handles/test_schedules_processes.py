"""Recurring schedules under the real clock, from producers (``dopool.connect``) and from
the command line (``dopool schedules``), against a running worker and with no owner."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dopool
from cli_support import assert_one_line_error, invoke
from dopool import EventContext, Runtime, ScheduleDefinitionError
from worker_support import Evidence, Worker, starts

pytestmark = pytest.mark.threaded


def created(path: Path, concurrency: int = 2) -> Path:
    """A store with pool ``jobs``, as a worker would define it, and no owner."""
    with Runtime(path) as runtime:
        runtime.define("jobs", execute=lambda ctx: None, concurrency=concurrency)
    return path


def test_a_short_every_fires_on_the_real_clock_never_early(tmp_path: Path) -> None:
    fired: list[tuple[float, float]] = []
    done = threading.Event()

    def handler(ctx: EventContext) -> None:
        fired.append((ctx.enqueued_at, time.time()))
        if len(fired) == 3:
            done.set()

    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=handler, concurrency=2)
        defined = time.time()
        info = pool.schedule("tick", "t", every=0.2)
        assert info.next_at is not None
        assert done.wait(timeout=10)
        assert pool.unschedule("tick")
        assert pool.join(timeout=10)
    first = info.next_at
    # The n-th occurrence is enqueued at or after its fire time, first + 0.2 * n.
    for n, (enqueued_at, ran) in enumerate(fired[:3]):
        assert enqueued_at >= first + 0.2 * n - 1e-6
        assert ran >= enqueued_at
    assert first >= defined + 0.2


def test_a_producer_defines_lists_and_removes_schedules_with_no_owner(tmp_path: Path) -> None:
    store = created(tmp_path / "store")
    with dopool.connect(store) as connection:
        jobs = connection.pool("jobs", schema=lambda event: {"wrapped": event})
        before = time.time()
        info = jobs.schedule("nightly", 1, cron="0 3 * * *", partition_key="p", priority=2)
        assert info.event == {"wrapped": 1}
        assert info.next_at is not None
        assert info.next_at > before
        again = jobs.schedule("nightly", 1, cron="0 3 * * *", partition_key="p", priority=2)
        assert again == info  # the same definition: nothing changed
        jobs.schedule("tick", "t", every=60)
        assert [s.name for s in jobs.schedules()] == ["nightly", "tick"]
        assert jobs.status().schedules == 2
        with pytest.raises(ScheduleDefinitionError):
            jobs.schedule("bad", "t", cron="not cron")
        assert jobs.unschedule("tick") is True
        assert jobs.unschedule("tick") is False
        assert [s.name for s in jobs.schedules()] == ["nightly"]
    assert invoke("check", str(store)).exit_code == 0
    with Runtime(store) as runtime:  # the owner reads what the producer stored
        pool = runtime.define("jobs", execute=lambda ctx: None, concurrency=2)
        assert [s.name for s in pool.schedules()] == ["nightly"]
        assert pool.status().instance(0).next_alarm_at == info.next_at


def test_a_producers_schedule_wakes_the_running_worker(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    """With no poll, only the schedule's wake-up re-arms instance 0's alarm for its fires."""
    owner = worker(store_path, evidence, "--poll-interval", "3600").ready()
    with dopool.connect(store_path) as connection:
        jobs = connection.pool("jobs")
        jobs.schedule("tick", {"p": "t", "k": "tick"}, every=0.1, partition_key="one")
        evidence.wait(lambda lines: len(starts(lines)) >= 3, "three occurrences")
        assert jobs.unschedule("tick")
        evidence.mark("removed")
        fired = jobs.schedules()
    assert fired == []
    with dopool.connect(store_path) as connection:
        jobs = connection.pool("jobs")
        jobs.enqueue({"p": "t", "k": "last"}, partition_key="one")
    evidence.wait_for("the event after the removal", e="end", k="last")
    assert owner.stop() == 0
    lines = evidence.snapshot()
    ticks = [line for line in starts(lines) if line["k"] == "tick"]
    indices = {line["index"] for line in ticks}
    assert len(indices) == 1  # one partition key: one instance
    sequences = [line["sequence"] for line in ticks]
    assert sequences == sorted(sequences)


def test_dopool_schedules_lists_and_removes(tmp_path: Path) -> None:
    store = created(tmp_path / "store", concurrency=3)
    with dopool.connect(store) as connection:
        jobs = connection.pool("jobs")
        jobs.schedule("tick", {"n": 1}, every=3600)
        jobs.schedule("nightly", "x", cron="0 3 * * *", partition_key="k")
    listed = invoke("schedules", str(store))
    assert listed.exit_code == 0, listed.output
    assert "pool jobs · 2 schedules" in listed.stdout
    assert "every 3600 s" in listed.stdout
    assert "cron 0 3 * * *" in listed.stdout
    document = json.loads(invoke("schedules", str(store), "--json").stdout)
    (pool,) = document["pools"]
    assert [s["name"] for s in pool["schedules"]] == ["nightly", "tick"]
    assert pool["schedules"][1]["every"] == 3600.0
    assert pool["schedules"][0]["partition_key"] == "k"
    removed = invoke("schedules", str(store), "--remove", "tick", "--pool", "jobs")
    assert removed.stdout == "removed 'tick' of pool jobs\n"
    again = invoke("schedules", str(store), "--remove", "tick", "--pool", "jobs")
    assert again.exit_code == 0
    assert "no such schedule" in again.stdout
    document = json.loads(invoke("schedules", str(store), "--json").stdout)
    assert [s["name"] for s in document["pools"][0]["schedules"]] == ["nightly"]
    status = json.loads(invoke("status", str(store), "--json").stdout)
    assert status["pools"][0]["schedules"] == 1
    assert invoke("check", str(store)).exit_code == 0


def test_dopool_schedules_errors_are_one_line(tmp_path: Path) -> None:
    store = created(tmp_path / "store")
    assert_one_line_error(invoke("schedules", str(store), "--remove", "x"), 2, "--pool")
    assert_one_line_error(invoke("schedules", str(store), "--pool", "nope"), 1, "no pool")
    assert_one_line_error(invoke("schedules", str(tmp_path / "missing")), 1)


def test_dopool_schedules_with_no_schedule_says_so(tmp_path: Path) -> None:
    store = created(tmp_path / "store")
    result = invoke("schedules", str(store))
    assert result.stdout.strip() == "pool jobs: no schedules"


def test_dopool_check_reports_a_fire_key_without_its_schedule(tmp_path: Path) -> None:
    import lmdb

    from dopool._store.layout import Namespace, ScheduleBook

    store = created(tmp_path / "store")
    with dopool.connect(store) as connection:
        connection.pool("jobs").schedule("tick", "t", every=60)
    book = ScheduleBook(Namespace("jobs", 0))
    with lmdb.open(str(store / "data"), subdir=True) as env, env.begin(write=True) as txn:
        assert txn.delete(book.record_key("tick"))
    result = invoke("check", str(store))
    assert result.exit_code == 1
    assert "a fire key at" in result.stdout
    assert "1 schedules, 0 records" in result.stdout


def test_dopool_check_reports_a_schedule_left_without_an_alarm(tmp_path: Path) -> None:
    from dopool._store.environment import Store
    from dopool._store.layout import Namespace

    store = created(tmp_path / "store")
    with dopool.connect(store) as connection:
        connection.pool("jobs").schedule("tick", "t", every=60)
    ns = Namespace("jobs", 0)
    opened = Store(store)
    try:

        def clear(txn: Any) -> None:
            meta = ns.load_meta(txn)
            meta.alarm = None
            ns.save_meta(txn, meta)

        opened.transact(clear)
    finally:
        opened.close()
    result = invoke("check", str(store))
    assert result.exit_code == 1
    assert "and no alarm is set" in result.stdout
