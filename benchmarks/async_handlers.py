"""``python -m benchmarks.async_handlers``: a thousand instances awaiting a sleep at once.

A pool's handler may be an ``async def`` (docs/api.md, "Async handlers"). Under a real
clock every coroutine of a runtime runs on one event loop thread, and each instance's
actor thread waits for its own attempt's coroutine; so instances that await run at the
same time, and a thousand awaiting ``asyncio.sleep(S)`` should take about one S, not a
thousand. Each round, on a fresh store per case (``durability="sync"`` unless told),
one pool of ``--instances`` instances (1,000; ``concurrency`` as many) gets one event per
instance from one ``enqueue_many`` (round-robin: one each, checked), with a handler that:

- **async def, asyncio.sleep**: ``await asyncio.sleep(S)``;
- **async def, ctx.sleep_async**: ``await ctx.sleep_async(S)``;
- **def, time.sleep**: ``time.sleep(S)``, a plain handler on its instance's own thread;
- **async def, no sleep**: returns at once, for reference.

S is ``--sleep`` (0.5 s). Each case reads the seconds from the first enqueue until
``pool.join()`` returned (the wall time; also in sleeps, over S), until ``enqueue_many``
returned, until the last handler started, and from that start until ``join()`` returned
(a sleep and the outcomes' commits); the OS threads at most (sampled in every handler);
and the anonymous memory (``RssAnon``) grown from before the runtime opened until the
pool was done. It prints the medians over the rounds with min-max, then ratios from the
medians: each sleeping variant's wall time over the ``asyncio.sleep`` one's, and the
serial reference (instances x S, computed, not run) over each sleeping variant's. The
no-sleep variant shows what the rest costs: mostly the instances' activations, each
started by ``enqueue_many`` in turn from the caller's thread. Beyond the runtime's
``max_active`` (1,024 by default) instances wait in line for a slot, so more instances
than that would measure the line. Nothing here asserts on timings. Examples::

    python -m benchmarks.async_handlers                 # 1,000 instances, 0.5 s, 5 rounds
    python -m benchmarks.async_handlers --quick         # 100 instances, 0.1 s, 1 round
    python -m benchmarks.async_handlers --instances 500 --sleep 1 --json async.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.harness import (
    TIMEOUT,
    Case,
    Reading,
    Results,
    environment,
    memory_kib,
    run_rounds,
    work_directory,
)
from dopool import EventContext, Runtime

SCENARIO = "async"
ASYNCIO = "async def, asyncio.sleep"
SLEEP_ASYNC = "async def, ctx.sleep_async"
BLOCKING = "def, time.sleep"
NO_SLEEP = "async def, no sleep"
VARIANTS = (ASYNCIO, SLEEP_ASYNC, BLOCKING, NO_SLEEP)
SLEEPING = (ASYNCIO, SLEEP_ASYNC, BLOCKING)  # the variants whose wall time is held against S
# The metrics each case reads.
WALL = "first enqueue to join"
SLEEPS = "wall / sleep"
ENQUEUED = "enqueue_many returned"
LAST_START = "last handler started"
SLEPT = "last start to join"
THREADS = "OS threads at most"
MEMORY = "RssAnon growth"
DEFAULT_ROUNDS = 5
# --quick: a smoke run of a few seconds.
QUICK_INSTANCES = 100
QUICK_SLEEP = 0.1


@dataclass(slots=True)
class Probe:
    """What the handlers saw: each instance that ran, the latest start, the threads."""

    instances: set[str] = field(default_factory=set)
    last_start: float = 0.0
    threads: int = 0

    def start(self, ctx: EventContext) -> None:
        # One at a time on the loop thread; instance threads share the GIL, and a lost
        # update of a maximum is harmless here (every handler writes one).
        self.instances.add(ctx.instance_id)
        self.last_start = max(self.last_start, time.perf_counter())
        self.threads = max(self.threads, threading.active_count())


def handler(variant: str, seconds: float, probe: Probe) -> Callable[[EventContext], Any]:
    """The pool's handler for ``variant``."""
    if variant == BLOCKING:

        def blocking(ctx: EventContext) -> None:
            probe.start(ctx)
            time.sleep(seconds)

        return blocking

    async def awaiting(ctx: EventContext) -> None:
        probe.start(ctx)
        if variant == ASYNCIO:
            await asyncio.sleep(seconds)
        elif variant == SLEEP_ASYNC:
            await ctx.sleep_async(seconds)

    return awaiting


def measure(
    variant: str, instances: int, seconds: float, durability: str, directory: Path
) -> list[Reading]:
    """One case on a fresh store in ``directory``: see the module docstring."""
    probe = Probe()
    before = memory_kib()["RssAnon"]
    with Runtime(directory, durability=durability) as runtime:
        pool = runtime.define(
            "sleepers", execute=handler(variant, seconds, probe), concurrency=instances
        )
        events = list(range(instances))
        start = time.perf_counter()
        pool.enqueue_many(events)  # round-robin over the instances: one each
        enqueued = time.perf_counter()
        if not pool.join(timeout=TIMEOUT):
            raise RuntimeError(f"{instances:,} events not done in {TIMEOUT:g} s")
        finished = time.perf_counter()
        grown = memory_kib()["RssAnon"] - before
        status = pool.status()
    if status.succeeded != instances or len(probe.instances) != instances:
        raise RuntimeError(
            f"expected {instances:,} events succeeded on as many instances; "
            f"{status.succeeded:,} succeeded on {len(probe.instances):,}"
        )
    wall = finished - start
    readings = [Reading(WALL, "s", wall)]
    if variant != NO_SLEEP:
        readings.append(Reading(SLEEPS, "x", wall / seconds))
    return [
        *readings,
        Reading(ENQUEUED, "s", enqueued - start),
        Reading(LAST_START, "s", probe.last_start - start),
        Reading(SLEPT, "s", finished - probe.last_start),
        Reading(THREADS, "threads", probe.threads),
        Reading(MEMORY, "MiB", grown / 1024),
    ]


def cases(instances: int, seconds: float, durability: str = "sync") -> list[Case]:
    """One case per variant, in :data:`VARIANTS` order."""
    return [
        Case(SCENARIO, variant, partial(measure, variant, instances, seconds, durability))
        for variant in VARIANTS
    ]


def serial_label(instances: int, seconds: float) -> str:
    return f"serial {instances:,} x {seconds:g} s (computed)"


def ratios(instances: int, seconds: float, results: Results) -> list[dict[str, Any]]:
    """Each sleeping variant's wall time over the asyncio.sleep one's, and the serial
    reference over each: as the report's targets, for information."""
    wall = {variant: (SCENARIO, variant, WALL) for variant in VARIANTS}
    found = [
        report.Target("info", f"{variant} / {ASYNCIO}", wall[variant], wall[ASYNCIO]).evaluate(
            results
        )
        for variant in (SLEEP_ASYNC, BLOCKING)
    ]
    serial = instances * seconds
    for variant in SLEEPING:
        label = f"{serial_label(instances, seconds)} / {variant}"
        shown = report.Target("info", label, wall[variant]).evaluate(results)
        if shown["value"] is not None:
            shown["value"] = serial / shown["value"]
        found.append(shown)
    return found


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    """An argparse type: ``kind`` of the text, finite and more than 0."""

    def parse(text: str) -> Any:
        value = kind(text)
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be finite and more than 0, got {text}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.async_handlers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--instances", type=_positive(int), help="instances, one event each (1,000)"
    )
    parser.add_argument("--sleep", type=_positive(float), help="seconds each handler sleeps (0.5)")
    parser.add_argument("--rounds", type=_positive(int), help=f"rounds (default {DEFAULT_ROUNDS})")
    parser.add_argument("--durability", choices=("sync", "async"), default="sync")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_INSTANCES} instances, {QUICK_SLEEP:g} s, one round: a smoke run",
    )
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to make the stores")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write everything here")
    args = parser.parse_args(argv)
    instances: int = args.instances or (QUICK_INSTANCES if args.quick else 1_000)
    seconds: float = args.sleep or (QUICK_SLEEP if args.quick else 0.5)
    rounds: int = args.rounds or (1 if args.quick else DEFAULT_ROUNDS)
    parent = args.dir.resolve()
    env = environment(parent)
    print(
        f"dopool {env['packages']['dopool']} on {env['python']}, {env['cpus_usable']} of "
        f"{env['cpu_count']} CPUs usable, {env['platform']}"
    )
    print(
        f"{instances:,} instances, one event each, handlers sleeping {seconds:g} s; "
        f"{rounds} round(s); real clock; durability={args.durability}"
    )
    sys.stdout.flush()

    def progress(text: str) -> None:
        print(f"  {text}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    with work_directory(parent) as root:
        results = run_rounds(cases(instances, seconds, args.durability), rounds, root, progress)
    elapsed = time.perf_counter() - started
    verdicts = ratios(instances, seconds, results)
    print()
    print("medians over the rounds, with min-max (n = samples)")
    print(report.table(list(results.series.values())))
    for (_, system), error in results.failures.items():
        print(f"FAILED {system}: {error}")
    print()
    print("ratios of the wall times, from the medians")
    print(report.target_lines(verdicts))
    print(f"\nwhole run: {elapsed:.1f} s")
    if args.json is not None:
        config = {
            "instances": instances,
            "sleep": seconds,
            "rounds": rounds,
            "quick": args.quick,
            "durability": args.durability,
            "dir": str(parent),
            "serial_s": instances * seconds,
        }
        document = report.document(config, env, results, verdicts, elapsed)
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        print(f"everything written to {args.json}")
    return 1 if results.failures else 0


if __name__ == "__main__":
    sys.exit(main())
