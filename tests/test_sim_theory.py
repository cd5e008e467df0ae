"""The simulator against queueing theory: the real engine, in virtual time, behaves as
the textbook queues it should (docs/simulate.md, "What a run does").

Each check runs several seeds and compares the mean over them with the theory, within
four standard errors of that mean (the seeds are fixed, so the test is deterministic;
the tolerance is what makes a wrong engine fail it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from dopool._sim import loading
from dopool._sim.driver import run
from dopool._sim.metrics import Result

SEEDS = range(1, 7)
ARRIVALS = 4000


def close_to_theory(
    results: list[Result], measure: Callable[[Result], float], theory: float
) -> str:
    """'' if the seeds' mean of ``measure`` is within 4 standard errors of ``theory``."""
    values = [measure(result) for result in results]
    mean = statistics.fmean(values)
    error = statistics.stdev(values) / math.sqrt(len(values))
    if abs(mean - theory) <= 4 * error:
        return ""
    return f"mean {mean:.4f} over {len(values)} seeds, theory {theory:.4f}, error {error:.4f}"


def test_one_instance_is_an_m_m_1_queue() -> None:
    """Poisson arrivals at 5/s, exponential service of mean 0.1 s: rho = 0.5, and the
    mean time in the system is 1 / (mu - lambda) = 0.2 s."""
    results = [
        run(
            loading.loads(
                f"""
                seed = {seed}
                instances = 1
                [arrivals]
                rate = 5.0
                total = {ARRIVALS}
                [service]
                distribution = "exponential"
                mean = 0.1
                """
            )
        ).result
        for seed in SEEDS
    ]
    assert all(result.passed for result in results)
    assert close_to_theory(results, lambda r: r.latency.mean, 1 / (10 - 5)) == ""
    assert close_to_theory(results, lambda r: r.instances[0].utilisation, 0.5) == ""


def test_two_pools_in_a_chain_are_a_tandem_of_m_m_1_queues() -> None:
    """Every event of pool a becomes one follow-up into pool b (one instance each, Poisson
    arrivals at 4/s, exponential service of means 0.1 s and 0.125 s). By Burke's theorem
    b's arrivals are Poisson too, and a request's mean time end to end is the sum of the
    stations': 1/(10 - 4) + 1/(8 - 4) = 0.4167 s."""
    results = [
        run(
            loading.loads(
                f"""
                seed = {seed}
                instances = 1
                [service]
                distribution = "exponential"
                [arrivals]
                pool = "a"
                rate = 4.0
                total = {ARRIVALS}
                [[pools]]
                name = "a"
                [pools.service]
                mean = 0.1
                [[pools.follow_ups]]
                to = "b"
                [[pools]]
                name = "b"
                [pools.service]
                mean = 0.125
                """
            )
        ).result
        for seed in SEEDS
    ]
    assert all(result.passed for result in results)
    assert all(result.requests is not None for result in results)
    assert close_to_theory(results, lambda r: r.pools[0].latency.mean, 1 / (10 - 4)) == ""
    assert close_to_theory(results, lambda r: r.pools[1].latency.mean, 1 / (8 - 4)) == ""
    end_to_end = 1 / (10 - 4) + 1 / (8 - 4)
    assert close_to_theory(results, lambda r: r.requests.latency.mean, end_to_end) == ""  # type: ignore[union-attr]
