"""``python -m benchmarks.simulate``: how fast ``dopool simulate`` runs a big scenario.

By default 100,000 events on 16 instances (Poisson arrivals at 200/s, exponential
service of mean 50 ms: about 60% utilisation), through the same driver as the
CLI. It prints the wall time, the simulated events per wall second and the
process's peak resident memory once the run is over (``--events 1000000`` shows
how both grow).

Then, in the same process, it runs the SimPy model of the same scenario
(:mod:`benchmarks.simpy_model`: one FIFO server per instance, fed the same
arrivals and service draws) and prints its events per wall second, the ratio
dopool / SimPy (issue 15's targets: at least 0.25, and at least 25,000 events
per wall second, for 100,000 events on 16 instances), and whether the two agree
on the mean and p99 of the latency. ``--no-simpy`` skips it. Example::

    python -m benchmarks.simulate                       # the target scenario
    python -m benchmarks.simulate --events 20000 --json sim-bench.json

``--per-key KEYS`` then runs a Durable-Object design in the same process: an instance
per partition key (``instances = "per-key"``), ``KEYS`` keys drawn by a Zipf law (s =
1.1), ``--events`` arrivals at 1,000/s with exponential service of mean 2 ms (the
busiest key's instance about 27% busy), every instance activated on demand and evicted
after 60 idle seconds. It prints that run's events per wall second, its ratio to the
16-instance run's (issue 29's target: at least 0.8 for 100,000 keys and 1,000,000
events), its activations and peak active instances, and the peak resident memory::

    python -m benchmarks.simulate --no-simpy --per-key 100000 --events 1000000

To see where the time goes (every thread, native frames included)::

    py-spy record --threads --native -o profile.svg -- python -m benchmarks.simulate
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import simpy_model
from dopool._sim.driver import Run, run
from dopool._sim.latency import Latency
from dopool._sim.scenario import Arrivals, Partitions, Scenario, Service

TARGET_SCENARIO = (100_000, 16)  # events, instances: what issue 15's targets are for
TARGET_RATE = 25_000.0  # issue 15: dopool's events per wall second...
TARGET_RATIO = 0.25  # ...and its rate over the SimPy model's, in the same run
AGREEMENT = 1e-9  # relative: the two compute the same FIFO queues from the same draws
PER_KEY_TARGET = 0.8  # issue 29: the per-key run's events per wall second over the 16's


def scenario(events: int, instances: int, rate: float, seed: int) -> Scenario:
    return Scenario(
        name="benchmark",
        description=f"{events:,} events on {instances} instances",
        seed=seed,
        instances=instances,
        arrivals=(Arrivals(process="poisson", rate=rate, total=events),),
        service=Service(distribution="exponential", mean=0.05),
    )


def per_key_scenario(events: int, keys: int, seed: int) -> Scenario:
    """An instance per key, ``keys`` of them by Zipf's law, ``events`` arrivals."""
    return Scenario(
        name="benchmark-per-key",
        description=f"{events:,} events on {keys:,} per-key instances (Zipf 1.1)",
        seed=seed,
        instances="per-key",
        routing="partition",
        partitions=Partitions(keys=keys, zipf=1.1),
        arrivals=(Arrivals(process="poisson", rate=1000.0, total=events),),
        service=Service(distribution="exponential", mean=0.002),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulate", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="default 100000")
    parser.add_argument("--instances", type=int, default=16, help="default 16")
    parser.add_argument("--rate", type=float, default=200.0, help="arrivals/s (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", type=Path, help="also write the trace (costs a little)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the figures here")
    parser.add_argument(
        "--no-simpy", action="store_true", help="skip the SimPy model of the same scenario"
    )
    parser.add_argument(
        "--per-key",
        type=int,
        metavar="KEYS",
        help="then run an instance per key, KEYS Zipf-drawn keys, --events arrivals; the "
        "16-instance run then has its default 100,000 events",
    )
    args = parser.parse_args(argv)

    baseline = TARGET_SCENARIO[0] if args.per_key else args.events
    chosen = scenario(baseline, args.instances, args.rate, args.seed)
    print(
        f"dopool simulate benchmark: {baseline:,} events, {args.instances} instances, "
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
    peak = _peak_rss_mib()
    print(f"peak resident memory {peak:,.0f} MiB ({peak * 1024 / baseline:,.2f} KiB per event)")
    targeted = (baseline, args.instances) == TARGET_SCENARIO
    if not targeted:
        print("(issue 15's targets are for the default: 100,000 events on 16 instances)")
    beside: dict[str, Any] = {}
    agreed = True
    if not args.no_simpy:
        beside, agreed = _beside_simpy(chosen, finished, targeted)
    if args.per_key:
        keyed, passed = _per_key(args.per_key, args.events, args.seed, finished)
        beside.update(keyed)
        agreed = agreed and passed
    if args.json is not None:
        document = {
            "events": baseline,
            "instances": args.instances,
            "rate": args.rate,
            "seed": args.seed,
            "wall_seconds": round(wall, 3),
            "events_per_wall_second": round(finished.events_per_wall_second, 1),
            "pool_events": result.pool_events,
            "virtual_seconds": round(result.virtual_time, 3),
            "invariants_passed": result.passed,
            "peak_rss_mib": round(peak, 1),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            **beside,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0 if result.passed and agreed else 1


def _per_key(keys: int, events: int, seed: int, base: Run) -> tuple[dict[str, Any], bool]:
    """Run :func:`per_key_scenario` after the 16-instance run ``base``; print and return
    its figures, and whether its invariants passed."""
    print(f"per key: {events:,} events on {keys:,} keys (Zipf 1.1), an instance each")
    finished = run(per_key_scenario(events, keys, seed))
    result, rate = finished.result, finished.events_per_wall_second
    ratio = rate / base.events_per_wall_second
    active = result.activations
    used = sum(len(pool.instances) for pool in result.pools)
    peak = _peak_rss_mib()
    print(
        f"wall time {finished.wall_seconds:.1f} s · {rate:,.0f} events per wall second · "
        f"{ratio:.2f}x the 16-instance run's (target {PER_KEY_TARGET:g}x: "
        f"{'met' if ratio >= PER_KEY_TARGET else 'MISSED'}) · invariants "
        f"{'pass' if result.passed else 'FAIL'}"
    )
    print(
        f"{used:,} instances used · {active.started:,} activations, {active.evicted:,} "
        f"evictions · active instances peak {active.peak:,}, mean {active.mean:,.0f} · "
        f"peak resident memory {peak:,.0f} MiB"
    )
    figures = {
        "per_key": {
            "keys": keys,
            "events": events,
            "wall_seconds": round(finished.wall_seconds, 3),
            "events_per_wall_second": round(rate, 1),
            "ratio_to_16_instances": round(ratio, 3),
            "instances_used": used,
            "activations": active.started,
            "active_peak": active.peak,
            "active_mean": round(active.mean, 1),
            "peak_rss_mib": round(peak, 1),
            "invariants_passed": result.passed,
        }
    }
    return figures, result.passed


def _peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB (Linux counts KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _beside_simpy(chosen: Scenario, finished: Run, targeted: bool) -> tuple[dict[str, Any], bool]:
    """Run the SimPy model of ``chosen``, print its rate, the ratio and the agreement;
    return the figures for the JSON document, and whether the two runs agree."""
    model = simpy_model.run(chosen)
    mine, theirs = finished.result.latency, model.latency
    rate, simpy_rate = finished.events_per_wall_second, model.events_per_wall_second
    ratio = rate / simpy_rate if simpy_rate > 0 else math.nan
    print(
        f"SimPy model, same arrivals and service draws: wall time {model.wall_seconds:.2f} s · "
        f"{simpy_rate:,.0f} events per wall second · dopool / SimPy "
        f"{ratio:.3f}"
    )
    for target, met in (
        (f"at least {TARGET_RATE:,.0f} events per wall second", rate >= TARGET_RATE),
        (f"at least {TARGET_RATIO:g}x SimPy's events per wall second", ratio >= TARGET_RATIO),
    ):
        if targeted:
            print(f"target: {target}: {'met' if met else 'MISSED'}")
    ours, simpys = sorted(finished.result.latencies), sorted(model.in_system)
    apart = math.inf  # when the counts differ
    if len(ours) == len(simpys):
        apart = max((abs(a - b) for a, b in zip(ours, simpys, strict=True)), default=0.0)
    agreed = apart < math.inf and all(
        math.isclose(getattr(mine, name), getattr(theirs, name), rel_tol=AGREEMENT)
        for name in ("mean", "p99")
    )
    print(
        f"latency, dopool vs SimPy: mean {mine.mean:.9f} vs {theirs.mean:.9f} s, "
        f"p99 {mine.p99:.9f} vs {theirs.p99:.9f} s, {mine.count:,} vs {theirs.count:,} "
        f"events, sorted samples at most {apart:.1e} s apart: "
        f"{'agree' if agreed else 'DISAGREE'}"
    )
    figures = {
        "simpy_wall_seconds": round(model.wall_seconds, 3),
        "simpy_events_per_wall_second": round(model.events_per_wall_second, 1),
        "ratio_to_simpy": round(ratio, 4),
        "latency_agreement": {
            "dopool": _summary(mine),
            "simpy": _summary(theirs),
            # between the sorted samples, virtual seconds; None: the counts differ
            "max_difference": apart if apart < math.inf else None,
            "agree": agreed,
        },
    }
    return figures, agreed


def _summary(latency: Latency) -> dict[str, Any]:
    return {"count": latency.count, "mean": latency.mean, "p99": latency.p99}


if __name__ == "__main__":
    sys.exit(main())
