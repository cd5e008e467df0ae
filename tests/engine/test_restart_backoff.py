"""Restarts back off: three crashes in a row restart at once, later ones wait, doubling.

Two ways to crash-loop: a store whose every write fails (no space left), so no
recovery commits; and a damaged record, whose recovery commits but whose next
attempt crashes again. Under a SimulatedClock the backoff is virtual time (and
the run repeats byte for byte); under a RealClock ``close()`` does not wait it out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dopool._engine.supervisor
from activation import leave_an_interrupted_attempt
from dopool import (
    EventContext,
    InstanceCrashedError,
    PoolEvent,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    StorageError,
)
from dopool._store.environment import Store
from dopool.chaos import FaultPlan

TIMEOUT = 10.0  # wall seconds: a crash loop that never lets the clock move fails the test
NO_WAIT = RetryPolicy(max_attempts=10, initial_delay=0.0, jitter=0.0)


class Switch:
    """Turns a failure on and off; off again when the test ends, so a loop can stop."""

    def __init__(self) -> None:
        self.on = False


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Switch]:
    """While on, every write transaction of an instance fails, as on a full disk."""
    switch = Switch()
    original = Store.transact

    def transact(store: Store, body: Any) -> Any:
        if switch.on:
            raise StorageError("[Errno 28] No space left on device")
        return original(store, body)

    monkeypatch.setattr(Store, "transact", transact)
    yield switch
    switch.on = False


@pytest.fixture
def damaged(monkeypatch: pytest.MonkeyPatch) -> Iterator[Switch]:
    """While on, the engine fails as it starts the event ``"damaged"``: each attempt crashes.

    (A record that fails its checks is dead-lettered instead; this stands for a
    failure the engine cannot settle, such as a read error on that page.)
    """
    switch = Switch()
    context = EventContext

    def failing_context(**fields: Any) -> Any:
        if switch.on and fields["event"] == "damaged":
            raise StorageError("damaged record")
        return context(**fields)

    monkeypatch.setattr("dopool._engine.actor.EventContext", failing_context)
    switch.on = True
    yield switch
    switch.on = False


def drive(clock: SimulatedClock, until: float | None = None) -> None:
    """Run the clock to ``until`` (or until idle), failing rather than hanging on a livelock."""
    deadline = time.monotonic() + TIMEOUT
    limit = float("inf") if until is None else until
    while clock.step(limit, deadline=deadline):
        pass
    if until is not None:
        clock.run_until(until)


def simulated(path: Path) -> tuple[Runtime, SimulatedClock, list[PoolEvent]]:
    runtime = Runtime.simulated(path / "store", seed=0, trace=path / "trace.jsonl")
    assert isinstance(runtime.clock, SimulatedClock)
    seen: list[PoolEvent] = []
    runtime.subscribe(seen.append)
    return runtime, runtime.clock, seen


def kinds(seen: list[PoolEvent], kind: str) -> list[tuple[int | None, float]]:
    return [(event.attempt, event.time) for event in seen if event.kind == kind]


def full_disk_run(path: Path, full_disk: Switch) -> tuple[bytes, list[PoolEvent]]:
    """A pool whose store fills up: no recovery ever commits. Returns trace and events."""
    path.mkdir()
    runtime, clock, seen = simulated(path)
    try:
        pool = runtime.define("p", execute=lambda ctx: None)
        pool.enqueue("x")  # its alarm is due at t=0
        full_disk.on = True
        drive(clock, 100)

        # Down, its restart due at t=123: status says so, from memory.
        status = pool.status().instance(0)
        assert (status.state, status.crash_streak, status.restart_at) == ("restarting", 10, 123)
        assert (status.restarts, status.pending) == (0, 1)  # no recovery committed
        # Calls fail at once instead of waiting out the backoff; a kill has nothing to kill.
        with pytest.raises(InstanceCrashedError):
            pool.enqueue("y")
        with pytest.raises(InstanceCrashedError):
            pool.pause()
        crashes = len(kinds(seen, "crashed"))
        runtime.kill("p", 0)
        assert len(kinds(seen, "crashed")) == crashes

        drive(clock, 250)
        assert pool.status().instance(0).restart_at == 303
    finally:
        runtime.close()  # with a restart due at t=303: it never happens
    assert not clock.pending()
    return (path / "trace.jsonl").read_bytes(), seen


def test_a_store_that_keeps_failing_restarts_three_times_at_once_then_backs_off(
    tmp_path: Path, full_disk: Switch
) -> None:
    trace, seen = full_disk_run(tmp_path / "first", full_disk)

    times = [0.0] * 4 + [1.0, 3.0, 7.0, 15.0, 31.0, 63.0, 123.0, 183.0, 243.0]
    assert [t for _, t in kinds(seen, "crashed")] == times
    # Crash 4 is the first whose restart waits: 1 s, doubling, at most 60 s.
    delays = [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    assert kinds(seen, "restart_delayed") == list(zip(range(4, 14), times[3:], strict=True))
    notes = [event.error for event in seen if event.kind == "restart_delayed"]
    assert notes[0] == (
        "4 crashes in a row, the last: StorageError: [Errno 28] No space left on device; "
        "restart in 1 s"
    )
    assert [note.rsplit(" ", 2)[-2] for note in notes if note] == [str(d) for d in delays]
    assert kinds(seen, "recovered") == []

    full_disk.on = False
    again, _ = full_disk_run(tmp_path / "second", full_disk)
    assert again == trace  # same seed, same calls: the same trace, byte for byte


def test_a_loop_whose_recoveries_commit_still_backs_off_and_a_success_ends_it(
    tmp_path: Path, damaged: Switch
) -> None:
    """Each recovery commits (a retry of the damaged event), and its next attempt crashes."""
    runtime, clock, seen = simulated(tmp_path)
    with runtime:
        pool = runtime.define("p", execute=lambda ctx: None, retry=NO_WAIT)
        pool.enqueue("damaged")
        drive(clock, 10)
        status = pool.status().instance(0)
        assert (status.state, status.crash_streak, status.restart_at) == ("restarting", 7, 15)
        assert (status.restarts, status.attempt) == (6, 7)  # six recoveries committed

        damaged.on = False  # repaired: the attempt after the restart at t=15 succeeds
        drive(clock)
        status = pool.status().instance(0)
        assert (status.state, status.crash_streak, status.restart_at) == ("idle", 0, None)
        assert (status.restarts, status.succeeded) == (7, 1)

    assert kinds(seen, "started") == list(
        zip(range(1, 9), [0.0, 0.0, 0.0, 0.0, 1.0, 3.0, 7.0, 15.0], strict=True)
    )
    assert kinds(seen, "restart_delayed") == [(4, 0.0), (5, 1.0), (6, 3.0), (7, 7.0)]
    assert [t for _, t in kinds(seen, "recovered")] == [0.0, 0.0, 0.0, 1.0, 3.0, 7.0, 15.0]
    assert kinds(seen, "succeeded") == [(8, 15.0)]


def test_define_returns_when_the_first_recovery_loops_and_leaves_it_to_the_backoff(
    tmp_path: Path,
) -> None:
    """Under a simulated clock nobody drives while ``define`` waits: it must not wait.

    The plan fails nearly every write (each recovery's, first of all); the instance left
    an interrupted attempt in the store, so ``define`` recovers it, and that recovery
    writes (one that left nothing starts when first used, and writes nothing). ``define``
    is called from another thread, so the clock has one per actor (tests/clock/test_green.py:
    the same on one thread).
    """
    leave_an_interrupted_attempt(tmp_path / "store", "p")
    plan = FaultPlan(seed=0, storage_error=0.99)
    runtime = Runtime.simulated(tmp_path / "store", seed=0, faults=plan, backend="threads")
    assert isinstance(runtime.clock, SimulatedClock)
    clock = runtime.clock
    seen: list[PoolEvent] = []
    runtime.subscribe(seen.append)
    with runtime:
        defined: list[Any] = []

        def define() -> None:
            defined.append(runtime.define("p", execute=lambda ctx: None))

        thread = threading.Thread(target=define, daemon=True)
        thread.start()
        thread.join(TIMEOUT)
        assert defined, "define did not return"
        pool = defined[0]
        assert pool.status().instance(0).state == "restarting"
        assert kinds(seen, "restart_delayed") == [(4, 0.0)]

        drive(clock)  # restart after restart, until one recovery commits
        status = pool.status().instance(0)
        assert (status.state, status.restart_at) == ("idle", None)
        assert status.restarts == len(kinds(seen, "crashed")) > 4


@pytest.mark.threaded
def test_close_does_not_wait_out_a_restart_backoff_under_the_real_clock(
    tmp_path: Path, damaged: Switch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # raising=False: without restart backoff, the test fails below, not here.
    monkeypatch.setattr(dopool._engine.supervisor, "RESTART_DELAY_FIRST", 30.0, raising=False)
    waiting = threading.Event()

    def on_event(event: PoolEvent) -> None:
        if event.kind == "restart_delayed":
            waiting.set()

    runtime = Runtime(tmp_path / "store")
    try:
        runtime.subscribe(on_event)
        pool = runtime.define("p", execute=lambda ctx: None, retry=NO_WAIT)
        pool.enqueue("damaged")
        assert waiting.wait(TIMEOUT), "the fourth crash in a row did not delay its restart"
        status = pool.status().instance(0)
        assert (status.state, status.crash_streak) == ("restarting", 4)
        assert status.restart_at is not None
        assert time.time() + 20 < status.restart_at <= time.time() + 30
        with pytest.raises(InstanceCrashedError):  # at once, not after 30 s
            pool.enqueue("during the backoff")

        started = time.monotonic()
        runtime.close()
        elapsed = time.monotonic() - started
    finally:
        damaged.on = False
        runtime.close()
    assert elapsed < 10, f"close() took {elapsed:.1f} s"
