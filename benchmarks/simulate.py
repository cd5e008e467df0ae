"""``python -m benchmarks.simulate``: how fast ``dopool simulate`` runs a big scenario.

The issue's target: a 100,000-event scenario on 16 instances finishes in under
60 s of wall time on a 2-core machine. This runs exactly that (Poisson arrivals
at 200/s, exponential service of mean 50 ms: about 60% utilisation) through the
same driver as the CLI, and prints the wall time and the simulated events per
wall second. Example::

    python -m benchmarks.simulate                       # the target scenario
    python -m benchmarks.simulate --events 20000 --json sim-bench.json

To see where the time goes (every thread, native frames included)::

    py-spy record --threads --native -o profile.svg -- python -m benchmarks.simulate
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

from dopool._sim.driver import run
from dopool._sim.scenario import Arrivals, Scenario, Service

TARGET_SECONDS = 60.0


def scenario(events: int, instances: int, rate: float, seed: int) -> Scenario:
    return Scenario(
        name="benchmark",
        description=f"{events:,} events on {instances} instances",
        seed=seed,
        instances=instances,
        arrivals=(Arrivals(process="poisson", rate=rate, total=events),),
        service=Service(distribution="exponential", mean=0.05),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulate", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="default 100000")
    parser.add_argument("--instances", type=int, default=16, help="default 16")
    parser.add_argument("--rate", type=float, default=200.0, help="arrivals/s (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", type=Path, help="also write the trace (costs a little)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the figures here")
    args = parser.parse_args(argv)

    chosen = scenario(args.events, args.instances, args.rate, args.seed)
    print(
        f"dopool simulate benchmark: {args.events:,} events, {args.instances} instances, "
        f"Poisson {args.rate:g}/s, exponential service 50 ms; Python "
        f"{platform.python_version()} on {os.cpu_count()} CPUs"
    )
    finished = run(chosen, trace=args.trace)
    result = finished.result
    wall = finished.wall_seconds
    print(
        f"wall time {wall:.1f} s · {finished.events_per_wall_second:,.0f} events per wall "
        f"second · {result.pool_events / wall:,.0f} pool events per wall second"
    )
    print(
        f"virtual time {result.virtual_time:,.1f} s · {result.succeeded:,} succeeded · "
        f"p99 latency {result.latency.p99:.3f} s · invariants "
        f"{'pass' if result.passed else 'FAIL'}"
    )
    verdict = "within" if wall < TARGET_SECONDS else "OVER"
    print(f"target: under {TARGET_SECONDS:.0f} s for 100,000 events on 16 instances: {verdict}")
    if args.json is not None:
        document = {
            "events": args.events,
            "instances": args.instances,
            "rate": args.rate,
            "seed": args.seed,
            "wall_seconds": round(wall, 3),
            "events_per_wall_second": round(finished.events_per_wall_second, 1),
            "pool_events": result.pool_events,
            "virtual_seconds": round(result.virtual_time, 3),
            "invariants_passed": result.passed,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
