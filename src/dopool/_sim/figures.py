"""A run's figures by name: what gates (``--assert``) and sweeps read of a result.

Every figure is a number (a check that passed is 1.0, one that failed 0.0).
The names are documented in docs/simulate.md ("Figures"); they are stable, so
a gate in a CI script keeps meaning the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator

from dopool._sim.latency import Latency
from dopool._sim.metrics import Result, Stall

#: What each whole-run figure means, in the order they are listed.
DESCRIPTIONS: dict[str, str] = {
    "offered": "arrivals that happened",
    "enqueued": "arrivals stored (acknowledged)",
    "rejected": "arrivals refused because the instance's queue was full",
    "duplicates": "arrivals whose dedup key an event held (nothing stored)",
    "delayed": "arrivals stored with a delay (delayed_share)",
    "failed_enqueue": "arrivals whose instance crashed during the enqueue (nothing stored)",
    "succeeded": "events that succeeded",
    "dead_lettered": "events dead-lettered",
    "pending": "events still pending at the end (a run cut short by its duration)",
    "lost": "acknowledged events not accounted for (always 0 unless a guarantee broke)",
    "waiting_enqueue": "arrivals not yet stored when a duration stopped the run",
    "unfinished": "events unfinished at the end: pending, waiting_enqueue, follow-ups in flight",
    "censored": "1 if the latency figures leave unfinished events out (optimistic), else 0",
    "retries": "retries scheduled",
    "crashes": "instance crashes",
    "restarts": "supervisor restarts",
    "activations": "instances started (on first use, or again after an eviction)",
    "evictions": "instances evicted after idle_timeout with nothing to do",
    "active.peak": "the most instances running at once",
    "active.mean": "instances running, on average over the run's virtual time",
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
    "stalls": "times an instance's alarm was given up (alarm_retries): it held its events",
    "stall.max": "the longest such stall, virtual seconds (one still going: until the end)",
    "stalled": "instances still stalled at the end: a write would have woken them",
    "stalled_events": "the events those instances held at the end",
    "invariants_passed": "1 if every checked guarantee held, else 0",
    "cost.month": "US dollars a month on Cloudflare at the run's load, the plan included ([cost])",
    "cost.run": "US dollars the run itself would cost on Cloudflare, before any allowance",
    "cost.requests": "a month's dollars for requests (enqueues and alarm invocations)",
    "cost.duration": "a month's dollars for duration (GB-s)",
    "cost.rows_read": "a month's dollars for storage rows read",
    "cost.rows_written": "a month's dollars for storage rows written",
    "cost.stored": "a month's dollars for stored data",
}


#: Each pool's figures, named ``<pool>.<figure>`` in a scenario with several pools.
POOL_DESCRIPTIONS: dict[str, str] = {
    "offered": "arrivals into the pool",
    "enqueued": "events stored into the pool, follow-ups included",
    "succeeded": "the pool's events that succeeded",
    "dead_lettered": "the pool's events dead-lettered",
    "pending": "the pool's events still pending at the end",
    "unfinished": "the pool's events unfinished at the end (its latency figures leave them out)",
    "retries": "the pool's retries",
    "crashes": "the pool's instance crashes",
    "utilisation": "the pool's instances' mean busy share",
    "max_queue_depth": "the deepest any of its instances' queues got",
    "mean": "mean latency in the pool, arrival (or a follow-up's parent's success) to success",
    "p50": "median latency in the pool",
    "p95": "95th percentile latency in the pool",
    "p99": "99th percentile latency in the pool",
    "max": "largest latency in the pool",
}

#: End to end, named ``e2e.<figure>``, in a scenario with follow-ups.
E2E_DESCRIPTIONS: dict[str, str] = {
    "completed": "requests (an arrival and every event it caused) that all succeeded",
    "failed": "requests with an event dead-lettered",
    "unfinished": "requests with events still pending or in flight at the end",
    "mean": "mean end-to-end latency: arrival to the success of the last event it caused",
    "p50": "median end-to-end latency",
    "p95": "95th percentile end-to-end latency",
    "p99": "99th percentile end-to-end latency",
    "max": "largest end-to-end latency",
}


class _Names(Collection[str]):
    """Every name a figure may have: the whole run's, ``e2e.<name>``, and
    ``<pool>.<name>`` for any pool (a scenario's pools are known only when it runs).
    Iterating gives the whole run's names, then the patterns with ``<pool>``."""

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name in DESCRIPTIONS:
            return True
        prefix, _, rest = name.partition(".")
        if prefix == "e2e" and rest in E2E_DESCRIPTIONS:
            return True
        pool, _, rest = name.rpartition(".")
        return bool(pool) and rest in POOL_DESCRIPTIONS

    def __iter__(self) -> Iterator[str]:
        yield from DESCRIPTIONS
        yield from (f"e2e.{name}" for name in E2E_DESCRIPTIONS)
        yield from (f"<pool>.{name}" for name in POOL_DESCRIPTIONS)

    def __len__(self) -> int:
        return len(DESCRIPTIONS) + len(E2E_DESCRIPTIONS) + len(POOL_DESCRIPTIONS)


#: What a gate may name (see :class:`_Names`).
NAMES: Collection[str] = _Names()


def describe(result: Result) -> dict[str, str]:
    """What each of ``result``'s figures means, by name, in the order :func:`figures` gives."""
    described = dict(DESCRIPTIONS)
    if len(result.pools) > 1:
        for pool in result.pools:
            described.update(
                {f"{pool.name}.{name}": text for name, text in POOL_DESCRIPTIONS.items()}
            )
    if result.requests is not None:
        described.update({f"e2e.{name}": text for name, text in E2E_DESCRIPTIONS.items()})
    return described


def _latency(prefix: str, latency: Latency) -> dict[str, float]:
    return {
        f"{prefix}mean": latency.mean,
        f"{prefix}p50": latency.p50,
        f"{prefix}p95": latency.p95,
        f"{prefix}p99": latency.p99,
        f"{prefix}max": latency.max,
    }


def figures(result: Result) -> dict[str, float]:
    """Every figure of ``result`` by name (see :func:`describe`)."""
    shares = [instance.utilisation for instance in result.instances]
    named: dict[str, float] = {
        "offered": result.offered,
        "enqueued": result.acknowledged,
        "rejected": result.rejected,
        "duplicates": result.duplicates,
        "delayed": result.delayed,
        "failed_enqueue": result.failed,
        "succeeded": result.succeeded,
        "dead_lettered": result.dead_lettered,
        "pending": result.pending,
        "lost": result.lost,
        "waiting_enqueue": result.waiting,
        "unfinished": result.unfinished,
        "censored": 1.0 if result.latency.censored else 0.0,
        "retries": result.retries,
        "crashes": result.crashes,
        "restarts": result.restarts,
        "activations": result.activations.started,
        "evictions": result.activations.evicted,
        "active.peak": result.activations.peak,
        "active.mean": result.activations.mean,
        "virtual_time": result.virtual_time,
        "throughput": result.throughput,
        "utilisation": math.fsum(shares) / len(shares) if shares else 0.0,
        "utilisation.max": max(shares, default=0.0),
        "max_queue_depth": result.max_depth,
        **_latency("", result.latency),
    }
    wait = result.enqueue_wait
    named.update({"wait.mean": wait.mean, "wait.p99": wait.p99, "wait.max": wait.max})
    stalls = result.stalls
    still = [stall for stall in stalls if stall.until is None]
    named["stalls"] = len(stalls)
    named["stall.max"] = max(
        ((result.virtual_time if s.until is None else s.until) - s.since for s in stalls),
        default=0.0,
    )
    named["stalled"] = len(still)
    named["stalled_events"] = sum(_pending(result, stall) for stall in still)
    named["invariants_passed"] = 1.0 if result.passed else 0.0
    named.update(result.cost.figures())
    if len(result.pools) > 1:
        for pool in result.pools:
            prefix = f"{pool.name}."
            named.update(
                {
                    f"{prefix}offered": pool.offered,
                    f"{prefix}enqueued": pool.enqueued,
                    f"{prefix}succeeded": pool.succeeded,
                    f"{prefix}dead_lettered": pool.dead_lettered,
                    f"{prefix}pending": pool.pending,
                    f"{prefix}unfinished": pool.latency.unfinished,
                    f"{prefix}retries": pool.retries,
                    f"{prefix}crashes": pool.crashes,
                    f"{prefix}utilisation": pool.utilisation,
                    f"{prefix}max_queue_depth": pool.max_depth,
                    **_latency(prefix, pool.latency),
                }
            )
    requests = result.requests
    if requests is not None:
        named.update(
            {
                "e2e.completed": requests.completed,
                "e2e.failed": requests.failed,
                "e2e.unfinished": requests.unfinished,
                **_latency("e2e.", requests.latency),
            }
        )
    return {name: float(value) for name, value in named.items()}


def _pending(result: Result, stall: Stall) -> int:
    """The events a stalled instance holds, as its pool's result lists it."""
    found = result.pools[_position(result, stall.pool)].instance(stall.instance)
    return 0 if found is None else found.pending


def _position(result: Result, pool: str) -> int:
    return next(k for k, found in enumerate(result.pools) if found.name == pool)
