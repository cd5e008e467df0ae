"""Recurring schedules through crashes: instance 0 killed at each fault point around a
fire, the occurrence's target killed, the store reopened. Each fire time gives exactly
one occurrence, or is counted as coalesced into a later one: never two, never none."""

from __future__ import annotations

from pathlib import Path

import pytest

from dopool import (
    EventContext,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    WorkerPool,
)
from dopool._ops.check import check_store
from dopool.chaos import FaultPlan

PERIOD = 10.0


def clock(runtime: Runtime) -> SimulatedClock:
    found = runtime.clock
    assert isinstance(found, SimulatedClock)
    return found


END = 400.0
# Crashes before an attempt count as failed attempts: retried, never dead-lettered here.
RETRY = RetryPolicy(max_attempts=100, initial_delay=0.5, max_delay=1.0, jitter=0.0)


def run(
    tmp_path: Path, plan: FaultPlan, concurrency: int = 3
) -> tuple[dict[str, int], set[tuple[int, int, str]]]:
    """Two schedules (one fired into instance 0's own queue, one through its outbox),
    defined without faults, run to END under ``plan``, then the store reopened without
    faults to remove them and finish the work; what was handled, and the books checked."""
    handled: set[tuple[int, int, str]] = set()
    path = tmp_path / "store"

    def handler(ctx: EventContext) -> None:
        handled.add((ctx.instance_index, ctx.sequence, ctx.event))

    def define(runtime: Runtime) -> WorkerPool:
        return runtime.define("p", execute=handler, concurrency=concurrency, retry=RETRY)

    with Runtime(path, clock=SimulatedClock(0.0), seed=3) as runtime:
        pool = define(runtime)
        router = runtime._pools["p"].router
        own = next(f"k{n}" for n in range(100) if router.choose(f"k{n}") == 0)
        away = next(f"k{n}" for n in range(100) if router.choose(f"k{n}") != 0)
        pool.schedule("own", "own", every=PERIOD, partition_key=own)
        pool.schedule("away", "away", every=PERIOD, partition_key=away)
    with Runtime(path, clock=SimulatedClock(0.0), faults=plan, seed=3) as runtime:
        pool = define(runtime)
        clock(runtime).run_until(END)
        infos = {info.name: info for info in pool.schedules()}
    with Runtime(path, clock=SimulatedClock(END), seed=3) as runtime:
        pool = define(runtime)
        assert pool.unschedule("own")
        assert pool.unschedule("away")
        assert pool.join(timeout=30)
        with runtime._store.read() as txn:
            report = check_store(txn)
        assert report.ok, report.problems
    counts = {}
    for name, info in infos.items():
        occurrences = {(i, s) for i, s, event in handled if event == name}
        assert info.fired == len(occurrences), name  # each occurrence enqueued ran
        # Every fire time before the next one is fired or counted as coalesced, once. (The
        # next may be at or before END: instance 0 was waiting out a backoff then.)
        assert info.next_at is not None
        assert info.next_at <= END + PERIOD, (name, info)
        assert info.fired + info.coalesced == round(info.next_at / PERIOD) - 1, (name, info)
        counts[name] = info.coalesced
    return counts, handled


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "fault", ["crash_during_fire", "storage_error", "crash_before_execute", "alarm_error"]
)
def test_each_fire_time_gives_one_occurrence_through_crashes_at_each_point(
    tmp_path: Path, fault: str, seed: int
) -> None:
    plan = FaultPlan(seed=seed, **{fault: 0.3})
    coalesced, _ = run(tmp_path, plan)
    # Fires coalesce only while instance 0 waits out a backoff: a restart's, after crashes
    # in a row, or a failed alarm delivery's.
    assert sum(coalesced.values()) < 2 * END / PERIOD


def test_without_faults_nothing_is_coalesced(tmp_path: Path) -> None:
    coalesced, handled = run(tmp_path, FaultPlan(seed=0))
    assert coalesced == {"own": 0, "away": 0}
    assert len(handled) == 2 * int(END // PERIOD)


def test_a_crash_during_every_fire_until_it_commits_fires_it_once(tmp_path: Path) -> None:
    """Every fire's transaction rolled back by a crash until a draw lets it commit: the
    restarted instance 0 fires again, and the fire time counts once."""
    handled: list[tuple[float, int]] = []

    def handler(ctx: EventContext) -> None:
        handled.append((ctx.enqueued_at, ctx.sequence))

    plan = FaultPlan(seed=11, crash_during_fire=0.6)
    with Runtime(tmp_path / "store", clock=SimulatedClock(0.0), faults=plan) as runtime:
        pool = runtime.define("p", execute=handler, retry=RETRY)
        pool.schedule("t", "t", every=PERIOD)  # (the fault is drawn in fires only)
        clock(runtime).run_until(100.0)
        restarts = pool.status().instance(0).restarts
        (info,) = pool.schedules()
    assert restarts > 0
    assert len(handled) == info.fired
    assert len({s for _, s in handled}) == info.fired
    assert info.next_at is not None
    assert info.fired + info.coalesced == round(info.next_at / PERIOD) - 1


def test_killing_instance_0_or_the_target_around_fires(tmp_path: Path) -> None:
    handled: list[tuple[int, int, str]] = []

    def handler(ctx: EventContext) -> None:
        handled.append((ctx.instance_index, ctx.sequence, ctx.event))

    with Runtime(tmp_path / "store", clock=SimulatedClock(0.0)) as runtime:
        pool = runtime.define("p", execute=handler, concurrency=2)
        router = runtime._pools["p"].router
        away = next(f"k{n}" for n in range(100) if router.choose(f"k{n}") == 1)
        pool.schedule("away", "away", every=PERIOD, partition_key=away)
        pool.schedule(
            "own",
            "own",
            every=PERIOD,
            partition_key=next(f"k{n}" for n in range(100) if router.choose(f"k{n}") == 0),
        )
        for step in range(1, 20):
            clock(runtime).run_until(step * PERIOD - 0.5)
            runtime.kill("p", step % 2)  # before the fire, or before its delivery lands
            clock(runtime).run_until(step * PERIOD)
        assert pool.join(timeout=30)
        infos = {info.name: info for info in pool.schedules()}
    for name in ("own", "away"):
        runs = [(i, s) for i, s, event in handled if event == name]
        assert len(runs) == len(set(runs)) == infos[name].fired == 19, name
        assert infos[name].coalesced == 0
