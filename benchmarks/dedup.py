"""``python -m benchmarks.dedup``: what a dedup key costs, beside plain enqueues in one run.

One instance, paused, so each enqueue is stored from the caller's thread; then the pool
resumes and processes them all with a no-op handler. Each round does every variant on a
fresh store, in turn, so the variants share the machine's state: plain events; events
with unique dedup keys (no window, then a 60 s window, where each finish stamps its
entry); the same events enqueued again (every one a duplicate); events enqueued with a
60 s delay (scheduled; not processed: the pool would wait for them); and ``enqueue_many``
of 100 events, plain and keyed. It prints the median and range of each over the rounds
(wall time per event), and each variant's ratio to its plain one: the median and range
of the rounds' ratios::

    python -m benchmarks.dedup                     # async durability, 20,000 events, 5 rounds
    python -m benchmarks.dedup --durability sync --events 2000
    taskset -c 1 python -m benchmarks.dedup        # one core: steadier figures
    python -m benchmarks.dedup --cpu               # the process's CPU time, not wall time

``--cpu`` counts the CPU time of the whole process (every thread) instead of wall time:
on a machine that other work shares, it leaves out the time spent waiting for a core
(and, under ``"sync"``, for the disk).

Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dopool import EventContext, Runtime, WorkerPool

BATCH = 100
# Each variant: (name, the plain variant it is compared with, or None).
VARIANTS = (
    ("enqueue", None),
    ("enqueue, dedup_key", "enqueue"),
    ("enqueue, dedup_key, window 60 s", "enqueue"),
    ("enqueue, duplicate", "enqueue"),
    ("enqueue, delay 60 s", "enqueue"),
    ("enqueue_many", None),
    ("enqueue_many, dedup_keys", "enqueue_many"),
)


def no_op(_ctx: EventContext) -> None:
    pass


def _one(
    directory: Path,
    durability: str,
    count: int,
    variant: str,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float | None]:
    """Seconds per event (of ``clock``) to enqueue ``count`` events as ``variant`` says,
    then to process them (None for duplicates, which store nothing, and for delayed
    events, not yet due)."""
    window = 60.0 if "window" in variant else 0.0
    store = directory / "store"
    shutil.rmtree(store, ignore_errors=True)
    with Runtime(store, durability=durability) as runtime:
        pool = runtime.define("p", execute=no_op, dedup_window=window)
        pool.pause()
        event = {"id": 1, "payload": "x" * 100}
        keys = [f"order-{n:08d}" for n in range(count)]
        if variant == "enqueue, duplicate":
            pool.enqueue_many([event] * count, dedup_keys=keys)  # held: each enqueue below
        send = _sender(pool, variant, event, keys)
        start = clock()
        send()
        enqueued = clock()
        if variant in ("enqueue, duplicate", "enqueue, delay 60 s"):
            return (enqueued - start) / count, None
        pool.resume()
        if not pool.join(timeout=600):
            raise RuntimeError("the pool did not drain")
        done = clock()
    return (enqueued - start) / count, (done - enqueued) / count


def _sender(pool: WorkerPool, variant: str, event: object, keys: list[str]) -> Callable[[], None]:
    count = len(keys)
    if variant.startswith("enqueue_many"):
        keyed = variant.endswith("dedup_keys")

        def many() -> None:
            for start in range(0, count, BATCH):
                chunk = [event] * min(BATCH, count - start)
                pool.enqueue_many(chunk, dedup_keys=keys[start : start + BATCH] if keyed else None)

        return many
    if variant == "enqueue":

        def plain() -> None:
            for _ in range(count):
                pool.enqueue(event)

        return plain
    if variant == "enqueue, delay 60 s":

        def delayed() -> None:
            for _ in range(count):
                pool.enqueue(event, delay=60)

        return delayed

    def keyed_one() -> None:
        for key in keys:
            pool.enqueue(event, dedup_key=key)

    return keyed_one


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dedup", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--durability", choices=("async", "sync"), default="async")
    parser.add_argument("--dir", type=Path, default=None, help="where to make the stores")
    parser.add_argument("--cpu", action="store_true", help="the process's CPU time, not wall time")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="dopool-dedup-", dir=args.dir))
    clock = time.process_time if args.cpu else time.perf_counter
    enqueue: dict[str, list[float]] = {name: [] for name, _ in VARIANTS}
    process: dict[str, list[float]] = {name: [] for name, _ in VARIANTS}
    try:
        for _ in range(args.rounds):
            for name, _plain in VARIANTS:
                spent, processed = _one(directory, args.durability, args.events, name, clock)
                enqueue[name].append(spent)
                if processed is not None:
                    process[name].append(processed)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(
        f"dedup keys: {args.events:,} events, {args.rounds} rounds, "
        f"durability={args.durability}; µs per event ({'CPU' if args.cpu else 'wall'}), "
        "median (min-max)"
    )
    for name, plain in VARIANTS:
        line = f"  {name:<34} enqueue {_figure(enqueue[name])}"
        if plain is not None:
            line += f" ratio {_ratio(enqueue[name], enqueue[plain])}"
        if process[name]:
            line += f" · process {_figure(process[name])}"
            if plain is not None:
                line += f" ratio {_ratio(process[name], process[plain])}"
        print(line)
    return 0


def _figure(values: list[float]) -> str:
    return (
        f"{statistics.median(values) * 1e6:6.1f} ({min(values) * 1e6:.1f}-{max(values) * 1e6:.1f})"
    )


def _ratio(values: list[float], plain: list[float]) -> str:
    """The median of the rounds' ratios, and their range: each round's variants ran in turn,
    so a round's ratio is steadier than its figures while the machine drifts."""
    ratios = [value / base for value, base in zip(values, plain, strict=True)]
    return f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})"


if __name__ == "__main__":
    sys.exit(main())
