"""dopool's scenarios: a durable pool on disk with a real clock and no-op handlers.

Each run opens a fresh :class:`~dopool.Runtime` on its own directory, times one
scenario with :func:`time.perf_counter`, checks the outcome (every event succeeded,
nothing pending) and raises if it is wrong. Opening and closing the runtime are not
timed, except where the scenario is about them (``scale``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    TIMEOUT,
    Case,
    Reading,
    Sizes,
    body_for,
    make_event,
    memory_kib,
    percentile,
    rate,
    run_producers,
)
from dopool import EventContext, Runtime, WorkerPool

MODES = ("sync", "async")
POOL_NAME = "bench"
# Latency samples skip this many events first: a fresh store's first writes fault in pages.
WARM_UP = 10


def system(mode: str) -> str:
    """The name of dopool in one durability mode, as the table and the targets use it."""
    return f"dopool {mode}"


def no_op(ctx: EventContext) -> None:
    """The benchmark handler: succeed at once."""


@contextmanager
def _pool(
    store: Path,
    mode: str,
    concurrency: int,
    execute: Callable[[EventContext], None] = no_op,
    name: str = POOL_NAME,
) -> Iterator[WorkerPool]:
    with Runtime(store, durability=mode) as runtime:
        yield runtime.define(name, execute=execute, concurrency=concurrency)


def _finish(pool: WorkerPool, expected: int) -> float:
    """Wait until the pool is idle, check that ``expected`` events succeeded; the time it was."""
    if not pool.join(timeout=TIMEOUT):
        raise RuntimeError(f"pool did not finish {expected:,} events in {TIMEOUT:g} s")
    finished = time.perf_counter()
    _check(pool, succeeded=expected, pending=0)
    return finished


def _check(pool: WorkerPool, *, succeeded: int | None = None, pending: int | None = None) -> None:
    """Raise unless the pool's committed counters are as expected."""
    status = pool.status()
    wanted = {"succeeded": succeeded, "pending": pending}
    found = {"succeeded": status.succeeded, "pending": status.pending}
    if any(value is not None and found[name] != value for name, value in wanted.items()):
        expected = ", ".join(f"{v:,} {k}" for k, v in wanted.items() if v is not None)
        raise RuntimeError(
            f"expected {expected}; the pool has {status.succeeded:,} succeeded, "
            f"{status.pending:,} pending, {status.dead_lettered:,} dead-lettered"
        )


def end_to_end(mode: str, sizes: Sizes) -> Case:
    """Producer threads enqueue one event per call while the pool runs; until the last is done."""

    def run(store: Path) -> list[Reading]:
        with _pool(store, mode, sizes.concurrency) as pool:
            start, enqueued = run_producers(pool.enqueue, sizes.events, sizes.producers)
            finished = _finish(pool, sizes.events)
        return [
            Reading("end-to-end", "events/s", rate(sizes.events, finished - start)),
            Reading("enqueue", "events/s", rate(sizes.events, enqueued - start)),
        ]

    return Case("e2e", system(mode), run)


def sequential(mode: str, sizes: Sizes) -> Case:
    """One thread calls ``enqueue`` N times into a paused pool, then N times into a running one.

    The paused pool gives what an enqueue costs on its own, measured as the raw
    single-put ceiling is. In the running pool the enqueues share the disk with the
    processing of the events they deliver; the pool then drains.
    """

    def run(store: Path) -> list[Reading]:
        events = [make_event(i) for i in range(sizes.sequential)]
        with _pool(store, mode, sizes.concurrency) as pool:
            pool.pause()
            start = time.perf_counter()
            for event in events:
                pool.enqueue(event)
            paused = rate(sizes.sequential, time.perf_counter() - start)
            _check(pool, pending=sizes.sequential)
            pool.drain()
            pool.resume()
            start = time.perf_counter()
            for event in events:
                pool.enqueue(event)
            enqueued = time.perf_counter()
            finished = _finish(pool, sizes.sequential)
        return [
            Reading("enqueue, paused pool", "events/s", paused),
            Reading("enqueue, running pool", "events/s", rate(sizes.sequential, enqueued - start)),
            Reading("processed", "events/s", rate(sizes.sequential, finished - start)),
        ]

    return Case("sequential", system(mode), run)


def batches(mode: str, sizes: Sizes) -> Case:
    """``enqueue_many`` of fixed-size chunks, twice: into a paused pool, then a draining one.

    The calls are timed. The first round measures what ``enqueue_many`` itself
    costs; the second, the same while the pool's instances compete for the
    interpreter. Then the drain of both rounds is timed from ``resume``.
    """

    def run(store: Path) -> list[Reading]:
        size, count = sizes.batch_size, sizes.batches
        chunks = [[make_event(b * size + i) for i in range(size)] for b in range(2 * count)]
        total = size * count

        def send(pool: WorkerPool, round_: list[list[dict[str, Any]]]) -> float:
            spent = 0.0
            for chunk in round_:
                before = time.perf_counter()
                results = pool.enqueue_many(chunk)
                spent += time.perf_counter() - before
                if len(results) != len(chunk):
                    raise RuntimeError(f"enqueue_many stored {len(results)} of {len(chunk)}")
            return spent

        with _pool(store, mode, sizes.concurrency) as pool:
            pool.pause()
            paused = send(pool, chunks[:count])
            start = time.perf_counter()
            pool.resume()
            draining = send(pool, chunks[count:])
            finished = _finish(pool, 2 * total)
        return [
            Reading("enqueue", "events/s", rate(total, paused)),
            Reading("enqueue, pool draining", "events/s", rate(total, draining)),
            Reading("processed", "events/s", rate(2 * total, finished - start)),
        ]

    return Case("enqueue_many", system(mode), run)


def latency(mode: str, sizes: Sizes) -> Case:
    """Enqueue to handler start on an idle pool, one event at a time.

    Each sample runs from just before ``enqueue`` to the first line of the handler;
    the next event is enqueued only once the pool is idle again (``join``).
    """

    def run(store: Path) -> list[Reading]:
        started: dict[int, float] = {}
        ready = threading.Event()

        def record(ctx: EventContext) -> None:
            started[ctx.event["n"]] = time.perf_counter()
            ready.set()

        total = WARM_UP + sizes.latency
        samples = []
        with _pool(store, mode, sizes.concurrency, record) as pool:
            for number in range(total):
                ready.clear()
                before = time.perf_counter()
                pool.enqueue(make_event(number))
                if not ready.wait(TIMEOUT):
                    raise RuntimeError(f"event {number} did not start in {TIMEOUT:g} s")
                if number >= WARM_UP:
                    samples.append(started[number] - before)
                if not pool.join(timeout=TIMEOUT):
                    raise RuntimeError(f"pool did not go idle after event {number}")
            _check(pool, succeeded=total, pending=0)
        return [
            Reading("p50", "ms", percentile(samples, 0.50) * 1e3),
            Reading("p99", "ms", percentile(samples, 0.99) * 1e3),
        ]

    return Case("latency", system(mode), run)


def depth(sizes: Sizes) -> Case:
    """Per-enqueue cost with a shallow and with a deep queue, and the memory the depth costs.

    A paused pool (sync, concurrency 1) is filled with ``enqueue_many`` (not timed) to
    ``shallow`` pending events, then ``probe`` single enqueues are timed; likewise at
    ``depth`` pending. Then the pool resumes and the time to process the first
    ``probe`` events from the head of the deep queue is measured. Resident memory is
    read before the first fill and after the deep probe; VmRSS counts the pages of
    LMDB's memory map that were touched (file-backed, which the kernel can reclaim),
    so it is reported split into anonymous and file-backed growth as well.
    """

    body = body_for(sizes.depth_event_bytes)
    first = 1 << 16  # numbers from here on encode to the same size (see body_for)

    def run(store: Path) -> list[Reading]:
        done = threading.Event()
        processed = 0

        def count(ctx: EventContext) -> None:
            nonlocal processed  # one instance: one thread runs this
            processed += 1
            if processed == sizes.probe:
                done.set()

        pending = 0
        with _pool(store, "sync", 1, count, name="deep") as pool:
            pool.pause()
            before = memory_kib()

            def fill(to: int) -> float:
                nonlocal pending
                filled, start = to - pending, time.perf_counter()
                while pending < to:
                    chunk = min(sizes.batch_size, to - pending)
                    pool.enqueue_many([make_event(first + pending + i, body) for i in range(chunk)])
                    pending += chunk
                seconds = time.perf_counter() - start
                _check(pool, pending=pending)
                return rate(filled, seconds) if filled else 0.0

            def probe() -> float:
                nonlocal pending
                events = [make_event(first + pending + i, body) for i in range(sizes.probe)]
                start = time.perf_counter()
                for event in events:
                    pool.enqueue(event)
                seconds = time.perf_counter() - start
                pending += sizes.probe
                _check(pool, pending=pending)
                return seconds / sizes.probe

            fill(sizes.shallow)
            shallow = probe()
            fill_rate = fill(sizes.depth)
            deep = probe()
            after = memory_kib()
            pool.resume()
            start = time.perf_counter()
            if not done.wait(TIMEOUT):
                raise RuntimeError(f"{sizes.probe} events not processed in {TIMEOUT:g} s")
            head = rate(sizes.probe, time.perf_counter() - start)
            pool.pause()  # so that closing does not wait for the rest of the queue
        return [
            Reading("enqueue, shallow", "µs/event", shallow * 1e6),
            Reading("enqueue, deep", "µs/event", deep * 1e6),
            Reading("deep / shallow", "ratio", deep / shallow),
            Reading("processed from head, deep", "events/s", head),
            Reading("fill (enqueue_many)", "events/s", fill_rate),
            Reading("RSS growth", "MiB", (after["VmRSS"] - before["VmRSS"]) / 1024),
            Reading("anonymous RSS growth", "MiB", (after["RssAnon"] - before["RssAnon"]) / 1024),
            Reading("file-backed RSS growth", "MiB", (after["RssFile"] - before["RssFile"]) / 1024),
        ]

    return Case("depth", depth_system(sizes), run, once=True)


def depth_system(sizes: Sizes) -> str:
    return f"dopool sync c=1, {sizes.shallow:,} vs {sizes.depth:,} pending"


def scale(sizes: Sizes) -> Case:
    """Many instances: the time to define them, their memory, and a round-robin drain."""

    def run(store: Path) -> list[Reading]:
        events = [make_event(i) for i in range(sizes.scale_events)]
        with Runtime(store, durability="sync") as runtime:
            before = memory_kib()
            start = time.perf_counter()
            pool = runtime.define("wide", execute=no_op, concurrency=sizes.instances)
            defined = time.perf_counter()
            after = memory_kib()
            start_drain = time.perf_counter()
            results = pool.enqueue_many(events)
            if len(results) != len(events):
                raise RuntimeError(f"enqueue_many stored {len(results)} of {len(events)}")
            finished = _finish(pool, sizes.scale_events)
            closing = time.perf_counter()
        closed = time.perf_counter()
        per_instance = (after["VmRSS"] - before["VmRSS"]) / sizes.instances
        return [
            Reading("start (define)", "s", defined - start),
            Reading("RSS per instance", "KiB", per_instance),
            Reading("drain", "events/s", rate(sizes.scale_events, finished - start_drain)),
            Reading("close", "s", closed - closing),
        ]

    return Case("scale", scale_system(sizes), run)


def scale_system(sizes: Sizes) -> str:
    return f"dopool sync c={sizes.instances:,}"


def cases(sizes: Sizes) -> list[Case]:
    """dopool's cases, scenario by scenario."""
    found = []
    found += [end_to_end(mode, sizes) for mode in MODES]
    found += [sequential(mode, sizes) for mode in MODES]
    found += [batches(mode, sizes) for mode in MODES]
    found += [latency(mode, sizes) for mode in MODES]
    found.append(depth(sizes))
    found.append(scale(sizes))
    return found
