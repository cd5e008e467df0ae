"""``python -m benchmarks.activation``: what a pool's instances cost now that each runs only
while it has something to do (docs/guarantees.md, "Instances started when first used").

Under the real clock (``durability="async"``, the store in ``--dir``):

- **define**: seconds to define a pool of ``--instances`` (a million) on a new store;
- **touch**: one event to each of ``--keys`` partition keys of a pool with an instance per
  key (``concurrency="per-key"``), run to the end: the instances started, the OS threads
  at most (sampled in every handler), and the anonymous memory (``RssAnon``) grown per
  instance started;
- **evict**: once ``--idle-timeout`` has passed, the instances still running, the threads
  and the anonymous memory left;
- **reopen**: seconds to open the store again and define the pool, with every touched
  instance's record stored and ``--work`` of them holding a paused event (the ones
  ``define`` starts);
- **status**: seconds for ``status()`` of the reopened pool (one read per instance used).

A bound on the threads (``max_active``) is issue 29's next step: until then the threads
are the instances busy within an idle timeout of each other.
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

from dopool import EventContext, Runtime, WorkerPool


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
    """The most OS threads seen, sampled from the handlers."""

    def __init__(self) -> None:
        self.peak = threading.active_count()

    def handle(self, _ctx: EventContext) -> None:
        self.peak = max(self.peak, threading.active_count())


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
    parser.add_argument("--keys", type=int, default=4096)
    parser.add_argument("--work", type=int, default=100, help="instances left holding an event")
    parser.add_argument("--idle-timeout", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=None, help="where to make the store")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="dopool-activation-", dir=args.dir))
    store = directory / "store"
    threads = Threads()
    try:
        with Runtime(store, durability="async") as runtime:
            clock = time.perf_counter()
            runtime.define("numbered", execute=threads.handle, concurrency=args.instances)
            defined = time.perf_counter() - clock
            before = anonymous_kib()
            pool = define(runtime, threads, args)
            for key in range(args.keys):
                pool.enqueue(key, partition_key=f"room-{key}")
            if not pool.join(timeout=600):
                raise RuntimeError("the pool did not drain")
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
        with Runtime(store, durability="async") as runtime:
            pool = define(runtime, threads, args)
            reopened, started = time.perf_counter() - clock, running(pool)
            clock = time.perf_counter()
            used = pool.status().used
            read = time.perf_counter() - clock
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"define   {args.instances:,} instances in {defined * 1000:.1f} ms")
    print(
        f"touch    {args.keys:,} keys -> {touched:,} instances started; {threads.peak:,} OS "
        f"threads at most, {at_end:,} instances still running at the end; anonymous memory "
        f"+{grown / max(touched, 1):.1f} KiB per instance started"
    )
    print(
        f"evict    {left:,} instances running after the idle timeout ({args.idle_timeout:g} s), "
        f"{left_threads:,} threads, anonymous memory +{(left_kib - before) / 1024:.1f} MiB "
        "over the start"
    )
    print(
        f"reopen   {reopened * 1000:.1f} ms with {used:,} per-key instances used, "
        f"{started:,} instances started by define ({args.work:,} held events)"
    )
    print(f"status   {read * 1000:.1f} ms over {used:,} instances used")
    return 0


if __name__ == "__main__":
    sys.exit(main())
