"""The guarantees under the real clock, with threads racing: producers, kills and faults.

The chaos harness checks every guarantee in virtual time, where one thing happens at a
time. Here the same guarantees are checked where group commit, enqueues from the
callers' threads and attempts handed to actors really overlap: several producers, an
instance killed every few enqueues, and a fault plan crashing instances at every point
that does not need virtual time to recover (no ``alarm_error``, whose retry waits 2 s).
Nothing here sleeps: the kills are driven by the producers' own progress.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from dopool import (
    EnqueueResult,
    EventContext,
    InstanceCrashedError,
    PoolClosedError,
    PoolEvent,
    RetryPolicy,
    Runtime,
    WorkerPool,
)
from dopool.chaos import FaultPlan

pytestmark = pytest.mark.threaded

POOL = "p"
CONCURRENCY = 4
PRODUCERS = 4
EVENTS_PER_PRODUCER = 120
KEYS_PER_PRODUCER = 3
KILL_EVERY = 25  # producer 0 kills an instance after this many acknowledged enqueues
TIMEOUT = 60.0
ENQUEUE_TRIES = 50  # far more than a 2-3% fault rate needs: more means a crash loop
# Retries fast and often enough that every event succeeds in the end.
RETRY = RetryPolicy(max_attempts=1_000, initial_delay=0.0005, max_delay=0.005, jitter=0.0)
FAULTS = FaultPlan(
    seed=7,
    crash_before_execute=0.02,
    crash_after_execute=0.02,
    crash_during_enqueue=0.02,
    storage_error=0.01,
)


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_racing_producers_kills_and_faults_lose_nothing(durability: str, tmp_path: Path) -> None:
    lock = threading.Lock()
    trace: dict[int, list[PoolEvent]] = defaultdict(list)  # each instance's events, in order
    # Each instance's recoveries so far: after RESTARTS_AT_ONCE crashes in a row its
    # restart waits a backoff, during which an enqueue is refused at once
    # (InstanceCrashedError); the producer then waits for the next recovery.
    recovered = threading.Condition()
    recoveries = [0] * CONCURRENCY

    def _recovered(index: int, seen: list[int]) -> bool:
        return recoveries[index] > seen[index]

    def record(event: PoolEvent) -> None:
        with lock:
            trace[event.instance_index].append(event)
        if event.kind == "recovered":
            with recovered:
                recoveries[event.instance_index] += 1
                recovered.notify_all()

    def handler(ctx: EventContext) -> None:
        pass

    with Runtime(tmp_path / "store", durability=durability, faults=FAULTS, seed=1) as runtime:
        runtime.subscribe(record)
        pool = runtime.define(POOL, execute=handler, concurrency=CONCURRENCY, retry=RETRY)

        def produce(producer: int) -> list[tuple[str, EnqueueResult]]:
            acknowledged = []
            for n in range(EVENTS_PER_PRODUCER):
                key = f"k{producer}.{n % KEYS_PER_PRODUCER}"
                event = {"producer": producer, "n": n}
                for _ in range(ENQUEUE_TRIES):  # a crashed enqueue stored nothing: again
                    with recovered:
                        seen = list(recoveries)
                    try:
                        acknowledged.append((key, pool.enqueue(event, partition_key=key)))
                        break
                    except InstanceCrashedError as exc:
                        index = int(exc.instance_id.rpartition(":")[2])
                        with recovered:  # the crash's successor (at once, or after a backoff)
                            assert recovered.wait_for(partial(_recovered, index, seen), TIMEOUT), (
                                f"instance {index} did not recover"
                            )
                else:
                    pytest.fail(f"{event} crashed its instance {ENQUEUE_TRIES} times in a row")
                if producer == 0 and n % KILL_EVERY == KILL_EVERY - 1:
                    runtime.kill(POOL, (n // KILL_EVERY) % CONCURRENCY)
            return acknowledged

        with ThreadPoolExecutor(PRODUCERS) as executor:
            produced = list(executor.map(produce, range(PRODUCERS)))
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()

    acknowledged = [item for batch in produced for item in batch]
    total = PRODUCERS * EVENTS_PER_PRODUCER
    assert len(acknowledged) == total
    # Persist before acknowledge, and nothing stored for a crashed enqueue: the stored
    # counters hold exactly the acknowledged events, every one of them succeeded.
    assert (status.enqueued, status.succeeded, status.dead_lettered, status.pending) == (
        total,
        total,
        0,
        0,
    )
    assert sum(instance.restarts for instance in status.instances) > 0  # faults did fire
    slots = {(result.instance_index, result.sequence) for _, result in acknowledged}
    assert len(slots) == total  # no two acknowledgements name the same stored event

    succeeded: dict[tuple[int, int], int] = {}  # (instance, sequence) -> index in its trace
    for index, events in trace.items():
        for position, event in enumerate(events):
            if event.kind == "succeeded":
                assert event.sequence is not None
                slot = (index, event.sequence)
                assert slot not in succeeded, f"{slot} succeeded twice"
                succeeded[slot] = position
            elif event.kind == "started":
                # At-least-once, never after a committed success.
                assert (index, event.sequence) not in succeeded, f"{event} after its success"
    assert set(succeeded) == slots

    # Order: on each instance the successes follow the sequences (per-partition FIFO).
    for index, events in trace.items():
        done = [e.sequence for e in events if e.kind == "succeeded" and e.sequence is not None]
        assert done == sorted(done), f"instance {index} completed out of order"
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, result in acknowledged:
        by_key[key].append(succeeded[(result.instance_index, result.sequence)])
    for key, positions in by_key.items():
        assert positions == sorted(positions), f"partition {key} completed out of order"


def test_enqueues_racing_close_are_either_stored_or_refused(tmp_path: Path) -> None:
    """A caller enqueuing while close() runs: each call is stored, or refused and not stored.

    With ``retry=None``, an attempt a caller started but nobody ran before the close
    would be dead-lettered by the next open's recovery.
    """
    store = tmp_path / "store"
    stored = 0
    for round_ in range(20):
        runtime = Runtime(store)
        pool = runtime.define(POOL, execute=handler_noop, concurrency=2)
        started = threading.Event()
        outcomes: list[str] = []
        producer = threading.Thread(target=produce, args=(pool, round_, started, outcomes))
        producer.start()
        assert started.wait(TIMEOUT)
        runtime.close()
        producer.join(TIMEOUT)
        assert not producer.is_alive()
        assert "refused" not in outcomes[:-1]  # once refused, the producer stopped
        stored += outcomes.count("stored")

    with Runtime(store) as reopened:
        pool = reopened.define(POOL, execute=handler_noop, concurrency=2)
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()
    assert (status.enqueued, status.succeeded, status.dead_lettered) == (stored, stored, 0)


def handler_noop(_ctx: EventContext) -> None:
    pass


def produce(pool: WorkerPool, round_: int, started: threading.Event, outcomes: list[str]) -> None:
    """Enqueue until refused (or 1,000 times); ``started`` is set after the first few."""
    for n in range(1_000):
        if n == 5:
            started.set()
        try:
            pool.enqueue({"round": round_, "n": n})
        except PoolClosedError:
            outcomes.append("refused")
            break
        outcomes.append("stored")
    started.set()
