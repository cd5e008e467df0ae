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
