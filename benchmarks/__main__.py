"""``python -m benchmarks``: print dopool's throughput on disk as a plain table.

Example::

    python -m benchmarks --events 5000 --repeat 3 --json bench.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import lmdb

from benchmarks.engine import (
    BATCH_SIZE,
    BATCHES,
    CONCURRENCY,
    MODES,
    PRODUCERS,
    Figure,
    measure,
    stored_value_size,
)

RAW = "raw LMDB, 1 put/txn"
SEQUENTIAL = "sequential enqueue"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "Throughput of a durable dopool pool on disk (real clock, concurrency "
            f"{CONCURRENCY}, no-op handler) in both durability modes, beside the raw "
            "LMDB ceiling of the same disk."
        ),
    )
    parser.add_argument(
        "--events",
        type=_positive,
        default=5_000,
        help="events per run for the sequential, producer and raw LMDB scenarios "
        f"(default 5000; enqueue_many always sends {BATCHES} x {BATCH_SIZE})",
    )
    parser.add_argument("--repeat", type=_positive, default=3, help="runs per scenario (default 3)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")
    parser.add_argument(
        "--dir",
        type=Path,
        help="where to create the temporary stores (default: the current directory)",
    )
    return parser.parse_args(argv)


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def render_table(figures: Sequence[Figure]) -> str:
    """The figures as a plain, aligned text table."""
    header = ("scenario", "mode", "metric", "median", "min", "max")
    rows = [
        (f.scenario, f.mode, f.metric, _rate(f.median), _rate(f.low), _rate(f.high))
        for f in figures
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        text = [cell.ljust(width) for cell, width in zip(row[:3], widths[:3], strict=True)]
        numbers = [cell.rjust(width) for cell, width in zip(row[3:], widths[3:], strict=True)]
        return "  ".join(text + numbers).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def ratios(figures: Sequence[Figure]) -> dict[str, float]:
    """dopool's sequential enqueue rate over the raw LMDB rate, per mode (medians)."""
    by_key = {(f.scenario, f.mode, f.metric): f.median for f in figures}
    result = {}
    for mode in MODES:
        ours = by_key.get((SEQUENTIAL, mode, "enqueue/s"))
        raw = by_key.get((RAW, mode, "put/s"))
        if ours is not None and raw:
            result[mode] = ours / raw
    return result


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dopool": _version("dopool"),
        "lmdb": ".".join(str(part) for part in lmdb.version()),
        "py-lmdb": getattr(lmdb, "__version__", "?"),
    }


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    parent = None if args.dir is None else args.dir.resolve()
    where = parent or Path.cwd()
    env = environment()
    print(
        f"dopool {env['dopool']} on Python {env['python']}, LMDB {env['lmdb']}, {env['platform']}"
    )
    print(
        f"stores under {where}; real clock; concurrency {CONCURRENCY}; no-op handler; "
        f"{args.events:,} events ({PRODUCERS} producers share them); "
        f"enqueue_many {BATCHES} x {BATCH_SIZE:,}; value {stored_value_size()} bytes; "
        f"repeat {args.repeat}"
    )
    started = time.perf_counter()

    def progress(text: str) -> None:
        print(f"  {text}", file=sys.stderr, flush=True)

    figures = measure(args.events, args.repeat, parent, progress)
    elapsed = time.perf_counter() - started
    print()
    print("events/s: median, min and max over the repeats")
    print(render_table(figures))
    print()
    found = ratios(figures)
    for mode, ratio in found.items():
        print(
            f"{SEQUENTIAL} ({mode}) / {RAW} ({mode}): {ratio:.2f}  ({ratio:.0%} of the raw ceiling)"
        )
    print(f"\nwhole run: {elapsed:.1f} s")
    if args.json is not None:
        document = {
            "config": {
                "events": args.events,
                "repeat": args.repeat,
                "concurrency": CONCURRENCY,
                "producers": PRODUCERS,
                "batch_size": BATCH_SIZE,
                "batches": BATCHES,
                "value_bytes": stored_value_size(),
                "dir": str(where),
            },
            "environment": env,
            "figures": [figure.to_json_dict() for figure in figures],
            "ratio_sequential_enqueue_to_raw_lmdb": found,
            "elapsed_s": elapsed,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
