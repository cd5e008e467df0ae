"""``python -m benchmarks.lateness``: how late a delayed event starts under a real clock.

A runtime owns a fresh store (one pool, 4 instances, a handler that does nothing). The
caller enqueues events one at a time, each with a ``delay`` drawn from ``--low`` to
``--high`` seconds, a short random pause apart: a light load, in which every instance is
idle when its event falls due. An event's lateness is its start (``ctx.started_at``)
minus its due time (its enqueue's clock reading plus its delay, both on the runtime's
wall clock). For comparison the same number of events is enqueued without a delay, and
their start minus their enqueue is reported beside.

It prints the minimum (a negative one would be an event started early), p50, p99 and the
maximum of each. Nothing here asserts on timings. Example::

    python -m benchmarks.lateness                      # 400 events, delays 10-200 ms
    python -m benchmarks.lateness --samples 1000 --durability async
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import latency_line
from dopool import EventContext, Runtime

TIMEOUT = 300.0


def measure(
    samples: int, low: float, high: float, *, delayed: bool, durability: str
) -> list[float]:
    """Seconds from each event's due time to its start, one per event."""
    lateness: list[float] = []
    done = threading.Event()

    def handler(ctx: EventContext) -> None:
        lateness.append(ctx.started_at - float(ctx.event))
        if len(lateness) == samples:
            done.set()

    draw = random.Random(1)
    with (
        tempfile.TemporaryDirectory(prefix="dopool-lateness-") as directory,
        Runtime(Path(directory) / "store", durability=durability) as runtime,
    ):
        pool = runtime.define("late", execute=handler, concurrency=4)
        for _ in range(samples):
            delay = draw.uniform(low, high) if delayed else 0.0
            # The due time, on the clock the runtime stamps its starts with: read just
            # before the enqueue, so a due time can only be early, never late.
            due = runtime.clock.now() + delay
            pool.enqueue(due, delay=delay or None)
            time.sleep(draw.uniform(0.001, 0.005))
        if not done.wait(TIMEOUT):
            raise RuntimeError(f"only {len(lateness)} of {samples} events started")
    return lateness


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lateness", description=__doc__)
    parser.add_argument("--samples", type=int, default=400, help="events of each kind")
    parser.add_argument("--low", type=float, default=0.01, help="shortest delay, seconds")
    parser.add_argument("--high", type=float, default=0.2, help="longest delay, seconds")
    parser.add_argument("--durability", choices=("sync", "async"), default="sync")
    args = parser.parse_args(argv)
    print(
        f"start minus due time, real clock ({args.durability}; delays "
        f"{args.low * 1e3:g}-{args.high * 1e3:g} ms)"
    )
    kinds = (("delayed", True), ("immediate", False))
    for name, delayed in kinds:
        values = measure(
            args.samples, args.low, args.high, delayed=delayed, durability=args.durability
        )
        print(latency_line(name, values, minimum=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
