"""``python -m benchmarks.activation``: what a pool's instances cost now that each runs only
while it has something to do, at most ``max_active`` at once (docs/guarantees.md,
"Instances started when first used" and "At most max_active at once").

Under the real clock (``durability="async"``, the store in ``--dir``):

- **define**: seconds to define a pool of ``--instances`` (a million) on a new store;
- **touch**: one event to each of ``--keys`` (100,000) partition keys of a pool with an
  instance per key (``concurrency="per-key"``), in a runtime running at most
  ``--max-active`` instances at once (default: the runtime's, 1,024), run to the end: the
  seconds the enqueues took (those for instances waiting for a slot are stored from the
  caller's thread) and the whole run took, the instances started, the OS threads at most
  (sampled in every handler) against the bound, and the anonymous memory (``RssAnon``)
  grown, per instance touched and per instance running at most;
- **evict**: once ``--idle-timeout`` has passed, the instances still running, the threads
  and the anonymous memory left;
- **reopen**: seconds to open the store again and define the pool, with every touched
  instance's record stored and ``--work`` (1,000) of them holding a paused event (the
  ones ``define`` starts, or puts in line for a slot);
- **status**: seconds for ``status()`` of the reopened pool (one read per instance used).
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from dopool import EventContext, PoolEvent, Runtime, WorkerPool


def anonymous_kib() -> int:
    """This process's resident anonymous memory, KiB (0 where /proc says nothing)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Threads:
    """The most OS threads seen, sampled from the handlers, and the most instances running."""

    def __init__(self) -> None:
        self.peak = threading.active_count()
        self.running = 0
        self.most_running = 0

    def handle(self, _ctx: EventContext) -> None:
        self.peak = max(self.peak, threading.active_count())

    def event(self, event: PoolEvent) -> None:
        if event.kind == "activated":
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        elif event.kind == "evicted":
            self.running -= 1


def define(runtime: Runtime, threads: Threads, args: argparse.Namespace) -> WorkerPool:
    """The pool of an instance per room."""
    return runtime.define(
        "rooms", execute=threads.handle, concurrency="per-key", idle_timeout=args.idle_timeout
    )


def running(pool: WorkerPool) -> int:
    active = pool.status().active
    return 0 if active is None else active


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.activation", description=__doc__)
    parser.add_argument("--instances", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--work", type=int, default=1000, help="instances left holding an event")
    parser.add_argument("--max-active", type=int, default=None, help="the runtime's bound")
    parser.add_argument("--idle-timeout", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=None, help="where to make the store")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="dopool-activation-", dir=args.dir))
    store = directory / "store"
    threads = Threads()
    try:
        with Runtime(store, durability="async", max_active=args.max_active) as runtime:
            bound = runtime.max_active
            clock = time.perf_counter()
            runtime.define("numbered", execute=threads.handle, concurrency=args.instances)
            defined = time.perf_counter() - clock
            before, base_threads = anonymous_kib(), threading.active_count()
            pool = define(runtime, threads, args)
            runtime.subscribe(threads.event)
            clock = time.perf_counter()
            for key in range(args.keys):
                pool.enqueue(key, partition_key=f"room-{key}")
            enqueued = time.perf_counter() - clock
            if not pool.join(timeout=3600):
                raise RuntimeError("the pool did not drain")
            ran = time.perf_counter() - clock
            touched = pool.status().used
            grown = anonymous_kib() - before
            at_end = running(pool)
            deadline = time.monotonic() + args.idle_timeout * 4 + 5
            while running(pool) and time.monotonic() < deadline:
                time.sleep(args.idle_timeout / 4)  # the benchmark's own wait, not a test's
            left, left_threads, left_kib = running(pool), threading.active_count(), anonymous_kib()
            pool.pause()  # the pool, and each instance touched: the first --work keep an event
            for key in range(args.work):
                pool.enqueue(key, partition_key=f"room-{key}")
        # The first runtime's garbage (its evicted instances' cells, actors, threads) is
        # this process's, not a reopen's: collected before the clock starts, not during.
        gc.collect()
        clock = time.perf_counter()
        with Runtime(store, durability="async", max_active=args.max_active) as runtime:
            pool = define(runtime, threads, args)
            reopened, started = time.perf_counter() - clock, running(pool)
            waiting = pool.status().waiting
            clock = time.perf_counter()
            used = pool.status().used
            read = time.perf_counter() - clock
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    most = max(threads.most_running, 1)
    print(f"define   {args.instances:,} instances in {defined * 1000:.1f} ms")
    print(
        f"touch    {args.keys:,} keys -> {touched:,} instances, max_active={bound}: enqueued in "
        f"{enqueued:.1f} s, all run in {ran:.1f} s; {threads.most_running:,} instances running "
        f"at most, {threads.peak:,} OS threads at most ({base_threads} before); "
        f"{at_end:,} running at the end"
    )
    print(
        f"memory   anonymous +{grown / 1024:.1f} MiB: {grown / max(touched, 1):.2f} KiB per "
        f"instance touched, {grown / most:.1f} KiB per instance running at most"
    )
    print(
        f"evict    {left:,} instances running after the idle timeout ({args.idle_timeout:g} s), "
        f"{left_threads:,} threads, anonymous memory +{(left_kib - before) / 1024:.1f} MiB "
        "over the start"
    )
    print(
        f"reopen   {reopened * 1000:.1f} ms with {used:,} per-key instances used, "
        f"{started:,} instances started by define and {waiting:,} in line ({args.work:,} "
        "held events)"
    )
    print(f"status   {read * 1000:.1f} ms over {used:,} instances used")
    return 0


if __name__ == "__main__":
    sys.exit(main())
