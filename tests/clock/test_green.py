"""The greenlet backend of a simulated clock: its scheduler, stalls, and the same runs."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from activation import leave_an_interrupted_attempt
from dopool import (
    EventContext,
    PoolEvent,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    SimulationStalledError,
)
from dopool._clock import greenlets
from dopool._clock.greenlets import GreenletBackend, Scheduler, TaskLocal
from dopool._engine.actor import forget_instance, running_instances
from dopool.chaos import FaultPlan


def simulated(runtime: Runtime) -> SimulatedClock:
    assert isinstance(runtime.clock, SimulatedClock)
    return runtime.clock


def green_clock() -> tuple[SimulatedClock, Scheduler]:
    clock = SimulatedClock(backend="greenlet")
    assert isinstance(clock.backend, GreenletBackend)
    return clock, clock.backend.scheduler


# -- choosing the backend ----------------------------------------------------------


def test_the_backend_is_greenlet_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOPOOL_SIM_BACKEND", raising=False)
    assert SimulatedClock().backend.name == "greenlet"
    assert SimulatedClock(backend="threads").backend.name == "threads"
    monkeypatch.setenv("DOPOOL_SIM_BACKEND", "threads")
    assert SimulatedClock().backend.name == "threads"
    assert SimulatedClock(backend="greenlet").backend.name == "greenlet"
    monkeypatch.setenv("DOPOOL_SIM_BACKEND", "")
    assert SimulatedClock().backend.name == "greenlet"


def test_an_unknown_backend_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="backend must be one of greenlet, threads"):
        SimulatedClock(backend="fibres")
    monkeypatch.setenv("DOPOOL_SIM_BACKEND", "fibres")
    with pytest.raises(ValueError, match="'fibres'"):
        SimulatedClock()


def test_a_greenlet_runtime_starts_no_thread(tmp_path: Path) -> None:
    before = threading.active_count()
    with Runtime.simulated(tmp_path / "s", backend="greenlet") as runtime:
        pool = runtime.define("p", execute=lambda ctx: ctx.sleep(1), concurrency=4)
        pool.enqueue_many(range(8))
        assert threading.active_count() == before
        assert pool.join()
        assert runtime.clock.now() == 2.0


# -- the scheduler -----------------------------------------------------------------


def test_tasks_run_first_woken_first_and_each_until_it_parks() -> None:
    _, scheduler = green_clock()
    log: list[str] = []
    latches = {name: scheduler.latch(f"{name}'s go") for name in "abc"}

    def task(name: str) -> None:
        log.append(f"{name} starts")
        latches[name].acquire()
        log.append(f"{name} ends")

    for name in "abc":
        scheduler.spawn(lambda name=name: task(name), name)  # type: ignore[misc]
    assert log == []  # spawning only queues
    assert scheduler.drive(lambda: False, "nothing") is False
    assert log == ["a starts", "b starts", "c starts"]
    for name in "cab":  # released in this order: run in this order
        latches[name].release()
    assert log[3:] == []  # releasing only queues
    assert scheduler.drive(lambda: False, "nothing") is False
    assert log[3:] == ["c ends", "a ends", "b ends"]
    assert scheduler.idle()


def test_drive_stops_as_soon_as_what_it_waits_for_holds() -> None:
    _, scheduler = green_clock()
    log: list[str] = []
    for name in "ab":
        scheduler.spawn(lambda name=name: log.append(name), name)  # type: ignore[misc]
    assert scheduler.drive(lambda: bool(log), "a first run")
    assert log == ["a"]
    assert not scheduler.idle()
    assert scheduler.drive(lambda: False, "the rest") is False
    assert log == ["a", "b"]


def test_a_drive_past_its_deadline_stops_at_a_checkpoint_and_resumes_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task that goes on without parking hands the thread back at its checkpoint once
    the driver's deadline has passed; the driver raises TimeoutError, and the next drive
    resumes that task first: the order is the one no deadline would have given."""
    _, scheduler = green_clock()
    now = [0.0]  # the scheduler's wall clock, moved by the tasks
    monkeypatch.setattr(greenlets, "time", SimpleNamespace(monotonic=lambda: now[0]))
    log: list[str] = []

    def runs_on(name: str) -> None:
        for step in range(3):
            scheduler.checkpoint()
            log.append(f"{name}{step}")
            now[0] += 1.0

    def spawn_both() -> None:
        for name in "ab":
            scheduler.spawn(lambda name=name: runs_on(name), name)  # type: ignore[misc]

    spawn_both()
    assert scheduler.drive(None, "quiescence")  # no deadline: checkpoints do nothing
    assert log == ["a0", "a1", "a2", "b0", "b1", "b2"]

    log.clear()
    spawn_both()
    with pytest.raises(TimeoutError, match="past its deadline"):
        scheduler.drive(None, "quiescence", deadline=now[0] + 1.5)
    assert log == ["a0", "a1"]  # a parked at its third checkpoint, first in line
    assert scheduler.drive(None, "quiescence")
    assert log == ["a0", "a1", "a2", "b0", "b1", "b2"]
    spawn_both()
    with pytest.raises(TimeoutError):  # a deadline passed before it starts: nothing runs
        scheduler.drive(None, "quiescence", deadline=now[0])
    assert len(log) == 6


def test_virtual_time_moves_only_when_no_task_can_run() -> None:
    clock, scheduler = green_clock()
    log: list[tuple[str, float]] = []

    def sleeper(name: str, seconds: float) -> None:
        log.append((f"{name} sleeps", clock.now()))
        clock.sleep(seconds, name)
        log.append((f"{name} wakes", clock.now()))

    scheduler.spawn(lambda: sleeper("a", 5), "a")
    scheduler.spawn(lambda: sleeper("b", 1), "b")
    clock.run_until_idle()
    assert log == [("a sleeps", 0.0), ("b sleeps", 0.0), ("b wakes", 1.0), ("a wakes", 5.0)]
    assert clock.now() == 5.0


def test_a_deadlock_names_who_waits_for_whom() -> None:
    clock, scheduler = green_clock()
    answers = {name: scheduler.latch(f"the answer of {name}") for name in ("p:0", "q:0")}
    for me, other in (("p:0", "q:0"), ("q:0", "p:0")):
        clock.activity.sent(me)  # each has a message in hand

        def handler(me: str = me, other: str = other) -> None:
            answers[other].acquire()
            answers[me].release()

        scheduler.spawn(handler, me)
    with pytest.raises(SimulationStalledError) as raised:
        clock.run_until_idle()
    error = raised.value
    assert error.waits == (("p:0", "the answer of q:0"), ("q:0", "the answer of p:0"))
    assert "p:0 waits for the answer of q:0; q:0 waits for the answer of p:0" in str(error)
    # With a wall-clock bound, the same wait times out at once: nothing can end it.
    with pytest.raises(TimeoutError):
        clock.step(deadline=0.0)


def test_a_latch_waited_for_from_the_driver_runs_the_tasks() -> None:
    _, scheduler = green_clock()
    latch = scheduler.latch("the answer of p:0")
    scheduler.spawn(latch.release, "p:0")
    assert latch.acquire()
    assert latch.acquire(timeout=0)  # it stays open


def test_a_latch_nothing_opens_times_out_at_once_or_names_the_stall() -> None:
    _, scheduler = green_clock()
    latch = scheduler.latch("the answer of p:0")
    assert latch.acquire(timeout=5) is False
    with pytest.raises(SimulationStalledError, match="the caller waits for the answer of p:0"):
        latch.acquire()


def test_a_task_may_not_drive_the_clock() -> None:
    clock, scheduler = green_clock()
    caught: list[BaseException] = []

    def driving() -> None:
        try:
            clock.run_until(5)
        except RuntimeError as exc:
            caught.append(exc)

    scheduler.spawn(driving, "p:0")
    clock.run_until_idle()
    assert len(caught) == 1
    assert "cannot be driven from a handler" in str(caught[0])


def test_the_clock_is_driven_from_the_thread_that_made_it() -> None:
    clock, _ = green_clock()
    caught: list[BaseException] = []

    runner = clock.backend.runner
    assert runner is not None

    def elsewhere() -> None:
        try:
            runner.spawn(lambda: None, "p:0")
        except RuntimeError as exc:
            caught.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(caught) == 1
    assert "on the thread that made it" in str(caught[0])


def test_the_clock_refuses_a_step_from_another_thread_and_fires_nothing() -> None:
    clock, _ = green_clock()
    fired: list[float] = []
    clock.call_at(1.0, lambda: fired.append(clock.now()))
    caught: list[BaseException] = []

    def elsewhere() -> None:
        try:
            clock.step()
        except RuntimeError as exc:
            caught.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(caught) == 1
    assert "on the thread that made it" in str(caught[0])
    assert fired == []
    assert clock.next_time() == 1.0
    assert clock.step()  # the thread that made it still drives it
    assert fired == [1.0]


def test_task_local_attributes_are_each_tasks_own() -> None:
    _, scheduler = green_clock()
    local: Any = TaskLocal()
    local.instance = "driver"
    seen: list[object] = []
    go = scheduler.latch("go")

    def task(name: str) -> None:
        seen.append(getattr(local, "instance", None))
        local.instance = name
        go.acquire()
        seen.append(local.instance)

    scheduler.spawn(lambda: task("a"), "a")
    scheduler.spawn(lambda: task("b"), "b")
    scheduler.drive(lambda: False, "nothing")
    go.release()
    scheduler.drive(lambda: False, "nothing")
    assert seen == [None, None, "a", "b"]
    assert local.instance == "driver"


# -- a runtime on it ---------------------------------------------------------------


def test_a_call_that_needs_virtual_time_says_so_instead_of_hanging(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "s", backend="greenlet") as runtime:
        pool = runtime.define("p", execute=lambda ctx: ctx.sleep(30))
        pool.enqueue("x")
        simulated(runtime).advance(1)  # the handler sleeps until t=30
        with pytest.raises(SimulationStalledError) as raised:
            pool.pause()
        error = raised.value
        assert error.cause == "the caller waits for the answer of p:0"
        assert error.waits == (("p:0", "virtual time to reach t=30 (asleep in its handler)"),)
        assert any("next has work at t=30" in note for note in error.notes)
        assert pool.join()  # driving the clock ends the sleep; the pause is answered
        assert pool.status().instance(0).state == "paused"


def test_define_returns_when_the_first_recovery_loops(tmp_path: Path) -> None:
    """tests/engine/test_restart_backoff.py's test of the same, on one thread."""
    leave_an_interrupted_attempt(tmp_path / "s", "p")  # define recovers it
    runtime = Runtime.simulated(
        tmp_path / "s", faults=FaultPlan(seed=0, storage_error=0.99), backend="greenlet"
    )
    with runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        assert pool.status().instance(0).state == "restarting"
        while pool.status().instance(0).state == "restarting":
            assert simulated(runtime).step()
        assert pool.status().instance(0).state == "idle"


def test_a_handler_calling_another_pool_parks_until_it_answers(tmp_path: Path) -> None:
    """Even while that pool's instance sleeps in virtual time: no task can run, so time
    moves on (under threads the caller's wait would keep the clock from moving)."""
    with Runtime.simulated(tmp_path / "s", backend="greenlet") as runtime:
        seen: list[str] = []

        def slow(ctx: EventContext) -> None:
            ctx.sleep(5)
            seen.append(f"slow {ctx.event} at {runtime.clock.now():g}")

        sink = runtime.define("sink", execute=slow)

        def source(ctx: EventContext) -> None:
            sink.enqueue(ctx.event)  # the sink's handler holds its turn: a message, waited for
            seen.append(f"source {ctx.event} at {runtime.clock.now():g}")

        pool = runtime.define("source", execute=source)
        sink.enqueue("first")
        pool.enqueue("second")
        assert pool.join()
        assert sink.join()
        assert seen == ["slow first at 5", "source second at 5", "slow second at 10"]


def run_traced(tmp_path: Path, backend: str) -> list[str]:
    lines: list[str] = []

    def handler(ctx: EventContext) -> None:
        ctx.sleep(0.5 + ctx.sequence % 3)
        if ctx.event % 7 == 0 and ctx.attempt == 1:
            raise RuntimeError("flaky")
        if ctx.event % 5 == 0:
            ctx.enqueue(ctx.event + 1000, partition_key=str(ctx.event))

    plan = FaultPlan(seed=4, crash_after_execute=0.05)
    with Runtime.simulated(tmp_path / backend, seed=9, faults=plan, backend=backend) as rt:
        rt.subscribe(lambda event: lines.append(repr(_stable(event))))
        pool = rt.define("p", execute=handler, concurrency=3)
        for number in range(40):
            pool.enqueue(number, partition_key=str(number % 5))
            if number % 10 == 9:
                # Driven until idle: a call to an instance asleep in its handler would
                # hang under threads (and raise under greenlets).
                assert pool.join()
    return lines


def _stable(event: PoolEvent) -> tuple[object, ...]:
    return (event.kind, event.time, event.instance_index, event.sequence, event.attempt)


def test_both_backends_give_the_same_run(tmp_path: Path) -> None:
    threads = run_traced(tmp_path, "threads")
    assert threads == run_traced(tmp_path, "greenlet")
    assert any("crashed" in line for line in threads)


SCENARIOS = ["steady", "crash-storm", "poison", "examples/cloudflare-alarms.toml"]
SCENARIOS.append("examples/thumbnails/scenario.toml")  # --app handlers


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_dopool_simulate_gives_the_same_bytes_under_both_backends(
    scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from dopool._cli import cli

    monkeypatch.chdir(Path(__file__).parents[2])  # the scenario files are named relative to here
    outputs = []
    for backend in ("threads", "greenlet"):
        monkeypatch.setenv("DOPOOL_SIM_BACKEND", backend)
        json_path, trace_path = tmp_path / f"{backend}.json", tmp_path / f"{backend}.jsonl"
        args = ["simulate", "--scenario", scenario, "-q", "--events", "300", "--seed", "5"]
        args += ["--json", str(json_path), "--trace", str(trace_path)]
        done = CliRunner().invoke(cli, args)
        assert done.exit_code == 0, done.output
        outputs.append((json_path.read_bytes(), trace_path.read_bytes()))
    assert outputs[0] == outputs[1]


def test_instances_waiting_for_ever_are_a_named_stall_and_close_still_closes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Something an instance waits for that nothing will bring (here a latch nobody
    opens, standing in for any wait the wait-for graph cannot see): under threads the
    run would hang; here driving the clock says who waits for what, and ``close``
    abandons the instance, as it does one still running at exit."""
    runtime = Runtime.simulated(tmp_path / "s", backend="greenlet")
    never = runtime.clock.backend.latch("a latch nobody opens")
    pool = runtime.define("p", execute=lambda ctx: never.acquire())
    pool.enqueue("x")
    with pytest.raises(SimulationStalledError) as raised:
        simulated(runtime).run_until_idle()
    assert raised.value.waits == (("p:0", "a latch nobody opens"),)
    assert "a deadlock" in str(raised.value)
    assert not pool.join(timeout=1)  # a wall-clock bound: False at once
    runtime.close()
    assert runtime.closed
    assert "p:0" in caplog.text
    for ref in running_instances():  # the abandoned actor can never stop
        forget_instance(ref)


@pytest.mark.timeout(60, method="thread")  # a hang ends the process: red
@pytest.mark.parametrize("backend", ["greenlet", "threads"])
@pytest.mark.parametrize("shape", ["one instance", "two instances"])
def test_join_gives_up_at_its_timeout_while_handlers_enqueue_for_ever(
    tmp_path: Path, backend: str, shape: str
) -> None:
    """Handlers that never stop enqueueing follow-ups (a bug of the user's): each event
    starts the next at the same virtual time, one instance's in one message, or two
    instances' handed back and forth (round robin). ``join``'s timeout is wall-clock
    under either clock: it returns False then, and the runtime still closes."""
    runtime = Runtime.simulated(tmp_path / "s", backend=backend)
    ran: list[int] = []
    concurrency = 1 if shape == "one instance" else 2

    def handler(ctx: EventContext) -> None:
        ran.append(ctx.instance_index)
        ctx.enqueue("again")

    pool = runtime.define("p", execute=handler, concurrency=concurrency)
    pool.enqueue("first")
    assert not pool.join(timeout=0.2)
    assert len(ran) > 1
    assert set(ran) == set(range(concurrency))
    assert simulated(runtime).now() == 0.0  # no virtual time passed: a livelock
    runtime.close()
    assert runtime.closed


@pytest.mark.timeout(60, method="thread")  # a hang ends the process: red
@pytest.mark.parametrize("backend", ["greenlet", "threads"])
def test_join_and_close_give_up_on_an_async_handler_that_never_sleeps(
    tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An async handler that awaits only what is ready (``asyncio.sleep(0)`` in a loop that
    never ends) takes no virtual time and, under greenlets, never parks: ``join``'s and
    ``close``'s wall-clock bounds hold all the same. The instance is abandoned, as one
    whose handler never returns is under a real clock, and its attempt counts as
    interrupted when the store is opened again: the event runs then, lost nowhere."""
    runtime = Runtime.simulated(tmp_path / "s", backend=backend)
    # Set at the end, so that the abandoned handler's thread (threads backend) stops
    # spinning; an abandoned task (greenlets) never runs again to see it.
    over = threading.Event()

    async def spins(ctx: EventContext) -> None:
        while not over.is_set():
            await asyncio.sleep(0)

    try:
        pool = runtime.define("p", execute=spins)
        pool.enqueue("x")
        assert not pool.join(timeout=0.2)
        runtime.close(timeout=0.2)
        assert runtime.closed
        assert "p:0 still running after the grace period" in caplog.text
    finally:
        over.set()  # (after close: it found the handler running)
        for ref in running_instances():  # the abandoned actor can never stop
            forget_instance(ref)

    attempts: list[int] = []
    with Runtime.simulated(tmp_path / "s", backend=backend) as again:
        retried = again.define(
            "p",
            execute=lambda ctx: attempts.append(ctx.attempt),
            retry=RetryPolicy(max_attempts=2, initial_delay=0.0),
        )
        assert retried.join(timeout=10)
        assert attempts == [2]
        assert retried.status().succeeded == 1


def test_an_abandoned_task_never_runs_again() -> None:
    _, scheduler = green_clock()
    log: list[str] = []
    latch = scheduler.latch("a go")

    def task(name: str) -> None:
        log.append(f"{name} starts")
        latch.acquire()
        log.append(f"{name} ends")

    for name in "ab":
        scheduler.spawn(lambda name=name: task(name), name)  # type: ignore[misc]
    assert scheduler.drive(None, "quiescence")
    scheduler.abandon("a")
    latch.release()  # wakes both: only b is queued
    assert scheduler.drive(None, "quiescence")
    assert log == ["a starts", "b starts", "b ends"]
    assert scheduler.idle()


def test_a_call_at_callback_waits_for_an_instance_by_running_it(tmp_path: Path) -> None:
    """The callback runs on the driving thread, inside a step: its wait runs the tasks
    (a wait for an instance asleep in its handler would be a stall instead)."""
    with Runtime.simulated(tmp_path / "s", backend="greenlet") as runtime:
        pool = runtime.define("p", execute=lambda ctx: ctx.sleep(1))
        other = runtime.define("q", execute=lambda ctx: None)
        clock = simulated(runtime)
        drained: list[int] = []
        clock.call_at(5.5, lambda: drained.append(other.drain()))
        other.pause()
        other.enqueue_many(range(3))
        pool.enqueue_many(range(10))
        clock.run_until(5.5)
        assert drained == [3]
        assert pool.join()
        assert clock.now() == 10.0


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_writer_waiting_for_another_parks_rather_than_blocking_the_thread(
    tmp_path: Path, durability: str
) -> None:
    """No engine body waits, but if one did, the next writer must wait on a latch:
    a lock would block the one thread for ever (docs/design.md, "The backend")."""
    from functools import partial

    from dopool._store.environment import Store

    _, scheduler = green_clock()
    store = Store(tmp_path / "s", durability=durability, latch=partial(scheduler.latch, "w"))
    go = scheduler.latch("go")
    done: list[str] = []

    def first(txn: Any) -> None:
        txn.put(b"first", b"1")
        go.acquire()  # parks inside its transaction

    def writer(name: str, body: Any) -> None:
        store.transact(body)
        done.append(name)

    scheduler.spawn(lambda: writer("first", first), "first")
    scheduler.spawn(lambda: writer("second", lambda txn: txn.put(b"second", b"2")), "second")
    scheduler.drive(lambda: False, "the writers")
    assert done == []
    assert scheduler.waits() == [("first", "go"), ("second", "w")]
    go.release()
    scheduler.drive(lambda: False, "the writers")
    assert done == ["first", "second"]
    with store.read() as txn:
        assert (txn.get(b"first"), txn.get(b"second")) == (b"1", b"2")
    store.close()


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_one_thread_store_refuses_a_second_writer_mid_transaction(
    tmp_path: Path, durability: str
) -> None:
    """A greenlet runtime's store takes no turns (SoleCommit): a writer that found
    another's transaction open (a body that parked) gets an error, not a wait on
    LMDB's writer lock, which the thread itself holds."""
    from dopool._store.environment import Store

    _, scheduler = green_clock()
    store = Store(tmp_path / "s", durability=durability, one_thread=True)
    go = scheduler.latch("go")
    done: list[str] = []

    def first(txn: Any) -> None:
        txn.put(b"first", b"1")
        go.acquire()  # parks inside its transaction

    def writer(name: str, body: Any) -> None:
        try:
            store.transact(body)
        except RuntimeError as exc:
            done.append(f"{name}: {exc}")
        else:
            done.append(name)

    scheduler.spawn(lambda: writer("first", first), "first")
    scheduler.spawn(lambda: writer("second", lambda txn: txn.put(b"second", b"2")), "second")
    scheduler.drive(None, "the writers")
    assert done == ["second: a write transaction is already open on this thread"]
    go.release()
    scheduler.drive(None, "the writers")
    assert done[1:] == ["first"]
    with store.read() as txn:
        assert (txn.get(b"first"), txn.get(b"second")) == (b"1", None)
    store.close()


# -- Ctrl-C --------------------------------------------------------------------------


def test_ctrl_c_while_actors_run_reaches_the_driver_and_loses_nothing(sim: Runtime) -> None:
    """Under greenlets SIGINT landed in whichever task ran: a handler took its
    KeyboardInterrupt for a failure (the event dead-lettered), the engine for a crash,
    and join() went on to the end; a program could not be stopped with Ctrl-C. Now it
    reaches the driver, as under threads, promptly (not after the instance's queue)."""
    ran: list[int] = []

    def handler(ctx: EventContext) -> None:
        ran.append(ctx.event)
        if ctx.event == 5 and ctx.attempt == 1:
            signal.raise_signal(signal.SIGINT)  # as if Ctrl-C were pressed now

    pool = sim.define("p", execute=handler)
    pool.enqueue_many(list(range(1000)))
    with pytest.raises(KeyboardInterrupt):
        pool.join(timeout=10)
    if simulated(sim).backend.name == "greenlet":  # threads: the actor's thread goes on
        assert len(ran) < 1000
    assert pool.join(timeout=10)  # the runtime goes on where it stood
    assert sorted(ran) == list(range(1000))  # each once: no attempt failed or crashed
    status = pool.status()
    assert (status.succeeded, status.dead_lettered, status.instance(0).restarts) == (1000, 0, 0)


def test_sigint_is_pythons_own_again_once_no_greenlet_clock_lives() -> None:
    before = signal.getsignal(signal.SIGINT)
    clock = SimulatedClock(backend="greenlet")
    if before is signal.default_int_handler:
        assert signal.getsignal(signal.SIGINT) is not before
    del clock
    gc.collect()
    assert signal.getsignal(signal.SIGINT) is before
