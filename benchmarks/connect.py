"""``python -m benchmarks.connect``: enqueue-to-start latency from a producer in another process.

A runtime in this process owns a fresh store (one pool, 4 instances, a handler that
does nothing); a producer process (``dopool.connect``) enqueues events one at a time,
a random pause apart, so each finds its instance idle. The latency of an event is its
start (``ctx.started_at``) minus the wall clock's time just before the producer's call,
which the event carries: the same clock, on one machine. It is measured three ways:

- **through the owner**: ``via_owner=True``, the producer's call stored (and the event
  started) by the runtime, in its commit;
- **stored, wake-up**: ``via_owner=False``, the producer's own commit, then its
  datagram wakes the instance;
- **poll only**: stored by the producer, the runtime's socket never bound, so every
  event waits for the runtime's poll (``poll_interval``, 1 s by default): what a lost
  wake-up costs.

It prints p50, p99 and the maximum of each. Nothing here asserts on timings. Example::

    python -m benchmarks.connect                          # 300 wake-ups, 40 polls
    python -m benchmarks.connect --samples 1000 --poll-samples 100 --durability async
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from unittest.mock import patch

import dopool
from benchmarks.harness import latency_line
from dopool import EventContext, Runtime
from dopool._engine.wakeups import StoreWatcher

POOL = "latency"
TIMEOUT = 300.0


def produce(
    store: str, samples: int, low: float, high: float, durability: str, via_owner: bool
) -> None:
    """The producer process: ``samples`` enqueues, ``low``-``high`` seconds apart, each
    carrying the wall clock's time just before its call."""
    pause = random.Random(1)
    with dopool.connect(store, durability=durability, via_owner=via_owner) as connection:
        pool = connection.pool(POOL)
        for n in range(samples):
            time.sleep(pause.uniform(low, high))
            pool.enqueue({"n": n, "called": time.time()})


def measure(
    samples: int,
    low: float,
    high: float,
    *,
    wake_ups: bool,
    poll: float,
    durability: str,
    via_owner: bool = False,
) -> list[float]:
    """Latencies in seconds, one per event, from the producer's call to the event's start:
    through the owner, or stored by the producer with the runtime listening or polling."""
    latencies: list[float] = []
    done = threading.Event()

    def handler(ctx: EventContext) -> None:
        latencies.append(ctx.started_at - ctx.event["called"])
        if len(latencies) == samples:
            done.set()

    # Poll only: the runtime's wake-up socket is never bound.
    unbound = nullcontext() if wake_ups else patch.object(StoreWatcher, "_bind", return_value=None)
    with unbound, tempfile.TemporaryDirectory(prefix="dopool-connect-") as directory:
        store = Path(directory) / "store"
        with Runtime(store, durability=durability, poll_interval=poll) as runtime:
            runtime.define(POOL, execute=handler, concurrency=4)
            child = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.connect",
                    "--produce",
                    str(store),
                    str(samples),
                    str(low),
                    str(high),
                    durability,
                    str(int(via_owner)),
                ],
                cwd=Path(__file__).resolve().parent.parent,  # where ``benchmarks`` is
                timeout=TIMEOUT,
                check=True,
            )
            assert child.returncode == 0
            if not done.wait(TIMEOUT):
                raise RuntimeError(f"only {len(latencies)} of {samples} events started")
    return latencies


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.connect", description=__doc__)
    parser.add_argument("--samples", type=int, default=300, help="events with wake-ups")
    parser.add_argument("--poll-samples", type=int, default=40, help="events with polls only")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="the runtime's poll")
    parser.add_argument("--durability", choices=("sync", "async"), default="sync")
    parser.add_argument("--produce", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.produce:
        store, samples, low, high, durability, via = args.produce
        produce(store, int(samples), float(low), float(high), durability, via == "1")
        return 0
    print(
        f"enqueue-to-start latency, producer process -> runtime process ({args.durability}; "
        f"poll_interval {args.poll_interval:g} s)"
    )
    poll, durability = args.poll_interval, args.durability
    owner = measure(
        args.samples, 0.005, 0.015, wake_ups=True, poll=poll, durability=durability, via_owner=True
    )
    print(latency_line("through the owner", owner), flush=True)
    woken = measure(args.samples, 0.005, 0.015, wake_ups=True, poll=poll, durability=durability)
    print(latency_line("stored, wake-up", woken), flush=True)
    polled = measure(args.poll_samples, 0.02, 0.2, wake_ups=False, poll=poll, durability=durability)
    print(latency_line("poll only", polled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
