"""Enqueue from the caller's thread while the instance is free (``DirectEnqueue``).

A caller that finds an instance's turn free commits its enqueue itself and
publishes what it committed while still holding the turn; under the real clock,
on an idle instance, the same transaction starts the event and the actor runs
it next. A busy, killed or recovering instance gets a message instead. These
tests pin down what callers, subscribers and the store can observe of that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from pykka.messages import _ActorStop

from activation import activate, direct_path
from dopool import (
    ConfigurationError,
    DopoolError,
    EnqueueResult,
    EventContext,
    InstanceCrashedError,
    PoolClosedError,
    PoolEvent,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    WorkerPool,
)
from dopool._clock.threads import Inbox
from dopool._engine.actor import InstanceActor
from dopool._engine.mailbox import Mailbox
from dopool._engine.messages import Control, HandedOff, Recover
from dopool._machine.machine import QueueMachine
from dopool._machine.types import Pause, Resume
from dopool._retry import uniform_draw
from dopool._store.layout import Meta, Namespace
from dopool._store.txn import Txn
from dopool.chaos import FaultPlan

TIMEOUT = 10.0
LIFECYCLE = ("enqueued", "started", "succeeded")
T = TypeVar("T")


def noop(_ctx: EventContext) -> None:
    pass


class FirstBlocks:
    """A handler that blocks on the event ``"first"`` until ``release`` is set."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.release = threading.Event()

    def __call__(self, ctx: EventContext) -> None:
        if ctx.event == "first":
            self.running.set()
            assert self.release.wait(TIMEOUT)


def enqueue_behind_first(
    pool: WorkerPool, first: FirstBlocks, meanwhile: Callable[[], object] = lambda: None
) -> EnqueueResult:
    """Enqueue ``"second"`` from another thread while the handler of ``"first"`` runs.

    Checks that the call waits for the handler (docs/api.md, "Methods") and stores
    nothing meanwhile, then lets the handler finish; returns the call's result.
    ``meanwhile`` runs once the handler has started, before the call is made.
    """
    pool.enqueue("first")
    assert first.running.wait(TIMEOUT)
    meanwhile()
    with ThreadPoolExecutor(1) as executor:
        try:
            second = executor.submit(pool.enqueue, "second")
            done, _ = wait([second], timeout=0.05)
            assert not done  # docs/api.md, "Methods": a call waits while the handler runs
            assert pool.status().enqueued == 1
        finally:
            first.release.set()
        return second.result(TIMEOUT)


def call_with_timeout(call: Callable[[], T]) -> T:
    """``call()`` on another thread: a deadlock fails the test instead of hanging it."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future.result(TIMEOUT)


def lifecycle(seen: list[PoolEvent], index: int = 0) -> list[tuple[str, int | None]]:
    return [
        (event.kind, event.sequence)
        for event in seen
        if event.instance_index == index and event.kind in LIFECYCLE
    ]


# -- under the real clock -----------------------------------------------------------


@pytest.mark.threaded
def test_an_enqueue_on_an_idle_instance_starts_its_event_in_the_same_commit(
    tmp_path: Path,
) -> None:
    running, release = threading.Event(), threading.Event()
    seen: list[tuple[PoolEvent, threading.Thread]] = []
    contexts: list[tuple[EventContext, threading.Thread]] = []

    def blocked(ctx: EventContext) -> None:
        contexts.append((ctx, threading.current_thread()))
        running.set()
        assert release.wait(TIMEOUT)

    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(lambda event: seen.append((event, threading.current_thread())))
        pool = runtime.define("p", execute=blocked)
        activate(pool)  # running: a caller enqueues directly

        try:
            result = pool.enqueue("x")
            # Read as soon as enqueue returns: the start committed with the event.
            instance = pool.status().instance(0)
            assert (instance.state, instance.current_sequence, instance.attempt) == (
                "processing",
                0,
                1,
            )
            assert (instance.enqueued, instance.pending) == (1, 1)
            assert running.wait(TIMEOUT)
        finally:
            release.set()
        assert pool.join(timeout=TIMEOUT)

    assert result == EnqueueResult(0, 0, "p:0", 0)
    [(ctx, handler_thread)] = contexts
    assert ctx.started_at == ctx.enqueued_at  # one transaction, one clock reading
    assert handler_thread is not threading.current_thread()  # the actor runs the handler
    kinds = [(event.kind, event.sequence) for event, _ in seen if event.kind in LIFECYCLE]
    assert kinds == [("enqueued", 0), ("started", 0), ("succeeded", 0)]
    threads = {event.kind: thread for event, thread in seen}
    assert threads["enqueued"] is threading.current_thread()  # published by the caller
    assert threads["started"] is handler_thread


@pytest.mark.threaded
def test_an_enqueue_on_a_paused_instance_starts_nothing(tmp_path: Path) -> None:
    executed: list[Any] = []
    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=lambda ctx: executed.append(ctx.event))
        pool.pause()

        pool.enqueue("x")
        instance = pool.status().instance(0)
        assert (instance.state, instance.current_sequence, instance.attempt) == ("paused", None, 0)
        assert instance.next_alarm_at is None

        pool.resume()
        assert pool.join(timeout=TIMEOUT)
    assert executed == ["x"]


@pytest.mark.threaded
def test_each_event_is_enqueued_then_started_then_succeeded(tmp_path: Path) -> None:
    seen: list[PoolEvent] = []
    executed: list[int] = []
    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=lambda ctx: executed.append(ctx.event), concurrency=2)
        for n in range(20):
            pool.enqueue(n)
            assert pool.join(timeout=TIMEOUT)  # each enqueue finds its instance idle
        status = pool.status()

    assert executed == list(range(20))
    for index in range(2):
        expected = [(kind, sequence) for sequence in range(10) for kind in LIFECYCLE]
        assert lifecycle(seen, index) == expected
    assert (status.enqueued, status.succeeded, status.pending) == (20, 20, 0)


@pytest.mark.threaded
def test_concurrent_producers_see_every_event_through_its_lifecycle_in_order(
    tmp_path: Path,
) -> None:
    producers, per_producer, concurrency = 4, 50, 2
    seen: list[PoolEvent] = []
    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=noop, concurrency=concurrency)

        def produce(producer: int) -> list[EnqueueResult]:
            return [pool.enqueue((producer, n)) for n in range(per_producer)]

        with ThreadPoolExecutor(producers) as executor:
            results = [r for batch in executor.map(produce, range(producers)) for r in batch]
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()

    total = producers * per_producer
    assert (status.enqueued, status.succeeded, status.dead_lettered) == (total, total, 0)
    for index in range(concurrency):
        sequences = sorted(r.sequence for r in results if r.instance_index == index)
        assert sequences == list(range(len(sequences)))
        trace = lifecycle(seen, index)
        assert sorted(trace) == sorted((kind, s) for s in sequences for kind in LIFECYCLE)
        place = {step: position for position, step in enumerate(trace)}
        for s in sequences:
            assert place["enqueued", s] < place["started", s] < place["succeeded", s]
            if s:
                assert place["succeeded", s - 1] < place["started", s]  # one at a time, FIFO


@pytest.mark.threaded
def test_enqueue_then_close_never_leaves_a_started_attempt_behind(tmp_path: Path) -> None:
    """An attempt the enqueue started must run before the runtime stops.

    Left started, the next open's recovery would count it as a crash, and with
    ``retry=None`` dead-letter it. Odd rounds close from another thread as the
    enqueue begins (it then mostly commits while the close is under way, and the
    actor is told to run the attempt too late); such an enqueue may be refused,
    but is never half done.
    """
    path = tmp_path / "store"
    rounds = 100
    acknowledged = 0
    for n in range(rounds):
        runtime = Runtime(path)
        pool = runtime.define("p", execute=noop)  # retry=None: a crashed attempt is dead
        together = threading.Barrier(2 if n % 2 else 1)

        def close(runtime: Runtime = runtime, together: threading.Barrier = together) -> None:
            together.wait(TIMEOUT)
            runtime.close()

        closer = threading.Thread(target=close)
        if n % 2:
            closer.start()
        together.wait(TIMEOUT)
        try:
            pool.enqueue(n)
        except PoolClosedError:
            pass
        else:
            acknowledged += 1
        if not n % 2:
            closer.start()
        closer.join(TIMEOUT)
        assert not closer.is_alive()

    with Runtime(path) as runtime:
        pool = runtime.define("p", execute=noop)
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()
        dead = pool.dead_letters()
    assert dead == []
    assert acknowledged >= rounds // 2
    assert (status.enqueued, status.succeeded) == (acknowledged, acknowledged)
    assert (status.dead_lettered, status.pending) == (0, 0)
    assert status.instance(0).restarts == 0


@pytest.mark.threaded
def test_an_attempt_started_while_the_runtime_closes_runs_before_the_actor_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nudge to run it is refused once the mailbox is closed: ``on_stop`` runs it."""
    path = tmp_path / "store"
    closed = threading.Event()
    close_mailbox = Mailbox.close

    def close(mailbox: Mailbox) -> Any:
        ref = close_mailbox(mailbox)
        closed.set()
        return ref

    refused: list[type] = []
    send = Mailbox.send

    def spy(mailbox: Mailbox, message: Any) -> bool:
        sent = send(mailbox, message)
        if not sent:
            refused.append(type(message))
        return sent

    monkeypatch.setattr(Mailbox, "close", close)
    monkeypatch.setattr(Mailbox, "send", spy)
    executed: list[Any] = []
    runtime = Runtime(path)
    pool = runtime.define("p", execute=lambda ctx: executed.append(ctx.event))
    activate(pool)  # running: a caller enqueues directly
    caller = threading.current_thread()
    closer = threading.Thread(target=runtime.close)

    def close_during_publish(event: PoolEvent) -> None:
        # In the caller's thread, after the commit, before the attempt is handed over.
        if event.kind == "enqueued" and threading.current_thread() is caller:
            closer.start()
            assert closed.wait(TIMEOUT)

    runtime.subscribe(close_during_publish)
    result = pool.enqueue("x")
    closer.join(TIMEOUT)
    assert not closer.is_alive()
    assert result.sequence == 0
    assert refused == [HandedOff]  # the premise: the actor was never told to run it
    assert executed == ["x"]

    monkeypatch.undo()
    with Runtime(path) as again:
        pool = again.define("p", execute=noop)
        activate(pool)  # running: a caller enqueues directly
        status = pool.status()
    assert (status.enqueued, status.succeeded, status.dead_lettered, status.pending) == (1, 1, 0, 0)


@pytest.mark.threaded
def test_an_enqueue_while_the_handler_runs_waits_for_it_then_is_stored(tmp_path: Path) -> None:
    first = FirstBlocks()
    seen: list[PoolEvent] = []

    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=first)
        result = enqueue_behind_first(pool, first)
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()

    assert result == EnqueueResult(1, 0, "p:0", 0)  # stored after "first" left the queue
    assert lifecycle(seen) == [(kind, s) for s in (0, 1) for kind in LIFECYCLE]
    assert (status.enqueued, status.succeeded) == (2, 2)


@pytest.mark.threaded
def test_an_enqueue_after_kill_comes_after_the_crash_and_the_recovery(tmp_path: Path) -> None:
    seen: list[PoolEvent] = []
    rounds = 10
    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=noop)
        for n in range(rounds):
            runtime.kill("p", 0)
            assert pool.enqueue(n).sequence == n
            assert pool.join(timeout=TIMEOUT)
        status = pool.status()

    kinds = [event.kind for event in seen if event.kind in ("crashed", "recovered", "enqueued")]
    assert kinds == ["crashed", "recovered", "enqueued"] * rounds
    instance = status.instance(0)
    assert (instance.restarts, instance.succeeded, instance.dead_lettered) == (rounds, rounds, 0)


@pytest.mark.threaded
def test_an_enqueue_after_killing_a_running_instance_waits_for_its_recovery(
    tmp_path: Path,
) -> None:
    first = FirstBlocks()
    seen: list[PoolEvent] = []

    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=first)
        # The kill lands when the handler returns, before its outcome commits.
        result = enqueue_behind_first(pool, first, lambda: runtime.kill("p", 0))
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()
        dead = pool.dead_letters()

    assert result.sequence == 1
    kinds = [e.kind for e in seen if e.kind in ("crashed", "recovered", "enqueued")]
    assert kinds == ["enqueued", "crashed", "recovered", "enqueued"]
    instance = status.instance(0)
    # retry=None: the interrupted attempt is dead; the one enqueued after the kill ran.
    assert (instance.restarts, instance.dead_lettered, instance.succeeded) == (1, 1, 1)
    assert [d.event for d in dead] == ["first"]


@pytest.mark.threaded
def test_close_returns_when_a_killed_instance_crashes_while_it_waits(tmp_path: Path) -> None:
    """close()'s stop request, drained by the crash into a closed mailbox, still gets its answer."""
    running, release = threading.Event(), threading.Event()

    def blocked(_ctx: EventContext) -> None:
        running.set()
        assert release.wait(TIMEOUT)

    runtime = Runtime(tmp_path / "store")
    pool = runtime.define("p", execute=blocked)
    pool.enqueue("x")
    assert running.wait(TIMEOUT)
    runtime.kill("p", 0)  # crashes when the handler returns
    ref = pool._instances.cells[0].mailbox._ref
    assert ref is not None
    inbox = cast(Inbox, ref.actor_inbox)  # the instance's own (see InstanceActor)
    closer = threading.Thread(target=runtime.close, daemon=True)
    try:
        closer.start()
        # close's stop request queues behind the kill
        stopping = inbox.wait_for(
            lambda waiting: any(isinstance(m, _ActorStop) for m in waiting), TIMEOUT
        )
        assert stopping
    finally:
        release.set()
    closer.join(1.0)  # a fixed engine closes in milliseconds once the handler returns
    assert not closer.is_alive(), "Runtime.close() hung"


@pytest.mark.threaded
def test_an_enqueue_before_the_restarted_instance_recovered_waits_for_the_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The successor's turn is free before its recovery takes it: callers must not use it."""
    recovering, proceed = threading.Event(), threading.Event()
    on_receive = InstanceActor.on_receive

    def recovery_held(actor: InstanceActor, message: Any) -> None:
        if isinstance(message, Recover) and message.restarts:
            recovering.set()
            assert proceed.wait(TIMEOUT)
        on_receive(actor, message)

    monkeypatch.setattr(InstanceActor, "on_receive", recovery_held)
    seen: list[PoolEvent] = []
    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=noop)
        activate(pool)  # running: a caller enqueues directly
        runtime.kill("p", 0)
        with ThreadPoolExecutor(1) as executor:
            try:
                assert recovering.wait(TIMEOUT)  # the successor is in place, not recovered
                turn = direct_path(pool, 0)._memory.turn
                turn.acquire()  # once the dead incarnation has let go of it,
                turn.release()  # the turn is free, and the kill flag is the successor's
                enqueue = executor.submit(pool.enqueue, "x")
                done, _ = wait([enqueue], timeout=0.05)
                assert not done
            finally:
                proceed.set()
            assert enqueue.result(TIMEOUT).sequence == 0
        assert pool.join(timeout=TIMEOUT)

    kinds = [event.kind for event in seen if event.kind in ("crashed", "recovered", "enqueued")]
    assert kinds == ["crashed", "recovered", "enqueued"]


@pytest.mark.threaded
def test_a_direct_enqueue_behind_waiting_messages_does_not_start_its_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages sent before the enqueue go first: it starts nothing ahead of them."""
    pausing, proceed, resume_sent = threading.Event(), threading.Event(), threading.Event()
    on_receive = InstanceActor.on_receive
    send = Mailbox.send

    def pause_held(actor: InstanceActor, message: Any) -> None:
        if isinstance(message, Control) and isinstance(message.request, Pause):
            pausing.set()
            assert proceed.wait(TIMEOUT)
        on_receive(actor, message)

    def spy(mailbox: Mailbox, message: Any) -> bool:
        sent = send(mailbox, message)
        if isinstance(message, Control) and isinstance(message.request, Resume):
            resume_sent.set()
        return sent

    monkeypatch.setattr(InstanceActor, "on_receive", pause_held)
    monkeypatch.setattr(Mailbox, "send", spy)
    executed: list[Any] = []
    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=lambda ctx: executed.append(ctx.event))
        with ThreadPoolExecutor(2) as executor:
            try:
                paused = executor.submit(pool.pause, 0)
                assert pausing.wait(TIMEOUT)  # taken from the inbox; the turn is not taken yet
                resumed = executor.submit(pool.resume, 0)
                assert resume_sent.wait(TIMEOUT)  # waiting in the inbox
                pool.enqueue("x")  # the turn is free: stored from this thread
                instance = pool.status().instance(0)
                assert (instance.state, instance.pending, instance.attempt) == ("idle", 1, 0)
            finally:
                proceed.set()
            paused.result(TIMEOUT)
            resumed.result(TIMEOUT)
        assert pool.join(timeout=TIMEOUT)
    assert executed == ["x"]


@pytest.mark.threaded
def test_an_instance_takes_direct_enqueues_again_after_a_crash(tmp_path: Path) -> None:
    seen: list[tuple[PoolEvent, threading.Thread]] = []
    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(lambda event: seen.append((event, threading.current_thread())))
        pool = runtime.define("p", execute=noop, retry=RetryPolicy(initial_delay=0.01))
        runtime.kill("p", 0)
        pool.enqueue("after the kill")
        assert pool.join(timeout=TIMEOUT)
        pool.enqueue("later")
        assert pool.join(timeout=TIMEOUT)

    enqueued = [thread for event, thread in seen if event.kind == "enqueued"]
    assert len(enqueued) == 2
    assert enqueued[1] is threading.current_thread()  # recovered: stored by the caller again


# -- under a SimulatedClock -----------------------------------------------------------


def test_a_direct_enqueue_under_a_simulated_clock_starts_nothing_until_driven(
    sim: Runtime,
) -> None:
    executed: list[Any] = []
    pool = sim.define("p", execute=lambda ctx: executed.append(ctx.event))

    pool.enqueue("x")
    instance = pool.status().instance(0)
    assert (instance.state, instance.pending, instance.attempt) == ("idle", 1, 0)
    assert instance.next_alarm_at == 0.0
    assert executed == []

    assert pool.join(timeout=TIMEOUT)
    assert executed == ["x"]


def crashed_errors(seen: list[PoolEvent]) -> list[str | None]:
    return [event.error for event in seen if event.kind == "crashed"]


def test_a_crash_during_a_direct_enqueue_stores_nothing_and_recovers_before_raising(
    tmp_path: Path,
) -> None:
    plan = FaultPlan(crash_during_enqueue=1.0)
    with Runtime(tmp_path, clock=SimulatedClock(), seed=0, faults=plan) as runtime:
        seen: list[PoolEvent] = []
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=noop)
        for round_ in range(1, 4):
            with pytest.raises(InstanceCrashedError):
                pool.enqueue(round_)
            # Under a simulated clock the recovery committed before the error was raised.
            instance = pool.status().instance(0)
            assert (instance.restarts, instance.enqueued, instance.pending) == (round_, 0, 0)
            assert instance.next_alarm_at is None

    assert [event.kind for event in seen] == ["activated", *["crashed", "recovered"] * 3]
    assert crashed_errors(seen) == ["crash_during_enqueue"] * 3


def seed_where(point: str, probability: float, fires: set[int], visits: int) -> int:
    """A FaultPlan seed under which pool p's instance 0 fails ``point`` at exactly ``fires``."""
    return next(
        seed
        for seed in range(100_000)
        if all(
            (uniform_draw(seed, "p", 0, point, visit) < probability) == (visit in fires)
            for visit in range(1, visits + 1)
        )
    )


@pytest.mark.parametrize(
    ("fault", "probability", "visits"),
    [
        ("crash_during_enqueue", 0.5, 2),
        # Writes: 1 the enqueue (fails; the first recovery wrote nothing, so drew nothing),
        # 2 the restart's recovery, 3 the next enqueue, then that event's start and outcome.
        ("storage_error", 0.3, 7),
    ],
)
def test_a_fault_in_a_direct_enqueue_rolls_it_back_and_the_next_enqueue_runs(
    tmp_path: Path, fault: str, probability: float, visits: int
) -> None:
    fails = 1  # the visit that is the first enqueue
    seed = seed_where(fault, probability, fires={fails}, visits=visits)
    plan = FaultPlan(seed=seed, **{fault: probability})
    executed: list[Any] = []
    with Runtime(tmp_path, clock=SimulatedClock(), seed=0, faults=plan) as runtime:
        seen: list[PoolEvent] = []
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=lambda ctx: executed.append(ctx.event))

        with pytest.raises(InstanceCrashedError):
            pool.enqueue("lost")
        instance = pool.status().instance(0)
        assert (instance.restarts, instance.enqueued, instance.pending) == (1, 0, 0)

        assert pool.enqueue("kept") == EnqueueResult(0, 0, "p:0", 0)
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()

    assert crashed_errors(seen) == [fault]
    assert [event.kind for event in seen][:4] == ["activated", "crashed", "recovered", "enqueued"]
    assert executed == ["kept"]
    assert (status.enqueued, status.succeeded, status.dead_lettered) == (1, 1, 0)
    assert status.instance(0).restarts == 1


def test_a_subscriber_enqueuing_to_the_publishing_instance_is_refused_not_deadlocked(
    sim: Runtime,
) -> None:
    pool = sim.define("p", execute=noop)
    activate(pool)  # running: a caller enqueues directly
    running_in_subscriber: list[tuple[str, int] | None] = []
    refused: list[Exception] = []

    def subscriber(event: PoolEvent) -> None:
        if event.kind != "enqueued":
            return
        running_in_subscriber.append(sim.handler_running())
        try:
            pool.enqueue("from the subscriber")
        except ConfigurationError as exc:
            refused.append(exc)

    sim.subscribe(subscriber)
    try:
        result = call_with_timeout(lambda: pool.enqueue("x"))
    except TimeoutError:
        direct_path(pool, 0)._memory.turn.release()  # unblock the actor, so the runtime can close
        pytest.fail("a subscriber's enqueue to the publishing instance deadlocked")

    assert result.sequence == 0
    assert running_in_subscriber == [("p", 0)]
    assert len(refused) == 1
    assert sim.handler_running() is None  # the caller's thread is itself again
    assert pool.status().enqueued == 1
    assert pool.join(timeout=TIMEOUT)
    assert pool.status().succeeded == 1


def test_a_subscriber_may_enqueue_to_another_pool_during_a_direct_publish(sim: Runtime) -> None:
    first = sim.define("p", execute=noop)
    activate(first)  # running: a caller enqueues directly
    other = sim.define("q", execute=noop)
    activate(other)  # running: a caller enqueues directly
    running: list[tuple[str, int] | None] = []

    def subscriber(event: PoolEvent) -> None:
        running.append(sim.handler_running())
        if event.kind == "enqueued" and event.pool == "p":
            other.enqueue(("follow", event.sequence))
            running.append(sim.handler_running())

    sim.subscribe(subscriber)
    call_with_timeout(lambda: first.enqueue("x"))

    # p's publish, q's nested publish, then p's again once q's enqueue returned.
    assert running == [("p", 0), ("q", 0), ("p", 0)]
    assert sim.handler_running() is None
    assert (first.status().enqueued, other.status().enqueued) == (1, 1)


def test_a_rolled_back_transaction_leaves_the_stored_meta_to_the_next_one(sim: Runtime) -> None:
    """An instance reuses the meta its last commit saved, but never one a failed body changed."""
    pool = sim.define("p", execute=noop)
    pool.pause()
    pool.enqueue("first")
    instance = direct_path(pool, 0)
    memory = instance._memory

    def stored() -> Meta:
        with sim._store.read() as txn:
            return Namespace("p", 0).load_meta(txn)

    def known() -> Meta | None:
        return memory.meta

    assert known() == stored()  # what the enqueue's commit saved

    def body(txn: Txn) -> None:
        meta = instance._load_meta(txn)
        meta.tail += 100
        meta.pending += 100
        instance._save_meta(txn, meta)
        raise DopoolError("rolled back")

    with memory.turn, pytest.raises(DopoolError, match="rolled back"):
        instance._transact(body)
    assert known() is None  # nothing known: the next transaction reads the store

    assert pool.enqueue("second").sequence == 1
    assert known() == stored()
    status = pool.status().instance(0)
    assert (status.enqueued, status.pending) == (2, 2)


@pytest.mark.threaded
def test_the_enqueues_waiting_behind_a_handler_share_its_outcome_and_nothing_overtakes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcome's transaction takes the run of enqueues at the inbox head, up to a pause."""
    taken: list[int] = []  # how many enqueues each transaction stored
    accept = QueueMachine.accept

    def counted(machine: QueueMachine, txn: Txn, meta: Meta, batches: Any, *args: Any) -> None:
        batches = list(batches)
        taken.append(len(batches))
        accept(machine, txn, meta, batches, *args)

    first = FirstBlocks()
    seen: list[PoolEvent] = []
    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=first)
        pool.enqueue("first")
        assert first.running.wait(TIMEOUT)
        monkeypatch.setattr(QueueMachine, "accept", counted)
        ref = pool._instances.cells[0].mailbox._ref
        assert ref is not None
        inbox = cast(Inbox, ref.actor_inbox)  # the instance's own (see InstanceActor)

        def waiting(count: int) -> None:
            assert inbox.wait_for(lambda messages: len(messages) >= count, TIMEOUT)

        with ThreadPoolExecutor(5) as executor:
            try:
                early = [executor.submit(pool.enqueue, f"early {n}") for n in range(3)]
                waiting(3)
                pausing = executor.submit(pool.pause)
                waiting(4)
                late = executor.submit(pool.enqueue, "late")
                waiting(5)
            finally:
                first.release.set()
            sequences = sorted(future.result(TIMEOUT).sequence for future in early)
            pausing.result(TIMEOUT)
            late_sequence = late.result(TIMEOUT).sequence
        instance = pool.status().instance(0)

    assert taken == [3, 1]  # the three with the outcome of "first"; "late" after the pause
    assert sequences == [1, 2, 3]
    assert late_sequence == 4
    kinds = [event.kind for event in seen if event.kind in ("enqueued", "paused")]
    assert kinds == ["enqueued"] * 4 + ["paused", "enqueued"]
    assert (instance.state, instance.pending, instance.succeeded) == ("paused", 4, 1)
