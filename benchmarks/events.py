"""``python -m benchmarks.events``: what the event index costs, against the code before it.

The index (an entry per unfinished event, written with it and deleted with it) is paid
by every enqueue and every finish, so it is measured against a baseline: another
checkout of dopool's ``src`` (``--baseline``, e.g. ``git archive main src | tar -x -C
/tmp/base``). Each round runs, in a child process per tree, alternating which goes
first: one instance, paused, takes ``--events`` plain ``enqueue`` calls from the
caller's thread; then it resumes and processes them with a no-op handler; then the same
with ``enqueue_many`` of 100; then plain enqueues 100 at a time, each hundred processed
before the next (a short queue, as in a steady state). The current tree also measures
``keep_finished=60`` (each finish remembers its event) and ``event()`` and ``cancel()``
on pending events. It prints the median and range of each, and the ratio of the current
tree's medians to the baseline's::

    python -m benchmarks.events --baseline /tmp/base/src
    python -m benchmarks.events --baseline /tmp/base/src --durability sync --events 2000

Without ``--baseline`` only the current tree runs. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dopool import Runtime  # in a child, the tree its PYTHONPATH names first

BATCH = 100
ROOT = Path(__file__).resolve().parent.parent
SHARED = ("enqueue", "process", "enqueue_many", "process (enqueue_many)", "enqueue, short queue")
MINE = ("process, keep_finished 60", "event()", "cancel()")


def _no_op(_ctx: Any) -> None:
    pass


def _timings(directory: Path, durability: str, count: int, mine: bool) -> dict[str, float]:
    """Seconds per event of each measure, in this process (the child's side)."""
    timings: dict[str, float] = {}
    event = {"id": 1, "payload": "x" * 100}
    variants: list[tuple[str, dict[str, Any]]] = [("enqueue", {}), ("enqueue_many", {})]
    if mine:
        variants.append(("keep_finished", {"keep_finished": 60.0}))
    for name, options in variants:
        store = directory / "store"
        shutil.rmtree(store, ignore_errors=True)
        with Runtime(store, durability=durability) as runtime:
            pool = runtime.define("p", execute=_no_op, **options)
            pool.pause()
            start = time.perf_counter()
            if name == "enqueue_many":
                for first in range(0, count, BATCH):
                    pool.enqueue_many([event] * min(BATCH, count - first))
            else:
                ids = [pool.enqueue(event).event_id for _ in range(count)]
            enqueued = time.perf_counter()
            if mine and name == "enqueue":
                for event_id in ids:
                    pool.event(event_id)
                looked = time.perf_counter()
                timings["event()"] = (looked - enqueued) / count
                half = ids[: count // 2]
                for event_id in half:
                    pool.cancel(event_id)
                timings["cancel()"] = (time.perf_counter() - looked) / max(1, len(half))
            pool.resume()
            before = time.perf_counter()
            if not pool.join(timeout=600):
                raise RuntimeError("the pool did not drain")
            done = time.perf_counter()
        left = count - (count // 2 if mine and name == "enqueue" else 0)
        if name == "enqueue":
            timings["enqueue"] = (enqueued - start) / count
            timings["process"] = (done - before) / left
        elif name == "enqueue_many":
            timings["enqueue_many"] = (enqueued - start) / count
            timings["process (enqueue_many)"] = (done - before) / count
        else:
            timings["process, keep_finished 60"] = (done - before) / count
    timings["enqueue, short queue"] = _short(directory, durability, count, event)
    return timings


def _short(directory: Path, durability: str, count: int, event: object) -> float:
    """Seconds per plain enqueue while the queue holds at most ``BATCH`` events (each
    batch processed before the next): its keys share few pages, as in a steady state."""
    store = directory / "store"
    shutil.rmtree(store, ignore_errors=True)
    spent = 0.0
    with Runtime(store, durability=durability) as runtime:
        pool = runtime.define("p", execute=_no_op)
        for first in range(0, count, BATCH):
            pool.pause()
            start = time.perf_counter()
            for _ in range(min(BATCH, count - first)):
                pool.enqueue(event)
            spent += time.perf_counter() - start
            pool.resume()
            if not pool.join(timeout=600):
                raise RuntimeError("the pool did not drain")
    return spent / count


def _child(src: Path, directory: Path, durability: str, count: int, mine: bool) -> dict[str, float]:
    """One round in a child process whose ``dopool`` is the one in ``src``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    command = [sys.executable, "-m", "benchmarks.events", "--child", str(directory)]
    command += ["--durability", durability, "--events", str(count)]
    command += ["--mine"] if mine else []
    out = subprocess.run(command, env=env, cwd=ROOT, check=True, capture_output=True, text=True)
    timings: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return timings


def _row(name: str, values: list[float], base: list[float] | None) -> str:
    median = statistics.median(values) * 1e6
    text = f"  {name:<28} {median:8.2f} µs ({min(values) * 1e6:.2f}-{max(values) * 1e6:.2f})"
    if base:
        baseline = statistics.median(base) * 1e6
        text += f"   baseline {baseline:8.2f} µs   ratio {median / baseline:.3f}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.events", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--durability", choices=("async", "sync"), default="async")
    parser.add_argument("--baseline", type=Path, default=None, help="another tree's src")
    parser.add_argument("--dir", type=Path, default=None, help="where to make the stores")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mine", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(_timings(args.child, args.durability, args.events, args.mine)))
        return 0
    directory = Path(tempfile.mkdtemp(prefix="dopool-events-", dir=args.dir))
    current: dict[str, list[float]] = {name: [] for name in (*SHARED, *MINE)}
    baseline: dict[str, list[float]] = {name: [] for name in SHARED}
    try:
        for number in range(args.rounds):
            runs = [(ROOT / "src", current, True)]
            if args.baseline is not None:
                runs.append((args.baseline, baseline, False))
                if number % 2:
                    runs.reverse()  # alternate which goes first: the machine drifts
            for src, into, mine in runs:
                timings = _child(src, directory, args.durability, args.events, mine)
                for name, value in timings.items():
                    into[name].append(value)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(
        f"event index: {args.events:,} events, {args.rounds} rounds, "
        f"durability={args.durability}; µs per event, median (min-max)"
    )
    for name in (*SHARED, *MINE):
        print(_row(name, current[name], baseline.get(name) if args.baseline else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
