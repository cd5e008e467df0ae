"""A run's figures by name: what gates (``--assert``) and sweeps read of a result.

Every figure is a number (a check that passed is 1.0, one that failed 0.0).
The names are documented in docs/simulate.md ("Figures"); they are stable, so
a gate in a CI script keeps meaning the same thing.
"""

from __future__ import annotations

import math

from dopool._sim.metrics import Latency, Result

#: What each whole-run figure means, in the order they are listed.
DESCRIPTIONS: dict[str, str] = {
    "offered": "arrivals that happened",
    "enqueued": "arrivals stored (acknowledged)",
    "rejected": "arrivals refused because the instance's queue was full",
    "failed_enqueue": "arrivals whose instance crashed during the enqueue (nothing stored)",
    "succeeded": "events that succeeded",
    "dead_lettered": "events dead-lettered",
    "pending": "events still pending at the end (a run cut short by its duration)",
    "lost": "acknowledged events not accounted for (always 0 unless a guarantee broke)",
    "retries": "retries scheduled",
    "crashes": "instance crashes",
    "restarts": "supervisor restarts",
    "virtual_time": "virtual seconds the run took",
    "throughput": "successes per virtual second",
    "utilisation": "the instances' mean busy share of the run (0 to 1)",
    "utilisation.max": "the busiest instance's busy share",
    "max_queue_depth": "the deepest any instance's queue got",
    "mean": "mean latency, arrival to success (virtual seconds)",
    "p50": "median latency",
    "p95": "95th percentile latency",
    "p99": "99th percentile latency",
    "max": "largest latency",
    "wait.mean": "mean wait from arrival to being stored",
    "wait.p99": "99th percentile of that wait",
    "wait.max": "largest such wait",
    "invariants_passed": "1 if every checked guarantee held, else 0",
}


def _latency(prefix: str, latency: Latency) -> dict[str, float]:
    return {
        f"{prefix}mean": latency.mean,
        f"{prefix}p50": latency.p50,
        f"{prefix}p95": latency.p95,
        f"{prefix}p99": latency.p99,
        f"{prefix}max": latency.max,
    }


def figures(result: Result) -> dict[str, float]:
    """Every figure of ``result`` by name (see :data:`DESCRIPTIONS`)."""
    shares = [instance.utilisation for instance in result.instances]
    named: dict[str, float] = {
        "offered": result.offered,
        "enqueued": result.acknowledged,
        "rejected": result.rejected,
        "failed_enqueue": result.failed,
        "succeeded": result.succeeded,
        "dead_lettered": result.dead_lettered,
        "pending": result.pending,
        "lost": result.lost,
        "retries": result.retries,
        "crashes": result.crashes,
        "restarts": result.restarts,
        "virtual_time": result.virtual_time,
        "throughput": result.throughput,
        "utilisation": math.fsum(shares) / len(shares) if shares else 0.0,
        "utilisation.max": max(shares, default=0.0),
        "max_queue_depth": result.max_depth,
        **_latency("", result.latency),
    }
    wait = result.enqueue_wait
    named.update({"wait.mean": wait.mean, "wait.p99": wait.p99, "wait.max": wait.max})
    named["invariants_passed"] = 1.0 if result.passed else 0.0
    return {name: float(value) for name, value in named.items()}
