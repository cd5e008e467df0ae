"""A pool under the real clock: producer threads, wall-time retries, join and close.

These tests synchronise on events and futures, never on sleeps.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dopool import EmptyInfo, EnqueueResult, EventContext, RetryPolicy, Runtime

pytestmark = pytest.mark.threaded

PRODUCERS = 8
EVENTS_PER_PRODUCER = 50


def test_many_producers_every_event_is_acknowledged_once_and_executed(tmp_path: Path) -> None:
    executed: list[tuple[int, int]] = []

    def handler(ctx: EventContext) -> None:
        executed.append((ctx.event["producer"], ctx.event["n"]))

    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=handler, concurrency=4)

        def produce(producer: int) -> list[EnqueueResult]:
            return [
                pool.enqueue({"producer": producer, "n": n}) for n in range(EVENTS_PER_PRODUCER)
            ]

        with ThreadPoolExecutor(PRODUCERS) as executor:
            batches = list(executor.map(produce, range(PRODUCERS)))
        assert pool.join(timeout=10)
        status = pool.status()

    results = [result for batch in batches for result in batch]
    total = PRODUCERS * EVENTS_PER_PRODUCER
    assert len({(r.instance_index, r.sequence) for r in results}) == total
    for index in range(4):
        sequences = sorted(r.sequence for r in results if r.instance_index == index)
        assert sequences == list(range(len(sequences)))
    expected = {(p, n) for p in range(PRODUCERS) for n in range(EVENTS_PER_PRODUCER)}
    assert set(executed) == expected
    assert (status.enqueued, status.succeeded, status.pending) == (total, total, 0)


def test_per_partition_order_holds_with_concurrent_producers(tmp_path: Path) -> None:
    executed: dict[str, list[int]] = defaultdict(list)

    def handler(ctx: EventContext) -> None:
        executed[ctx.event["key"]].append(ctx.event["n"])

    keys = [f"user-{n}" for n in range(PRODUCERS)]
    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=handler, concurrency=4)

        def produce(key: str) -> None:
            for n in range(EVENTS_PER_PRODUCER):
                pool.enqueue({"key": key, "n": n}, partition_key=key)

        with ThreadPoolExecutor(PRODUCERS) as executor:
            list(executor.map(produce, keys))
        assert pool.join(timeout=10)

    assert dict(executed) == {key: list(range(EVENTS_PER_PRODUCER)) for key in keys}


def test_join_waits_for_a_retry_after_its_backoff(tmp_path: Path) -> None:
    started: list[tuple[int, float]] = []

    def fail_once(ctx: EventContext) -> None:
        started.append((ctx.attempt, ctx.started_at))
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")

    with Runtime(tmp_path / "store") as runtime:
        policy = RetryPolicy(max_attempts=2, initial_delay=0.05, jitter=0.0)
        pool = runtime.define("p", execute=fail_once, retry=policy)
        pool.enqueue("x")
        assert pool.join(timeout=10)
        status = pool.status()

    [(first, first_at), (second, second_at)] = started
    assert (first, second) == (1, 2)
    assert second_at - first_at >= 0.05 - 1e-3
    assert (status.succeeded, status.dead_lettered) == (1, 0)


def test_join_times_out_while_a_handler_is_blocked(tmp_path: Path) -> None:
    running, release = threading.Event(), threading.Event()

    def blocked(_ctx: EventContext) -> None:
        running.set()
        assert release.wait(10)

    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=blocked)
        pool.enqueue("x")
        assert running.wait(10)

        assert not pool.join(timeout=0.05)
        assert pool.status().instance(0).state == "processing"
        release.set()
        assert pool.join(timeout=10)
        assert pool.status().succeeded == 1


def test_join_waits_for_the_on_empty_hook(tmp_path: Path) -> None:
    in_hook, release = threading.Event(), threading.Event()

    def on_empty(_info: EmptyInfo) -> None:
        in_hook.set()
        assert release.wait(10)

    with Runtime(tmp_path / "store") as runtime:
        pool = runtime.define("p", execute=lambda _ctx: None, on_empty=on_empty)
        pool.enqueue("x")
        assert in_hook.wait(10)

        assert not pool.join(timeout=0.05)
        release.set()
        assert pool.join(timeout=10)


def test_async_durability_processes_and_keeps_events(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Runtime(path, durability="async") as runtime:
        pool = runtime.define("p", execute=lambda _ctx: None, concurrency=2)
        pool.pause()
        pool.enqueue_many(range(4))

    executed: list[int] = []
    with Runtime(path, durability="async") as runtime:
        pool = runtime.define("p", execute=lambda ctx: executed.append(ctx.event), concurrency=2)
        assert pool.status().pending == 4
        pool.resume()
        assert pool.join(timeout=10)
        assert pool.status().succeeded == 4
    assert sorted(executed) == [0, 1, 2, 3]


def test_close_lets_a_running_handler_finish_and_keeps_pending_events(tmp_path: Path) -> None:
    path = tmp_path / "store"
    running, release = threading.Event(), threading.Event()
    finished: list[int] = []

    def first_blocks(ctx: EventContext) -> None:
        running.set()
        assert release.wait(10)
        finished.append(ctx.event)

    runtime = Runtime(path)
    pool = runtime.define("p", execute=first_blocks)
    pool.enqueue_many([0, 1, 2])
    assert running.wait(10)

    closer = threading.Thread(target=runtime.close)
    closer.start()
    closer.join(timeout=0.05)
    assert closer.is_alive()  # close waits for the handler
    release.set()
    closer.join(timeout=10)
    assert not closer.is_alive()
    assert finished == [0]

    executed: list[int] = []
    with Runtime(path) as again:
        pool = again.define("p", execute=lambda ctx: executed.append(ctx.event))
        assert pool.join(timeout=10)
        status = pool.status()
    assert executed == [1, 2]
    assert (status.enqueued, status.succeeded, status.pending) == (3, 3, 0)


def test_a_pipeline_of_two_pools_with_concurrent_producers(tmp_path: Path) -> None:
    """Each follow-up into the other pool runs once, in its source's order per partition."""
    received: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def stage_one(ctx: EventContext) -> None:
        event = ctx.event
        ctx.enqueue(event, partition_key=event["key"], pool="two")

    def stage_two(ctx: EventContext) -> None:
        with lock:
            received[ctx.event["key"]].append(ctx.event["n"])

    keys = [f"user-{n}" for n in range(PRODUCERS)]
    with Runtime(tmp_path / "store", durability="async") as runtime:
        two = runtime.define("two", execute=stage_two, concurrency=3)
        one = runtime.define("one", execute=stage_one, concurrency=4)

        def produce(key: str) -> None:
            for n in range(EVENTS_PER_PRODUCER):
                one.enqueue({"key": key, "n": n}, partition_key=key)

        with ThreadPoolExecutor(PRODUCERS) as executor:
            list(executor.map(produce, keys))
        assert one.join(timeout=30)
        assert two.join(timeout=30)
        assert two.status().succeeded == PRODUCERS * EVENTS_PER_PRODUCER
    # One partition key: one instance of "one", one of "two", one link between them.
    assert dict(received) == {key: list(range(EVENTS_PER_PRODUCER)) for key in keys}
