"""``alarm_retries``: Cloudflare's alarm rule on the real engine, in virtual time.

Every alarm delivery fails while ``outage.on`` (the ``alarm_error`` fault, switched
deterministically instead of drawn), so the retry times are exact. With a limit
``n``, the delivery is retried after 2, 4, 8, ... s and given up after ``n + 1``
failures in a row: the instance is stalled until a write sets an alarm again.
See docs/api.md ("WorkerPool.define", "InstanceStatus") and docs/guarantees.md.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dopool import (
    EventContext,
    PermanentError,
    PoolEvent,
    RetryAfter,
    RetryPolicy,
    Runtime,
    SimulatedClock,
)
from dopool._cli import cli
from dopool._machine.invariants import read_instance, violations
from dopool.chaos import FaultInjector, FaultPlan

CLOUDFLARE = 6  # developers.cloudflare.com/durable-objects/api/alarms/: up to 6 retries
STEPS = 40  # a bound on clock steps, so that a bug that refires an alarm cannot hang a test


@dataclass
class Outage:
    """Whether alarm deliveries fail; the other fault points never fire."""

    on: bool = True


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch) -> Outage:
    switch = Outage()

    def fires(self: FaultInjector, point: str) -> bool:
        return point == "alarm_error" and switch.on

    monkeypatch.setattr(FaultInjector, "fires", fires)
    return switch


class Rig:
    """One simulated runtime on a store that outlives it, one pool, what it saw."""

    def __init__(self, path: Path, retries: int | None, *, start: float = 0.0) -> None:
        self.path = path
        self.seen: list[PoolEvent] = []
        self.ran: list[Any] = []
        self.clock = SimulatedClock(start)
        self.runtime = Runtime(path, clock=self.clock, seed=1, faults=FaultPlan(alarm_error=1.0))
        self.runtime.subscribe(self.seen.append)
        # No idle timer: every clock step these tests count is an alarm of the instance.
        self.pool = self.runtime.define(
            "p", execute=self.execute, alarm_retries=retries, idle_timeout=None
        )

    def execute(self, ctx: EventContext) -> None:
        self.ran.append(ctx.event)
        if ctx.event == "poison":
            raise PermanentError("poisoned")

    def steps(self) -> list[float]:
        """Fire what is scheduled, one item at a time; the time of each."""
        times = []
        for _ in range(STEPS):
            if not self.clock.step():
                break
            times.append(self.clock.now())
        return times

    def kinds(self, kind: str) -> list[PoolEvent]:
        return [event for event in self.seen if event.kind == kind]

    @property
    def instance(self) -> Any:
        return self.pool.status().instance(0)

    def close(self) -> None:
        self.runtime.close()


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    opened: list[Rig] = []
    yield opened
    for rig in opened:
        if not rig.runtime.closed:
            rig.close()


def open_rig(rigs: list[Rig], path: Path, retries: int | None, start: float = 0.0) -> Rig:
    rig = Rig(path, retries, start=start)
    rigs.append(rig)
    return rig


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def stall(rigs: list[Rig], path: Path, retries: int = CLOUDFLARE) -> Rig:
    """A rig whose instance gave its alarm up, with events "a" and "b" pending."""
    rig = open_rig(rigs, path, retries)
    rig.pool.enqueue_many(["a", "b"])
    rig.steps()
    assert rig.instance.state == "stalled"
    return rig


def test_a_failing_alarm_is_retried_after_2_to_64_s_then_given_up(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    rig = open_rig(rigs, store_path, CLOUDFLARE)
    rig.pool.enqueue_many(["a", "b"])
    times = rig.steps()
    # The first try at 0, then 6 retries; the seventh failure in a row gives the alarm up.
    assert times == [0.0, 2.0, 6.0, 14.0, 30.0, 62.0, 126.0]
    assert gaps(times) == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    [given_up] = rig.kinds("alarm_given_up")
    assert (given_up.instance_index, given_up.time, given_up.sequence) == (0, 126.0, None)
    assert "failed 7 times in a row (the first try and 6 retries)" in str(given_up.error)


def test_a_stalled_instance_keeps_its_events_and_runs_nothing(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    rig = stall(rigs, store_path)
    outage.on = False  # deliveries would succeed now, but there is no alarm to deliver
    assert rig.pool.join(timeout=5) is False  # nothing scheduled can make progress
    rig.clock.run_until(10_000.0)
    instance = rig.instance
    assert (instance.state, instance.pending, instance.next_alarm_at) == ("stalled", 2, None)
    assert rig.ran == []
    assert len(rig.kinds("alarm_given_up")) == 1
    assert rig.kinds("started") == []
    with rig.runtime._store.read() as txn:
        stored = read_instance(txn, "p", 0)
    assert violations(stored) == []  # guarantee 4 holds: the events are durable
    assert stored.pending_keys == 2


def test_the_next_enqueue_unstalls_with_a_fresh_budget(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    rig = stall(rigs, store_path)
    rig.pool.enqueue("c")  # at t=126, still failing: a fresh budget of 6 retries
    assert rig.instance.next_alarm_at == 126.0
    times = rig.steps()
    assert gaps(times) == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    assert len(rig.kinds("alarm_given_up")) == 2
    outage.on = False
    rig.pool.enqueue("d")
    assert rig.pool.join(timeout=5)
    assert rig.ran == ["a", "b", "c", "d"]
    instance = rig.instance
    assert (instance.state, instance.pending, instance.succeeded) == ("idle", 0, 4)


def test_a_first_failure_with_no_retries_stalls_a_chained_start(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    """``alarm_retries=0``: the outcome's transaction starts the next event, and fails."""
    outage.on = False
    rig = open_rig(rigs, store_path, 0)

    def execute(ctx: EventContext) -> None:
        rig.ran.append(ctx.event)
        outage.on = True  # the start of the next event, chained to this outcome, fails

    rig.pool = rig.runtime.define("q", execute=execute, alarm_retries=0, idle_timeout=None)
    rig.pool.enqueue_many(["a", "b"])
    assert rig.steps() == [0.0]
    assert rig.ran == ["a"]
    [given_up] = rig.kinds("alarm_given_up")
    assert "failed on its first try, no retry allowed" in str(given_up.error)
    assert rig.instance.state == "stalled"


def test_resume_wakes_a_stalled_instance_and_pause_keeps_the_stall(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    rig = stall(rigs, store_path)
    rig.pool.pause()
    assert (rig.instance.state, rig.instance.next_alarm_at) == ("paused", None)
    rig.pool.resume()  # the flag changes, and the stall ends
    assert (rig.instance.state, rig.instance.next_alarm_at) == ("idle", 126.0)
    assert gaps(rig.steps())[0] == 2.0  # a fresh budget
    assert rig.instance.state == "stalled"
    resumed = len(rig.kinds("resumed"))
    outage.on = False
    rig.pool.resume()  # not paused: no event, but the stall ends too
    assert len(rig.kinds("resumed")) == resumed
    assert rig.pool.join(timeout=5)
    assert rig.ran == ["a", "b"]


def test_a_retry_whose_alarm_is_given_up_shows_stalled_not_backoff(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    outage.on = False
    rig = open_rig(rigs, store_path, 1)

    def execute(ctx: EventContext) -> None:
        rig.ran.append((ctx.event, ctx.attempt))
        if ctx.attempt == 1:
            outage.on = True  # the retry's alarm will fail
            raise RetryAfter(10)

    rig.pool = rig.runtime.define(
        "q", execute=execute, alarm_retries=1, retry=RetryPolicy(), idle_timeout=None
    )
    rig.pool.enqueue("a")
    assert rig.steps() == [0.0, 10.0, 12.0]  # the attempt; the retry's alarm, and one retry
    instance = rig.instance
    assert (instance.state, instance.current_sequence, instance.attempt) == ("stalled", 0, 1)
    assert instance.next_alarm_at is None  # "backoff" would promise a retry that never comes
    outage.on = False
    rig.pool.resume(0)
    assert rig.instance.next_alarm_at == 10.0  # the retry's time, already due
    assert rig.pool.join(timeout=5)
    assert rig.ran == [("a", 1), ("a", 2)]


def test_drain_ends_a_stall(outage: Outage, rigs: list[Rig], store_path: Path) -> None:
    rig = stall(rigs, store_path)
    assert rig.pool.drain() == 2
    assert (rig.instance.state, rig.instance.next_alarm_at) == ("idle", None)
    with rig.runtime._store.read() as txn:
        assert read_instance(txn, "p", 0).meta.alarm_failures == 0


def test_a_redrive_wakes_a_stalled_instance(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    rig = open_rig(rigs, store_path, 1)
    outage.on = False
    rig.pool.enqueue("poison")
    assert rig.pool.join(timeout=5)
    outage.on = True
    rig.pool.enqueue("a")
    assert rig.steps() == [0.0, 2.0]  # the first try and one retry
    assert rig.instance.state == "stalled"
    assert rig.pool.redrive() == 1
    assert (rig.instance.state, rig.instance.next_alarm_at) == ("idle", 2.0)
    outage.on = False
    rig.pool.join(timeout=5)
    assert rig.ran == ["poison", "a", "poison"]


def test_a_stall_survives_a_restart_and_a_reopened_store(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    rig = stall(rigs, store_path)
    rig.runtime.kill("p", 0)  # under a SimulatedClock: returns once recovered
    instance = rig.instance
    assert (instance.state, instance.restarts, instance.next_alarm_at) == ("stalled", 1, None)
    assert rig.steps() == []  # recovery set no alarm
    rig.close()
    # Reopened without a limit: the stall is stored state, and stays until a write.
    again = open_rig(rigs, store_path, None, start=200.0)
    assert (again.instance.state, again.instance.pending) == ("stalled", 2)
    assert again.steps() == []
    outage.on = False
    again.pool.enqueue("c")
    assert again.pool.join(timeout=5)
    assert again.ran == ["a", "b", "c"]


def test_dopool_status_shows_a_stalled_instance_offline(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    rig = stall(rigs, store_path)
    rig.close()
    result = CliRunner().invoke(cli, ["status", str(store_path), "--json"])
    assert result.exit_code == 0, result.output
    [pool] = json.loads(result.stdout)["pools"]
    assert [(i["state"], i["pending"]) for i in pool["instances"]] == [("stalled", 2)]
    assert "stalled" in CliRunner().invoke(cli, ["status", str(store_path)]).stdout
    checked = CliRunner().invoke(cli, ["check", str(store_path)])
    assert checked.exit_code == 0, checked.output


def test_without_a_limit_a_failing_alarm_is_retried_for_ever_at_most_60_s_apart(
    outage: Outage, rigs: list[Rig], store_path: Path
) -> None:
    rig = open_rig(rigs, store_path, None)
    rig.pool.enqueue("a")
    times = rig.steps()
    assert len(times) == STEPS  # still retrying
    assert gaps(times)[:8] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert set(gaps(times)[5:]) == {60.0}
    assert rig.kinds("alarm_given_up") == []
    assert rig.instance.state == "idle"
    outage.on = False
    assert rig.pool.join(timeout=5)
    assert rig.ran == ["a"]
