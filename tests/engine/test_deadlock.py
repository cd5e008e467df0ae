"""Calls between instances that would wait for each other in a cycle are refused, not hung.

Real clock, real threads: the tests wait on events and barriers with timeouts, never sleep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from activation import activate
from dopool import (
    ConfigurationError,
    DeadlockError,
    DopoolError,
    EventContext,
    PoolEvent,
    RetryPolicy,
    Runtime,
    WorkerPool,
)
from dopool._engine.mailbox import Mailbox
from dopool._engine.messages import Enqueue, Reply
from dopool._engine.wait_graph import WaitGraph

pytestmark = pytest.mark.threaded

TIMEOUT = 10.0


class Rescue:
    """Keeps every reply sent to an instance, to end a deadlock the engine did not refuse.

    Without it, a missed deadlock would hang the actors, ``close()`` and the test
    session; with it, the test fails.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.replies: list[Any] = []
        self.sent = threading.Event()  # set once an Enqueue was sent as a message
        original = Mailbox.send

        def send(mailbox: Mailbox, message: Any) -> bool:
            reply = getattr(message, "reply", None)
            if reply is not None:
                self.replies.append(reply)
            if isinstance(message, Enqueue):
                self.sent.set()
            return original(mailbox, message)

        monkeypatch.setattr(Mailbox, "send", send)

    def wait_all(self, events: dict[str, threading.Event]) -> None:
        """Wait for every event; if one does not come, break the deadlock and fail."""
        if all(event.wait(TIMEOUT) for event in events.values()):
            return
        for reply in self.replies:
            reply.fail(DopoolError("the test broke a deadlock"))
        stuck = [name for name, event in events.items() if not event.is_set()]
        pytest.fail(f"the calls deadlocked: {stuck} never finished")


def cycle_handler(
    name: str,
    pools: dict[str, WorkerPool],
    target: str,
    barrier: threading.Barrier,
    outcomes: dict[str, object],
    finished: dict[str, threading.Event],
    *,
    catch: bool,
) -> Callable[[EventContext], None]:
    """On ``"start"`` (first attempt), wait until every pool is inside its handler, then
    enqueue into the next pool, which is busy. Records what each attempt's enqueue did."""

    def handler(ctx: EventContext) -> None:
        if ctx.event != "start":
            return
        try:
            if ctx.attempt == 1:
                barrier.wait()  # every pool is inside its handler: the next one is busy
            pools[target].enqueue(("ping", name))
            outcomes[name if ctx.attempt == 1 else f"{name} retried"] = "stored"
        except DeadlockError as exc:
            outcomes[name] = exc
            if not catch:
                raise
        finally:
            finished[name].set()

    return handler


def test_two_pools_enqueuing_into_each_other_refuse_the_closing_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's handler waits for B while B's waits for A: one of them is refused at once.

    The refused handler does not catch the error: that attempt fails and is
    retried, and the retry's enqueue (nobody waits for it now) is stored.
    """
    rescue = Rescue(monkeypatch)
    names = ("a", "b")
    barrier = threading.Barrier(2, timeout=TIMEOUT)
    outcomes: dict[str, object] = {}
    first = {name: threading.Event() for name in names}
    pools: dict[str, WorkerPool] = {}
    seen: list[PoolEvent] = []
    retry = RetryPolicy(max_attempts=2, initial_delay=0.0, jitter=0.0)
    with Runtime(tmp_path / "store") as runtime:
        runtime.subscribe(seen.append)
        for name, other in (("a", "b"), ("b", "a")):
            handler = cycle_handler(name, pools, other, barrier, outcomes, first, catch=False)
            pools[name] = runtime.define(name, execute=handler, retry=retry)
        for name in names:
            pools[name].enqueue("start")
        rescue.wait_all(first)
        for pool in pools.values():
            assert pool.join(timeout=TIMEOUT)
        statuses = {name: pool.status() for name, pool in pools.items()}

    refused = [name for name in names if isinstance(outcomes[name], DeadlockError)]
    assert len(refused) == 1, outcomes
    (loser,) = refused
    winner = "b" if loser == "a" else "a"
    error = outcomes[loser]
    assert isinstance(error, DeadlockError)
    assert isinstance(error, ConfigurationError)
    assert error.cycle == (f"{loser}:0", f"{winner}:0")
    assert str(error) == (
        f"{loser}:0 would wait for {winner}:0, which waits for {loser}:0: "
        "a deadlock, so the call was not made"
    )
    # The refused attempt failed with the error and was retried; its retry stored the ping.
    retries = [e for e in seen if e.kind == "retry_scheduled"]
    assert [(e.pool, e.attempt) for e in retries] == [(loser, 1)]
    assert retries[0].error == f"DeadlockError: {error}"
    assert outcomes == {loser: error, winner: "stored", f"{loser} retried": "stored"}
    for status in statuses.values():
        assert (status.enqueued, status.succeeded, status.pending) == (2, 2, 0)


def test_a_cycle_of_three_pools_is_refused_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waits for B, B for C, C for A: the call that closes the cycle is refused."""
    rescue = Rescue(monkeypatch)
    names = ("a", "b", "c")
    following = {"a": "b", "b": "c", "c": "a"}
    barrier = threading.Barrier(3, timeout=TIMEOUT)
    outcomes: dict[str, object] = {}
    finished = {name: threading.Event() for name in names}
    pools: dict[str, WorkerPool] = {}
    with Runtime(tmp_path / "store") as runtime:
        for name in names:
            handler = cycle_handler(
                name, pools, following[name], barrier, outcomes, finished, catch=True
            )
            pools[name] = runtime.define(name, execute=handler)
        for name in names:
            pools[name].enqueue("start")
        rescue.wait_all(finished)
        for pool in pools.values():
            assert pool.join(timeout=TIMEOUT)
        statuses = {name: pool.status() for name, pool in pools.items()}
        edges_left = dict(runtime._waits._edges)

    refused = [name for name in names if isinstance(outcomes[name], DeadlockError)]
    assert len(refused) == 1, outcomes
    (loser,) = refused
    error = outcomes[loser]
    assert isinstance(error, DeadlockError)
    second = following[loser]
    third = following[second]
    assert error.cycle == (f"{loser}:0", f"{second}:0", f"{third}:0")
    assert str(error) == (
        f"{loser}:0 would wait for {second}:0, which waits for {third}:0, which waits for "
        f"{loser}:0: a deadlock, so the call was not made"
    )
    assert [outcomes[n] for n in names if n != loser] == ["stored", "stored"]
    # Nothing of the refused call was stored: its target got no ping.
    for name, status in statuses.items():
        pings = 0 if name == second else 1
        assert (status.enqueued, status.succeeded, status.pending) == (1 + pings, 1 + pings, 0)
    assert edges_left == {}  # every wait removed its edge when it ended


def test_a_subscriber_acting_for_a_nested_instance_is_part_of_the_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W's handler enqueues into idle X from its own thread; X's subscriber calls busy Y,
    whose handler calls W. That thread acts for X and still blocks W: W waits for Y too.
    """
    rescue = Rescue(monkeypatch)
    barrier = threading.Barrier(2, timeout=TIMEOUT)
    outcomes: dict[str, object] = {}
    finished = {name: threading.Event() for name in ("w", "y", "subscriber")}
    pools: dict[str, WorkerPool] = {}

    def w_handler(ctx: EventContext) -> None:
        if ctx.event == "start":
            barrier.wait()
            pools["x"].enqueue("go")  # x is idle: stored from this thread, which publishes
            finished["w"].set()

    def y_handler(ctx: EventContext) -> None:
        if ctx.event == "start":
            barrier.wait()
            try:
                pools["w"].enqueue("from y")
                outcomes["y"] = "stored"
            except DeadlockError as exc:
                outcomes["y"] = exc
            finally:
                finished["y"].set()

    def subscriber(event: PoolEvent) -> None:
        if event.kind != "enqueued" or event.pool != "x":
            return
        try:
            pools["y"].enqueue("from x's subscriber")
            outcomes["subscriber"] = "stored"
        except DeadlockError as exc:
            outcomes["subscriber"] = exc
        finally:
            finished["subscriber"].set()

    with Runtime(tmp_path / "store") as runtime:
        pools["w"] = runtime.define("w", execute=w_handler)
        pools["x"] = runtime.define("x", execute=lambda ctx: None)
        activate(pools["x"])  # running: w's handler enqueues into it directly
        pools["y"] = runtime.define("y", execute=y_handler)
        runtime.subscribe(subscriber)
        pools["w"].enqueue("start")
        pools["y"].enqueue("start")
        rescue.wait_all(finished)
        for pool in pools.values():
            assert pool.join(timeout=TIMEOUT)

    errors = {k: v for k, v in outcomes.items() if isinstance(v, DeadlockError)}
    assert len(errors) == 1, outcomes
    ((who, error),) = errors.items()
    # Whoever came second closed the cycle w:0 -> (through x:0's publish) y:0 -> w:0.
    assert error.cycle == (("y:0", "w:0") if who == "y" else ("w:0", "y:0"))


def test_a_call_into_a_busy_instance_that_waits_for_nobody_still_waits_and_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No cycle, no refusal: A's handler waits for B's handler to finish, then is stored."""
    rescue = Rescue(monkeypatch)
    b_inside = threading.Event()
    finished = {"a": threading.Event()}
    results: list[Any] = []
    pools: dict[str, WorkerPool] = {}

    def a_handler(ctx: EventContext) -> None:
        assert b_inside.wait(TIMEOUT)
        results.append(pools["b"].enqueue("from a"))
        finished["a"].set()

    def b_handler(ctx: EventContext) -> None:
        if ctx.event == "hold":
            b_inside.set()
            # Finish only once A's enqueue was sent as a message: it waited for us.
            assert rescue.sent.wait(TIMEOUT)

    with Runtime(tmp_path / "store") as runtime:
        pools["a"] = runtime.define("a", execute=a_handler)
        pools["b"] = runtime.define("b", execute=b_handler)
        pools["b"].enqueue("hold")
        pools["a"].enqueue("go")
        rescue.wait_all(finished)
        assert pools["b"].join(timeout=TIMEOUT)
        assert pools["a"].join(timeout=TIMEOUT)
        b_status, a_status = pools["b"].status(), pools["a"].status()

    assert [(r.instance_id, r.sequence) for r in results] == [("b:0", 1)]
    assert (b_status.enqueued, b_status.succeeded, b_status.dead_lettered) == (2, 2, 0)
    assert (a_status.succeeded, a_status.dead_lettered) == (1, 0)


def test_a_wait_whose_answer_came_is_over_even_before_its_thread_wakes() -> None:
    """The graph itself: an answered wait closes no cycle; an open one does, and nothing
    of the refused wait is recorded."""
    graph = WaitGraph()
    a, b, c = ("a", 0), ("b", 0), ("c", 0)
    a_waits = Reply()
    with graph.waiting((a,), b, a_waits):
        with pytest.raises(DeadlockError) as refused, graph.waiting((b,), a, Reply()):
            pytest.fail("b's wait for a closes the cycle a -> b -> a")
        assert refused.value.cycle == ("b:0", "a:0")
        with graph.waiting((c,), a, Reply()):  # c -> a -> b: a chain, no cycle
            with pytest.raises(DeadlockError) as refused, graph.waiting((b,), c, Reply()):
                pytest.fail("b -> c -> a -> b")
            assert refused.value.cycle == ("b:0", "c:0", "a:0")
        a_waits.set(None)  # b answered a; a's thread has not woken yet
        with graph.waiting((b,), a, Reply()):
            pass
    with graph.waiting((b,), a, Reply()):  # a's wait ended: its edge is gone
        pass
