"""Follow-ups into another pool (``ctx.enqueue(..., pool=...)``): pipelines of pools.

A follow-up into another pool takes the same path as one into another instance of
its own pool: validated at once (with the target pool's schema), committed with its
parent's outcome, routed by the target pool's router, delivered at least once from
the outbox and taken once, in link order. Every test runs on a SimulatedClock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dopool
from dopool import (
    ConfigurationError,
    EventContext,
    EventTooLargeError,
    EventValidationError,
    InstanceCrashedError,
    PermanentError,
    PoolEvent,
    PoolStatus,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    WorkerPool,
)
from dopool._cluster.routing import stable_hash
from dopool._machine.invariants import link_violations, read_links
from dopool._ops.check import check_store
from dopool._store.layout import Namespace, OutboxRecord, pool_records
from dopool.chaos import FaultPlan

# -- helpers (as in test_pool.py) ------------------------------------------------------------


def clock_of(runtime: Runtime) -> SimulatedClock:
    clock = runtime.clock
    assert isinstance(clock, SimulatedClock)
    return clock


@dataclass(frozen=True)
class Run:
    """One execution of a handler, as the handler saw it."""

    pool: str
    event: Any
    index: int
    attempt: int
    partition_key: str | None


class Recorder:
    """A handler that records every execution, then runs an optional action."""

    def __init__(self, action: Callable[[EventContext], Any] | None = None) -> None:
        self.runs: list[Run] = []
        self._action = action

    def __call__(self, ctx: EventContext) -> None:
        run = Run(ctx.pool_name, ctx.event, ctx.instance_index, ctx.attempt, ctx.partition_key)
        self.runs.append(run)
        if self._action is not None:
            self._action(ctx)

    @property
    def events(self) -> list[Any]:
        return [run.event for run in self.runs]


def noop(_ctx: EventContext) -> None:
    pass


def fail_first_attempt(ctx: EventContext) -> None:
    if ctx.attempt == 1:
        raise ValueError("first attempt fails")


def no_jitter(**options: Any) -> RetryPolicy:
    return RetryPolicy(jitter=0.0, **options)


def key_for(index: int, concurrency: int, prefix: str = "key") -> str:
    """A partition key that routes to ``index`` of a pool of ``concurrency`` instances."""
    n = 0
    while stable_hash(f"{prefix}-{n}") % concurrency != index:
        n += 1
    return f"{prefix}-{n}"


def assert_counters_balance(status: PoolStatus) -> None:
    for instance in status.instances:
        assert instance.enqueued == (
            instance.succeeded + instance.dead_lettered + instance.drained + instance.pending
        ), instance


def reopen(old: Runtime, path: Path) -> Runtime:
    """Close ``old`` and open its store again on the same simulated clock (time continues)."""
    old.close()
    return Runtime(path, clock=old.clock, seed=0)


def relay(to: str, **options: Any) -> Recorder:
    """A handler that sends every event it gets on to pool ``to``, as it is."""

    def send(ctx: EventContext) -> None:
        ctx.enqueue(ctx.event, pool=to, **options)

    return Recorder(send)


def outboxes(runtime: Runtime, pool: str, concurrency: int) -> list[list[OutboxRecord]]:
    with runtime._store.read() as txn:
        return [
            [record for _, record in Namespace(pool, i).iter_outbox(txn)]  # type: ignore[misc]
            for i in range(concurrency)
        ]


def links_balance(runtime: Runtime) -> None:
    with runtime._store.read() as txn:
        assert link_violations(read_links(txn, pool_records(txn))) == []
        assert check_store(txn).problems == []


# -- the path of a follow-up into another pool --------------------------------------------


def test_a_follow_up_reaches_the_other_pool_routed_by_its_partition_key(sim: Runtime) -> None:
    sink = Recorder()
    b = sim.define("b", execute=sink, concurrency=3)
    keys = [key_for(i, 3, "k") for i in (2, 0, 1, 2)]

    def fan_out(ctx: EventContext) -> None:
        for n, key in enumerate(keys):
            ctx.enqueue({"n": n}, partition_key=key, pool="b")

    a = sim.define("a", execute=fan_out, concurrency=2)
    events: list[PoolEvent] = []
    sim.subscribe(events.append)
    a.enqueue("parent")
    assert a.join(timeout=10)
    assert b.join(timeout=10)

    assert sorted((run.event["n"], run.index, run.partition_key) for run in sink.runs) == [
        (n, stable_hash(key) % 3, key) for n, key in enumerate(keys)
    ]
    enqueued = [(e.pool, e.instance_index) for e in events if e.kind == "enqueued"]
    assert sorted(enqueued[1:]) == [("b", 0), ("b", 1), ("b", 2), ("b", 2)]
    assert [s.enqueued for s in b.status().instances] == [1, 1, 2]
    assert (a.status().succeeded, b.status().succeeded) == (1, 4)
    assert_counters_balance(b.status())
    links_balance(sim)


def test_sources_of_the_same_index_in_two_pools_are_two_sources(sim: Runtime) -> None:
    """c:0 takes link 0 from a:0, from b:0 and from c:1: three follow-ups, none a duplicate."""
    to_c0 = key_for(0, 2, "c")

    def send(ctx: EventContext) -> None:
        if ctx.pool_name != "c" or ctx.event == "from c":
            target = "c" if ctx.pool_name != "c" else None
            event = f"to c from {ctx.pool_name}:{ctx.instance_index}"
            ctx.enqueue(event, partition_key=to_c0, pool=target)

    sink = Recorder(send)
    c = sim.define("c", execute=sink, concurrency=2)
    a = sim.define("a", execute=send)
    b = sim.define("b", execute=send)
    c.enqueue("from c", partition_key=key_for(1, 2, "c"))
    a.enqueue("go")
    b.enqueue("go")
    for pool in (a, b, c):
        assert pool.join(timeout=10)
    assert sorted(run.event for run in sink.runs if run.index == 0) == [
        "to c from a:0",
        "to c from b:0",
        "to c from c:1",
    ]
    with sim._store.read() as txn:
        marks = dict(Namespace("c", 0).iter_marks(txn))
    assert marks == {("a", 0): 0, ("b", 0): 0, ("c", 1): 0}
    links_balance(sim)


def test_a_follow_up_into_a_paused_pool_keeps_its_priority_and_order(sim: Runtime) -> None:
    sink = Recorder()
    b = sim.define("b", execute=sink)
    b.pause()

    def send(ctx: EventContext) -> None:
        for n, priority in enumerate([0, 5, 0, -1, 5]):
            ctx.enqueue(n, priority=priority, pool=b)  # a WorkerPool, not a name

    a = sim.define("a", execute=send)
    a.enqueue("parent")
    assert a.join(timeout=10)  # a's follow-ups are in b's queue: a is done
    assert b.status().pending == 5
    assert not b.join(timeout=10)  # paused
    b.resume()
    assert b.join(timeout=10)
    assert sink.events == [1, 4, 0, 2, 3]


def test_round_robin_follow_ups_take_turns_with_the_target_pools_own_enqueues(
    sim: Runtime,
) -> None:
    b = sim.define("b", execute=noop, concurrency=3)
    a = sim.define("a", execute=relay("b"))
    assert b.enqueue("first").instance_index == 0
    a.enqueue_many(["x", "y"])
    assert a.join(timeout=10)
    assert b.enqueue("last").instance_index == 0  # the router's turns 1 and 2 went to a's
    assert b.join(timeout=10)
    assert [s.enqueued for s in b.status().instances] == [2, 1, 1]


def test_naming_its_own_pool_is_a_follow_up_to_itself(sim: Runtime) -> None:
    def count_down(ctx: EventContext) -> None:
        if ctx.event:
            ctx.enqueue(ctx.event - 1, pool="a" if ctx.event % 2 else pools[0])

    pools: list[WorkerPool] = []
    pools.append(sim.define("a", execute=Recorder(count_down), concurrency=2))
    pools[0].enqueue(4)
    assert pools[0].join(timeout=10)
    assert pools[0].status().succeeded == 5
    with sim._store.read() as txn:
        assert Namespace("a", 0).load_meta(txn).links == {"a:1": 2}


def test_follow_ups_into_another_pool_are_not_refused_by_its_max_queue_depth(
    sim: Runtime,
) -> None:
    b = sim.define("b", execute=noop, max_queue_depth=1)
    b.pause()
    b.enqueue("filler")

    def send(ctx: EventContext) -> None:
        for n in range(3):
            ctx.enqueue(n, pool="b")

    a = sim.define("a", execute=send)
    a.enqueue("parent")
    assert a.join(timeout=10)
    assert b.status().pending == 4


# -- validated at once, with the target's schema ------------------------------------------


def test_the_event_is_checked_with_the_target_pools_schema_when_enqueued(
    sim: Runtime,
) -> None:
    def only_ints(event: Any) -> Any:
        if not isinstance(event, int):
            raise ValueError("ints only")
        return event * 10

    sink = Recorder()
    b = sim.define("b", execute=sink, schema=only_ints)
    caught: list[EventValidationError] = []

    def send(ctx: EventContext) -> None:
        if ctx.event != "go":
            return
        for event in (1, "two", 3):
            try:
                ctx.enqueue(event, pool="b")
            except EventValidationError as exc:
                caught.append(exc)
        with pytest.raises(EventTooLargeError):
            ctx.enqueue(1, partition_key="k" * 3000, pool="b")
        ctx.enqueue("not an int", pool=None)  # a's own schema, which takes it

    a = sim.define("a", execute=Recorder(send), schema=str)
    a.enqueue("go")
    assert a.join(timeout=10)
    assert [exc.reason for exc in caught] == ["schema rejected it (ValueError: ints only)"]
    assert a.status().succeeded == 2
    assert b.join(timeout=10)
    assert sorted(sink.events) == [10, 30]  # stored as b's schema returned them


def test_an_unknown_pool_fails_the_attempt_naming_it(sim: Runtime) -> None:
    a = sim.define("a", execute=relay("nowhere"))
    a.enqueue("x")
    assert a.join(timeout=10)
    [dead] = a.dead_letters()
    assert dead.error.startswith("ConfigurationError: ctx.enqueue: no pool named 'nowhere'")


def test_a_pool_of_another_runtime_a_producers_or_no_pool_at_all_is_refused(
    sim: Runtime, tmp_path: Path
) -> None:
    with Runtime.simulated(tmp_path / "other") as other, dopool.connect(sim.path) as connection:
        foreign = other.define("b", execute=noop)
        sim.define("b", execute=noop)  # the same name here does not make it ours
        producer = connection.pool("b")  # nor does a producer's handle on it
        errors: list[str] = []

        def send(ctx: EventContext) -> None:
            for target in (foreign, producer, 42):
                try:
                    ctx.enqueue("x", pool=target)  # type: ignore[arg-type]
                except ConfigurationError as exc:
                    errors.append(str(exc))

        a = sim.define("a", execute=send)
        a.enqueue("x")
        assert a.join(timeout=10)
        assert foreign.status().enqueued == producer.status().enqueued == 0
    assert errors == [
        "ctx.enqueue: <WorkerPool 'b' concurrency=1> belongs to another runtime; a "
        "follow-up goes to a pool of its handler's own runtime",
        f"ctx.enqueue: pool must be None, a pool name or a WorkerPool, got {producer!r}",
        "ctx.enqueue: pool must be None, a pool name or a WorkerPool, got 42",
    ]


# -- committed with the parent's outcome, or discarded with it ----------------------------


def test_follow_ups_of_a_failed_attempt_never_reach_the_other_pool(sim: Runtime) -> None:
    sink = Recorder()
    b = sim.define("b", execute=sink)

    def send_then_fail(ctx: EventContext) -> None:
        ctx.enqueue(f"from attempt {ctx.attempt}", pool="b")
        fail_first_attempt(ctx)
        if ctx.event == "poison":
            raise PermanentError("no")

    a = sim.define("a", execute=send_then_fail, retry=no_jitter(max_attempts=3))
    a.enqueue("parent")
    a.enqueue("poison")
    assert a.join(timeout=10)
    assert b.join(timeout=10)
    assert sink.events == ["from attempt 2"]
    assert b.status().enqueued == 1


def test_a_kill_in_the_handler_discards_its_follow_ups_to_another_pool(sim: Runtime) -> None:
    sink = Recorder()
    b = sim.define("b", execute=sink)

    def send_and_die(ctx: EventContext) -> None:
        ctx.enqueue(ctx.attempt, pool="b")
        if ctx.attempt == 1:
            sim.kill("a", 0)

    a = sim.define("a", execute=send_and_die, retry=no_jitter(max_attempts=2))
    a.enqueue("x")
    assert a.join(timeout=10)
    assert b.join(timeout=10)
    assert sink.events == [2]


# -- pipelines -------------------------------------------------------------------------------


def test_a_chain_of_three_pools(sim: Runtime) -> None:
    sink = Recorder()
    c = sim.define("c", execute=sink, concurrency=2)
    b = sim.define("b", execute=relay("c"), concurrency=3)
    a = sim.define("a", execute=relay("b"), concurrency=2)
    a.enqueue_many(range(10))
    for pool in (a, b, c):  # in pipeline order: each one's work has reached the next
        assert pool.join(timeout=10)
    assert sorted(sink.events) == list(range(10))
    assert [p.status().succeeded for p in (a, b, c)] == [10, 10, 10]
    links_balance(sim)


def test_a_cycle_between_two_pools_ends(sim: Runtime) -> None:
    def bounce(ctx: EventContext) -> None:
        if ctx.event > 0:
            ctx.enqueue(ctx.event - 1, partition_key=f"k{ctx.event}", pool=other[ctx.pool_name])

    other = {"a": "b", "b": "a"}
    seen = Recorder(bounce)
    a = sim.define("a", execute=seen, concurrency=2)
    b = sim.define("b", execute=seen, concurrency=3)
    a.enqueue(9)
    a.enqueue(6, partition_key="x")
    while not (a.join(timeout=10) and b.join(timeout=10) and a.join(timeout=10)):
        pass
    assert sorted(seen.events) == sorted([*range(10), *range(7)])
    assert (a.status().succeeded, b.status().succeeded) == (9, 8)
    links_balance(sim)


# -- join ---------------------------------------------------------------------------------


def test_join_of_the_target_waits_for_follow_ups_still_in_another_pools_outbox(
    sim: Runtime,
) -> None:
    sink = Recorder()
    b = sim.define("b", execute=sink)
    a = sim.define("a", execute=relay("b"))
    a.enqueue("x")
    assert clock_of(sim).step()  # a's outcome committed; its follow-up waits in its outbox
    assert [len(box) for box in outboxes(sim, "a", 1)] == [1]
    assert b.status().enqueued == 0
    assert b.join(timeout=10)  # drove the delivery, and b's handler
    assert sink.events == ["x"]
    assert outboxes(sim, "a", 1) == [[]]


def test_join_of_the_source_waits_until_the_target_has_its_follow_ups(sim: Runtime) -> None:
    sink = Recorder()
    b = sim.define("b", execute=sink)
    b.pause()
    a = sim.define("a", execute=relay("b"))
    a.enqueue("x")
    assert a.join(timeout=10)  # its outbox is empty: b holds the follow-up
    assert outboxes(sim, "a", 1) == [[]]
    assert (b.status().pending, sink.events) == (1, [])


# -- crashes during delivery ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kill",
    [
        "source-before-delivery",  # resent by the source's recovery, and delivered once
        "source-before-ack",  # taken, then resent: a duplicate, ignored and acknowledged
        "target-after-taking",  # the target's recovery; the ack comes anyway
    ],
)
def test_a_crash_during_delivery_delivers_once(sim: Runtime, kill: str) -> None:
    sink = Recorder()
    b = sim.define("b", execute=sink, concurrency=2)
    b.pause()  # b runs nothing: only deliveries and acknowledgements move
    a = sim.define("a", execute=relay("b", partition_key=key_for(1, 2)))
    events: list[PoolEvent] = []
    sim.subscribe(events.append)
    a.enqueue("x")
    clock = clock_of(sim)
    assert clock.step()  # a's outcome and its outbox entry committed
    if kill == "source-before-delivery":
        sim.kill("a", 0)
    assert clock.step()  # b:1 takes the follow-up (link 0) and acknowledges it
    assert b.status().pending == 1
    if kill == "source-before-ack":
        sim.kill("a", 0)
    elif kill == "target-after-taking":
        sim.kill("b", 1)
    assert a.join(timeout=10)
    b.resume()
    assert b.join(timeout=10)
    assert sink.events == ["x"]
    assert [e.instance_index for e in events if e.kind == "enqueued" and e.pool == "b"] == [1]
    assert outboxes(sim, "a", 1) == [[]]
    links_balance(sim)


def test_storage_faults_on_both_sides_deliver_every_follow_up_once(store_path: Path) -> None:
    plan = FaultPlan(seed=5, storage_error=0.2, crash_after_execute=0.1)
    sink = Recorder()
    with Runtime.simulated(store_path, faults=plan) as runtime:
        b = runtime.define("b", execute=sink, concurrency=2, retry=no_jitter(max_attempts=20))
        a = runtime.define("a", execute=relay("b"), concurrency=2, retry=no_jitter(max_attempts=20))
        crashes: list[PoolEvent] = []
        runtime.subscribe(lambda e: crashes.append(e) if e.kind == "crashed" else None)
        stored = []
        for n in range(30):
            try:
                a.enqueue(n, partition_key=str(n))
                stored.append(n)
            except InstanceCrashedError:  # a storage fault: nothing was stored
                runtime.clock.activity.wait_quiet()
        while not (a.join(timeout=30) and b.join(timeout=30)):
            pass
        links_balance(runtime)
        # Each follow-up was taken by b once: its first attempts are one per event.
        assert sorted(run.event for run in sink.runs if run.attempt == 1) == stored
        assert b.status().succeeded + b.status().dead_lettered == len(stored)
        assert {e.pool for e in crashes} == {"a", "b"}


# -- a target pool not defined (yet) ----------------------------------------------------------


def test_follow_ups_for_a_pool_not_defined_wait_in_the_outbox_until_it_is(
    sim: Runtime, store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim.define("b", execute=noop, concurrency=2)
    a = sim.define("a", execute=relay("b"))
    a.enqueue_many(["x", "y", "z"])
    assert clock_of(sim).step()  # a runs all three: three follow-ups in its outbox
    assert [len(box) for box in outboxes(sim, "a", 1)] == [3]

    sink = Recorder()
    with caplog.at_level(logging.WARNING, logger="dopool"):
        runtime = reopen(sim, store_path)
    try:
        a = runtime.define("a", execute=relay("b"))  # b is not defined in this runtime
        assert "follow-ups for pool 'b' wait in the outbox until it is defined" in caplog.text
        assert not a.join(timeout=10)  # nothing can move them
        assert [len(box) for box in outboxes(runtime, "a", 1)] == [3]
        a.enqueue("w")  # its follow-up can't be made: b is not defined
        assert not a.join(timeout=10)
        [dead] = a.dead_letters()
        assert "no pool named 'b'" in dead.error
        b = runtime.define("b", execute=sink, concurrency=2)
        assert a.join(timeout=10)
        assert b.join(timeout=10)
        assert sorted(sink.events) == ["x", "y", "z"]
        links_balance(runtime)
    finally:
        runtime.close()


def test_join_of_a_target_waits_for_a_source_not_defined_yet(
    sim: Runtime, store_path: Path
) -> None:
    sim.define("b", execute=noop)
    a = sim.define("a", execute=relay("b"))
    a.enqueue("x")
    assert clock_of(sim).step()
    sink = Recorder()
    runtime = reopen(sim, store_path)
    try:
        b = runtime.define("b", execute=sink)
        assert not b.join(timeout=10)  # a follow-up for b waits in a's outbox
        runtime.define("a", execute=relay("b"))  # its recovery resends it
        assert b.join(timeout=10)
        assert sink.events == ["x"]
    finally:
        runtime.close()


def test_a_follow_up_held_for_a_pool_goes_before_a_newer_one(
    sim: Runtime, store_path: Path
) -> None:
    """The held ones are resent first, whatever comes first: the ``Resend`` or a new
    follow-up of a handler that started before the pool was defined."""
    sim.define("b", execute=noop)
    a = sim.define("a", execute=relay("b"))
    a.enqueue_many([0, 1])
    clock = clock_of(sim)
    assert clock.step()
    assert clock.step()
    sink = Recorder()
    runtime = reopen(sim, store_path)
    try:
        b_pools: list[WorkerPool] = []

        def define_b_then_send(ctx: EventContext) -> None:
            b_pools.append(runtime.define("b", execute=sink))  # before a's Resend arrives
            ctx.enqueue(ctx.event, pool="b")

        a = runtime.define("a", execute=define_b_then_send)
        a.enqueue(2)
        assert a.join(timeout=10)
        assert b_pools[0].join(timeout=10)
        assert sink.events == [0, 1, 2]  # links 0, 1, 2 of a:0 → b:0, each taken once
        links_balance(runtime)
    finally:
        runtime.close()


# -- concurrency changes --------------------------------------------------------------------


def test_a_concurrency_change_is_refused_while_another_pool_holds_follow_ups_for_it(
    sim: Runtime, store_path: Path
) -> None:
    sim.define("b", execute=noop, concurrency=2)
    a = sim.define("a", execute=relay("b", partition_key=key_for(1, 2)), concurrency=3)
    a.enqueue("x", partition_key=key_for(2, 3))
    assert clock_of(sim).step()  # a:2 holds a follow-up routed to b:1 under concurrency 2
    runtime = reopen(sim, store_path)
    try:
        for changed in (1, 3):
            with pytest.raises(ConfigurationError) as caught:
                runtime.define("b", execute=noop, concurrency=changed)
            assert "(1 in a:2's outbox)" in str(caught.value)
        with runtime._store.read() as txn:
            assert runtime._store.get_pool(txn, "b") == 2
        sink = Recorder()
        b = runtime.define("b", execute=sink, concurrency=2)  # as stored: accepted
        a = runtime.define("a", execute=noop, concurrency=3)
        assert a.join(timeout=10)
        assert b.join(timeout=10)
        assert [(run.event, run.index) for run in sink.runs] == [("x", 1)]
    finally:
        runtime.close()
    with Runtime(store_path, clock=SimulatedClock()) as runtime:  # delivered: now it may
        assert runtime.define("b", execute=noop, concurrency=5).concurrency == 5


def test_a_pool_whose_follow_ups_were_all_delivered_may_shrink_and_grow_back(
    sim: Runtime, store_path: Path
) -> None:
    b = sim.define("b", execute=noop, concurrency=4)
    a = sim.define("a", execute=relay("b"))
    a.enqueue_many(range(8))
    assert a.join(timeout=10)
    assert b.join(timeout=10)
    runtime = reopen(sim, store_path)
    try:
        runtime.define("b", execute=noop, concurrency=2)
    finally:
        runtime.close()
    sink = Recorder()
    with Runtime(store_path, clock=sim.clock) as runtime:
        b = runtime.define("b", execute=sink, concurrency=4)  # b:2 and b:3 kept their marks
        a = runtime.define("a", execute=relay("b"))
        a.enqueue_many(range(8, 16))
        assert a.join(timeout=10)
        assert b.join(timeout=10)
        assert sorted(sink.events) == list(range(8, 16))
        links_balance(runtime)


# -- determinism --------------------------------------------------------------------------


def _traced_pipeline(path: Path) -> bytes:
    trace = path / "trace.jsonl"
    plan = FaultPlan(seed=4, crash_after_execute=0.1, storage_error=0.05)
    with Runtime.simulated(path / "store", seed=11, trace=trace, faults=plan) as runtime:

        def bounce(ctx: EventContext) -> None:
            ctx.sleep(0.5)
            if ctx.event > 0:
                other = "b" if ctx.pool_name == "a" else "a"
                ctx.enqueue(ctx.event - 1, pool=other)
                ctx.enqueue(ctx.event - 1, partition_key=str(ctx.event), pool=other)

        retry = no_jitter(max_attempts=10, initial_delay=0.25)
        a = runtime.define("a", execute=bounce, concurrency=2, retry=retry)
        b = runtime.define("b", execute=bounce, concurrency=3, retry=retry)
        for n in range(4):
            a.enqueue(n)
        while not (a.join(timeout=30) and b.join(timeout=30) and a.join(timeout=30)):
            pass
    return trace.read_bytes()


def test_the_same_seed_gives_the_same_trace_bytes_across_pools(tmp_path: Path) -> None:
    first = _traced_pipeline(tmp_path / "one")
    assert first == _traced_pipeline(tmp_path / "two")
    assert b'"pool":"b"' in first
    assert b'"crashed"' in first
