"""The child process of ``test_process_kill.py``: a pool under the real clock, to be SIGKILLed.

Usage::

    python _kill_child.py STORE LOG_DIR DURABILITY ROLE GENERATION SEED

``ROLE`` is ``run`` or ``drain``. Both open ``Runtime(STORE, durability=DURABILITY)``
and define the same pool; each prints ``opened`` once the store is open, before the
pool is defined (and recovers). ``run`` prints ``ready`` after its first acknowledged
enqueue, enqueues the rest of its share and processes until the parent kills
it (a watchdog exits 3 after ``WATCHDOG`` seconds if nobody does). ``drain``
waits for ``pool.join``, prints the pool's status and dead letters as one JSON line and
exits 0 (2 if ``join`` timed out).

Everything the parent needs survives SIGKILL: each line of ``LOG_DIR/gen-<GENERATION>.log``
is one ``os.write`` on an ``O_APPEND`` descriptor, in the kernel's page cache the moment
the call returns. Lines (space separated):

    T <id>                              a producer is about to call enqueue(<id>)
    A <id> <index> <sequence>           enqueue(<id>) returned (acknowledged)
    D <id> <index> <sequence>           enqueue(<id>) returned a duplicate naming that event
    K <id>                              a producer is about to call cancel(<id>'s event id)
    C <id> <answer>                     cancel returned its answer (1: cancelled, 0: not)
    X <id> <index> <sequence> <attempt> the handler is about to return successfully

Event ids are ints, unique across generations: ``GENERATION * 1_000_000 + producer *
100_000 + k`` with ``k >= 1``. Every id divisible by ``FOLLOW_UP_EVERY`` enqueues the
follow-up ``-id`` when it succeeds; follow-ups have no follow-ups and never fail. Every
id divisible by ``DELAYED_EVERY`` is enqueued with ``delay=DELAY``: a kill finds some of
them scheduled. Every id divisible by ``DEDUP_EVERY`` is enqueued with the dedup key
``k<id>``, and at once again (a retried submission: a duplicate); and each producer of a
generation after the first starts by submitting again the keyed ids of its predecessor's
first ``RESUBMITTED`` (acknowledged, cut short by the kill, or never tried), under a
dedup window that outlasts the test: each is a duplicate of the event stored with its
key, across the restart, or, if none was, stored now. Of the ids without a dedup key,
every one divisible by ``CANCEL_EVERY`` is enqueued ``CANCEL_DELAY`` ahead and cancelled
at once (a kill may fall between the two, or between the cancel's commit and its log
line), and every one divisible by ``TTL_EVERY`` and not delayed gets a ``ttl`` of
``TTL``: busy instances let some expire (dead-lettered as expired, never run).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import sys
import threading
import traceback

from dopool import EventContext, RetryPolicy, Runtime, WorkerPool

POOL = "killed"
CONCURRENCY = 3
# A crash during an attempt counts as one, so an event can use: its planned failures (at
# most 2) + one per kill that lands while it runs (the parent kills at most 3 times) + 1.
RETRY = RetryPolicy(max_attempts=10, initial_delay=0.01, multiplier=2.0, max_delay=0.05)
PRODUCERS = 2
GENERATION_STRIDE = 1_000_000
PRODUCER_STRIDE = 100_000
FOLLOW_UP_EVERY = 5
DELAYED_EVERY = 7
DELAY = 0.05  # seconds
DEDUP_EVERY = 4
DEDUP_WINDOW = 3600.0  # seconds: longer than any test
CANCEL_EVERY = 11
CANCEL_DELAY = 1.0  # seconds: still scheduled when the producer cancels it
TTL_EVERY = 13
TTL = 0.01  # seconds
RESUBMITTED = 40  # the ids (per producer) of the generation before submitted again
PRODUCER_PAUSE = 0.002  # seconds between two enqueues of one producer: interleave, not flood
WATCHDOG = 60.0  # a child never outlives this, whatever happens
DRAIN_TIMEOUT = 45.0


def planned_failures(event_id: int) -> int:
    """How many times the handler raises for this event before it succeeds."""
    if event_id <= 0:
        return 0
    if event_id % 30 == 0:
        return 2
    return 1 if event_id % 10 == 0 else 0


class Log:
    """Whole lines appended with one ``os.write`` each; safe to share between threads."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, *fields: object) -> None:
        data = (" ".join(str(field) for field in fields) + "\n").encode()
        written = os.write(self._fd, data)
        if written != len(data):  # never for a few bytes on a regular file
            raise OSError(f"short write: {written} of {len(data)} bytes")


def define(runtime: Runtime, log: Log) -> WorkerPool:
    def execute(ctx: EventContext) -> None:
        event_id = ctx.event
        if ctx.attempt <= planned_failures(event_id):
            raise RuntimeError(f"planned failure of {event_id} on attempt {ctx.attempt}")
        if event_id % 3 == 0:
            ctx.sleep(0.002)  # some work, so that kills land inside handlers too
        if event_id > 0 and event_id % FOLLOW_UP_EVERY == 0:
            ctx.enqueue(-event_id)
        log.line("X", event_id, ctx.instance_index, ctx.sequence, ctx.attempt)

    return runtime.define(
        POOL, execute=execute, concurrency=CONCURRENCY, retry=RETRY, dedup_window=DEDUP_WINDOW
    )


def to_cancel(event_id: int) -> bool:
    """Whether ``event_id`` is enqueued ``CANCEL_DELAY`` ahead, then cancelled (a kill
    between the two lets it run, late)."""
    return event_id % CANCEL_EVERY == 0 and event_id % DEDUP_EVERY != 0


def delay_of(event_id: int) -> float | None:
    """The delay ``event_id`` is enqueued with, if any: it then runs by its due time."""
    if to_cancel(event_id):
        return CANCEL_DELAY
    return DELAY if event_id % DELAYED_EVERY == 0 else None


def submit(pool: WorkerPool, log: Log, event_id: int) -> None:
    """Enqueue ``event_id`` (with its dedup key, delay and ttl, if it has them) and log the
    answer; cancel it at once if it is one to cancel."""
    log.line("T", event_id)
    keyed = event_id % DEDUP_EVERY == 0
    cancelled = to_cancel(event_id)
    delay = delay_of(event_id)
    key = f"k{event_id}" if keyed else None
    ttl = TTL if event_id % TTL_EVERY == 0 and not keyed and delay is None else None
    result = pool.enqueue(event_id, delay=delay, dedup_key=key, ttl=ttl)
    log.line("D" if result.duplicate else "A", event_id, result.instance_index, result.sequence)
    if cancelled:
        log.line("K", event_id)
        log.line("C", event_id, int(pool.cancel(result.event_id)))


def produce(
    pool: WorkerPool,
    log: Log,
    first: int,
    count: int,
    acked: threading.Event,
    failed: threading.Event,
) -> None:
    pause = threading.Event()  # never set: wait() is a plain real-time pause
    try:
        if first > GENERATION_STRIDE:  # the same producer's keyed ids, one generation back
            before = first - GENERATION_STRIDE
            for event_id in range(before, before + RESUBMITTED):
                if event_id % DEDUP_EVERY == 0:
                    submit(pool, log, event_id)
        for event_id in range(first, first + count):
            submit(pool, log, event_id)
            if event_id % DEDUP_EVERY == 0:
                submit(pool, log, event_id)  # again: a duplicate of the one just stored
            acked.set()
            pause.wait(PRODUCER_PAUSE)
    except BaseException:
        traceback.print_exc()
        failed.set()
        acked.set()  # wake main()


def run(runtime: Runtime, log: Log, generation: int, rng: random.Random) -> int:
    pool = define(runtime, log)
    acked, failed = threading.Event(), threading.Event()
    producers = [
        threading.Thread(
            target=produce,
            args=(
                pool,
                log,
                generation * GENERATION_STRIDE + p * PRODUCER_STRIDE + 1,
                rng.randint(20, 300),
                acked,
                failed,
            ),
            name=f"producer-{p}",
            daemon=True,
        )
        for p in range(PRODUCERS)
    ]
    for producer in producers:
        producer.start()
    acked.wait(WATCHDOG)
    if failed.is_set():
        return 4
    print("ready", flush=True)
    for producer in producers:
        producer.join(WATCHDOG)
    if failed.is_set():
        return 4
    # Done enqueuing: keep processing (or idling) until the parent's kill or the watchdog.
    threading.Event().wait(WATCHDOG)
    return 3


def drain(runtime: Runtime, log: Log) -> int:
    pool = define(runtime, log)
    joined = pool.join(timeout=DRAIN_TIMEOUT)
    report = {
        "joined": joined,
        "status": dataclasses.asdict(pool.status()),
        "dead_letters": [
            [dead.event, dead.instance_index, dead.sequence, dead.attempts, dead.error]
            for dead in pool.dead_letters()
        ],
    }
    print(json.dumps(report), flush=True)
    return 0 if joined else 2


def main(argv: list[str]) -> int:
    store, log_dir, durability, role, generation, seed = argv
    watchdog = threading.Timer(WATCHDOG, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    log = Log(os.path.join(log_dir, f"gen-{int(generation):02d}.log"))
    # Its failures are planned, and its stderr must stay empty of anything else.
    for planned in ("dopool.attempts", "dopool.dead_letters"):
        logging.getLogger(planned).setLevel(logging.CRITICAL)
    with Runtime(store, durability=durability, seed=int(seed)) as runtime:
        print("opened", flush=True)
        if role == "run":
            return run(runtime, log, int(generation), random.Random(int(seed)))
        if role == "drain":
            return drain(runtime, log)
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
