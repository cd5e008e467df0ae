"""Throughput of a durable pool on disk, beside the raw LMDB ceiling of the same disk.

Each run opens a fresh store in its own directory under a work directory, with a
real clock, times one scenario with :func:`time.perf_counter`, checks that every
event succeeded, and removes the store. Opening and closing the runtime are not
timed. Rates are events per second.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from dopool import EventContext, Runtime, WorkerPool

MODES = ("sync", "async")
CONCURRENCY = 4
PRODUCERS = 4
BATCH_SIZE = 1_000
BATCHES = 10
POOL_NAME = "bench"
# Generous: a stalled pool fails the run instead of hanging it.
JOIN_TIMEOUT = 120.0
# The same LMDB options as dopool's store (map size is address space, not disk).
_MAP_SIZE = 1 << 36

Rates = dict[str, float]


def make_event(number: int) -> dict[str, Any]:
    """A small event, the same size for every ``number`` below 2**32 (a uint64 ``n``)."""
    return {"n": (1 << 32) + number, "body": "x" * 64}


def stored_value_size() -> int:
    """Bytes of the value dopool stores for one event: its msgpack record."""
    event = msgpack.packb(make_event(0), use_bin_type=True)
    record = msgpack.packb([event, time.time(), None, 0], use_bin_type=True)
    return len(record)


def no_op(ctx: EventContext) -> None:
    """The benchmark handler: succeed at once."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured rate over the repeats of a scenario."""

    scenario: str
    mode: str
    metric: str
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "mode": self.mode,
            "metric": self.metric,
            "unit": "events/s",
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "samples": list(self.samples),
        }


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named measurement: ``run(mode, store_dir)`` returns rates by metric name."""

    name: str
    run: Callable[[str, Path], Rates]


@contextmanager
def _pool(mode: str, store: Path) -> Iterator[WorkerPool]:
    with Runtime(store, durability=mode) as runtime:
        yield runtime.define(POOL_NAME, execute=no_op, concurrency=CONCURRENCY)


def _finish(pool: WorkerPool, expected: int) -> float:
    """Wait for the pool to process everything; the time it finished."""
    if not pool.join(timeout=JOIN_TIMEOUT):
        raise RuntimeError(f"pool did not finish {expected} events in {JOIN_TIMEOUT:g} s")
    finished = time.perf_counter()
    status = pool.status()
    if status.succeeded != expected or status.pending:
        raise RuntimeError(
            f"expected {expected} succeeded, got {status.succeeded} ({status.pending} pending)"
        )
    return finished


def _rates(count: int, start: float, enqueued: float, finished: float) -> Rates:
    """Enqueue rate up to the last enqueue, end-to-end rate up to the last completion."""
    return {"enqueue/s": count / (enqueued - start), "processed/s": count / (finished - start)}


def sequential(events: int) -> Callable[[str, Path], Rates]:
    """One producer calls ``enqueue`` ``events`` times; then the pool drains."""

    def run(mode: str, store: Path) -> Rates:
        payloads = [make_event(i) for i in range(events)]
        with _pool(mode, store) as pool:
            start = time.perf_counter()
            for event in payloads:
                pool.enqueue(event)
            enqueued = time.perf_counter()
            finished = _finish(pool, events)
        return _rates(events, start, enqueued, finished)

    return run


def producers(events: int, threads: int = PRODUCERS) -> Callable[[str, Path], Rates]:
    """``threads`` producers share ``events`` single enqueues while the pool runs."""

    def run(mode: str, store: Path) -> Rates:
        shares = [range(i, events, threads) for i in range(threads)]
        with _pool(mode, store) as pool:
            barrier = threading.Barrier(threads + 1)

            def produce(share: range) -> None:
                payloads = [make_event(i) for i in share]
                barrier.wait()
                for event in payloads:
                    pool.enqueue(event)

            with ThreadPoolExecutor(threads, thread_name_prefix="producer") as executor:
                futures = [executor.submit(produce, share) for share in shares]
                start = time.perf_counter()
                barrier.wait()
                for future in futures:
                    future.result()  # re-raises a producer's error
            enqueued = time.perf_counter()
            finished = _finish(pool, events)
        return _rates(events, start, enqueued, finished)

    return run


def batches(size: int = BATCH_SIZE, count: int = BATCHES) -> Callable[[str, Path], Rates]:
    """``count`` calls of ``enqueue_many`` with ``size`` events each; then the pool drains."""

    def run(mode: str, store: Path) -> Rates:
        chunks = [[make_event(b * size + i) for i in range(size)] for b in range(count)]
        total = size * count
        with _pool(mode, store) as pool:
            start = time.perf_counter()
            for chunk in chunks:
                pool.enqueue_many(chunk)
            enqueued = time.perf_counter()
            finished = _finish(pool, total)
        return _rates(total, start, enqueued, finished)

    return run


def raw_lmdb(events: int) -> Callable[[str, Path], Rates]:
    """The ceiling: one ``put`` per LMDB write transaction, same value size, no dopool.

    Mode ``"sync"`` opens the environment with ``sync=True`` (an fsync per commit,
    the ceiling for dopool's ``"sync"``); ``"async"`` with ``sync=False``.
    """

    def run(mode: str, store: Path) -> Rates:
        sync = mode == "sync"
        value = b"v" * stored_value_size()
        keys = [b"Ibench:0\0q" + i.to_bytes(12, "big") for i in range(events)]
        env = lmdb.open(
            str(store),
            map_size=_MAP_SIZE,
            subdir=True,
            sync=sync,
            metasync=sync,
            readahead=False,
        )
        try:
            start = time.perf_counter()
            for key in keys:
                with env.begin(write=True) as txn:
                    txn.put(key, value)
            finished = time.perf_counter()
        finally:
            env.close()
        return {"put/s": events / (finished - start)}

    return run


def scenarios(events: int) -> list[Scenario]:
    """Every scenario, in the order they are run and printed."""
    return [
        Scenario("sequential enqueue", sequential(events)),
        Scenario(f"{PRODUCERS} producer threads", producers(events)),
        Scenario(f"enqueue_many {BATCH_SIZE:,} x {BATCHES}", batches()),
        Scenario("raw LMDB, 1 put/txn", raw_lmdb(events)),
    ]


@contextmanager
def work_directory(parent: Path | None) -> Iterator[Path]:
    """A fresh temporary directory under ``parent`` (default: the current one), removed after."""
    base = Path.cwd() if parent is None else parent
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="dopool-bench-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def measure(
    events: int,
    repeat: int,
    parent: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Figure]:
    """Run every scenario ``repeat`` times in both durability modes; one figure per metric.

    Repeats are interleaved (all scenarios, then all again) so that a slow spell of
    the disk spreads over every scenario rather than landing on one.
    """
    plan = [(scenario, mode) for scenario in scenarios(events) for mode in MODES]
    samples: dict[tuple[str, str, str], list[float]] = {}
    with work_directory(parent) as root:
        for round_ in range(repeat):
            for number, (scenario, mode) in enumerate(plan):
                if progress is not None:
                    progress(f"round {round_ + 1}/{repeat}: {scenario.name} ({mode})")
                store = root / f"run-{round_}-{number}"
                try:
                    rates = scenario.run(mode, store)
                finally:
                    shutil.rmtree(store, ignore_errors=True)
                for metric, rate in rates.items():
                    samples.setdefault((scenario.name, mode, metric), []).append(rate)
    return [
        Figure(scenario, mode, metric, tuple(values))
        for (scenario, mode, metric), values in samples.items()
    ]
