"""``python -m benchmarks``: dopool beside its peers and the raw LMDB ceiling, on one disk.

Every scenario runs in this one process, on stores in one temporary directory under
``--dir``, a fresh store per run. Repeats are interleaved (round 1 of every scenario,
then round 2, ...). The table shows medians with min-max over the repeats, then the
targets of issue 5 with PASS or MISS. Nothing here asserts on timings. Examples::

    python -m benchmarks                                # the full run (minutes)
    python -m benchmarks --quick                        # a smoke run (well under a minute)
    python -m benchmarks --only e2e,raw --repeat 3 --json bench.json
    nice -n 10 python -m benchmarks --quick --dir /mnt/disk-under-test

Peers (SqliteHuey, persist-queue) need ``pip install 'dopool[bench]'``; without them
their cases are skipped and the rest runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import ceiling, engine, peers, raw, report
from benchmarks.harness import (
    QUICK,
    SCENARIOS,
    Case,
    Sizes,
    environment,
    make_event,
    record_size,
    run_rounds,
    work_directory,
)

DEFAULT_REPEAT = 5
# The size options: flag, Sizes field, help.
SIZE_OPTIONS = (
    ("--events", "events", "end-to-end events, shared by the producers"),
    ("--producers", "producers", "end-to-end producer threads"),
    ("--concurrency", "concurrency", "instances (dopool) or workers (huey) where not stated"),
    ("--sequential", "sequential", "sequential enqueues, and raw LMDB single puts and steps"),
    ("--batch-size", "batch_size", "events per enqueue_many call and per batched LMDB txn"),
    ("--batches", "batches", "enqueue_many calls and batched LMDB txns"),
    ("--latency-samples", "latency", "latency samples"),
    ("--shallow", "shallow", "pending events for the shallow depth probe"),
    ("--depth", "depth", "pending events for the deep depth probe"),
    ("--probe", "probe", "timed enqueues at each depth, and events processed from the head"),
    ("--instances", "instances", "instances of the scale scenario"),
    ("--scale-events", "scale_events", "events the scale scenario drains"),
)


def _positive(text: str) -> int:
    value = int(text.replace("_", "").replace(",", ""))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _scenarios(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown scenario {', '.join(unknown) or text!r}; choose from {', '.join(SCENARIOS)}"
        )
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="dopool on disk beside SqliteHuey, persist-queue and raw LMDB.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"scenarios: {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--repeat",
        type=_positive,
        metavar="N",
        help=f"rounds of every scenario (default {DEFAULT_REPEAT}; 1 with --quick)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write everything here")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path.cwd(),
        help="where to create the temporary stores (default: the current directory)",
    )
    parser.add_argument(
        "--only",
        type=_scenarios,
        metavar="NAME[,NAME]",
        help="run only these scenarios",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and one round, a smoke run (the deep queue holds 20,000, not 1,000,000)",
    )
    depth = parser.add_mutually_exclusive_group()
    depth.add_argument("--skip-depth", action="store_true", help="leave out the depth scenario")
    depth.add_argument(
        "--repeat-depth",
        action="store_true",
        help="run the depth scenario in every round (default: the first round only)",
    )
    sizes = parser.add_argument_group("sizes (defaults: the full run, or --quick's)")
    for flag, field, text in SIZE_OPTIONS:
        default = getattr(Sizes(), field)
        sizes.add_argument(
            flag, dest=field, type=_positive, metavar="N", help=f"{text} (default {default:,})"
        )
    return parser.parse_args(argv)


def sizes_from(args: argparse.Namespace) -> Sizes:
    base = QUICK if args.quick else Sizes()
    overrides = {
        field: getattr(args, field)
        for _, field, _ in SIZE_OPTIONS
        if getattr(args, field) is not None
    }
    try:
        return dataclasses.replace(base, **overrides)
    except ValueError as exc:
        raise SystemExit(f"python -m benchmarks: error: {exc}") from exc


def legend(sizes: Sizes) -> list[tuple[str, str]]:
    """What each scenario does, with its sizes."""
    s = sizes
    per_producer = s.events // s.producers
    value = record_size(make_event(0))
    return [
        (
            "e2e",
            f"{s.producers} producer threads x {per_producer:,} single enqueues while "
            f"{s.concurrency} consumers run; first enqueue to last completion",
        ),
        (
            "sequential",
            f"one thread, {s.sequential:,} enqueue calls into a paused pool, then "
            f"{s.sequential:,} into a running one; concurrency {s.concurrency}",
        ),
        (
            "enqueue_many",
            f"{s.batches} x enqueue_many({s.batch_size:,}) into a paused pool, {s.batches} more "
            "while it drains; the calls timed, then the drain from resume",
        ),
        ("latency", f"{s.latency:,} enqueues, each on an idle pool; enqueue to handler start"),
        (
            "raw",
            f"py-lmdb with dopool's options, {value}-byte values: {s.sequential:,} single-put "
            f"txns, {s.sequential:,} queue steps, {s.batches} txns of {s.batch_size:,} puts",
        ),
        (
            "depth",
            f"paused pool, {s.depth_event_bytes}-byte events: {s.probe:,} enqueues at "
            f"{s.shallow:,} and at {s.depth:,} pending, then {s.probe:,} processed from the head; "
            "and the same writes as plain LMDB puts, for memory",
        ),
        (
            "scale",
            f"define {s.instances:,} instances, enqueue_many {s.scale_events:,} round-robin, drain",
        ),
    ]


def build_cases(
    sizes: Sizes, only: Sequence[str] | None, skip_depth: bool
) -> tuple[list[Case], dict[str, str]]:
    """The cases to run, in scenario order, and the peers skipped for want of the extra."""
    peer_cases, skipped = peers.cases(sizes)
    found = engine.cases(sizes) + peer_cases + ceiling.cases(sizes) + raw.cases(sizes)
    wanted = set(only or SCENARIOS)
    if skip_depth:
        wanted.discard("depth")
    if "e2e" not in wanted:
        skipped = {}
    chosen = [case for case in found if case.scenario in wanted]
    chosen.sort(key=lambda case: SCENARIOS.index(case.scenario))  # stable: keeps system order
    return chosen, skipped


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = sizes_from(args)
    repeat = args.repeat or (1 if args.quick else DEFAULT_REPEAT)
    parent = args.dir.resolve()
    cases, skipped = build_cases(sizes, args.only, args.skip_depth)
    env = environment(parent)
    fs = env["filesystem"] or {}
    print(
        f"dopool {env['packages']['dopool']} on {env['python']}, LMDB {env['lmdb']}, "
        f"SQLite {env['sqlite']}, {env['cpus_usable']} of {env['cpu_count']} CPUs usable, "
        f"{env['platform']}"
    )
    print(
        f"stores under {parent} ({fs.get('type', '?')} on {fs.get('device', '?')}); "
        f"{repeat} round(s); real clock; no-op handlers"
    )
    for peer, reason in skipped.items():
        print(f"{peer}: {reason}")
    wanted = {case.scenario for case in cases}
    for name, text in legend(sizes):
        if name in wanted:
            print(f"  {name:<13} {text}")
    sys.stdout.flush()

    def progress(text: str) -> None:
        print(f"  {text}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    with work_directory(parent) as root:
        results = run_rounds(cases, repeat, root, progress, repeat_once=args.repeat_depth)
    results.skipped = skipped
    elapsed = time.perf_counter() - started
    env["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    chosen = [target for target in report.targets(sizes) if target.scenarios <= wanted]
    verdicts = [target.evaluate(results) for target in chosen]

    print()
    print("medians over the rounds, with min-max (n = samples)")
    print(report.table(list(results.series.values())))
    for (scenario, system), error in results.failures.items():
        print(f"FAILED {scenario}: {system}: {error}")
    print()
    print("targets (issue 5), from the medians")
    print(report.target_lines(verdicts))
    print(f"\nwhole run: {elapsed:.1f} s")
    if args.json is not None:
        config: dict[str, Any] = {
            "sizes": dataclasses.asdict(sizes),
            "repeat": repeat,
            "quick": args.quick,
            "only": args.only,
            "skip_depth": args.skip_depth,
            "repeat_depth": args.repeat_depth,
            "dir": str(parent),
            "value_bytes": record_size(make_event(0)),
            "huey_poll": peers.HUEY_POLL,
            "persist_queue_get_timeout": peers.PERSIST_QUEUE_GET_TIMEOUT,
            "persist_queue_clear_every": peers.PERSIST_QUEUE_CLEAR_EVERY,
            "latency_warm_up": engine.WARM_UP,
            "scenarios": dict(legend(sizes)),
        }
        document = report.document(config, env, results, verdicts, elapsed)
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        print(f"everything written to {args.json}")
    return 1 if results.failures else 0


if __name__ == "__main__":
    sys.exit(main())
