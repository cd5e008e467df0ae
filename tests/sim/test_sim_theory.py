"""The simulator against queueing theory: the real engine, in virtual time, behaves as
the textbook queues it should (docs/simulate.md, "What a run does").

Each check runs several seeds and compares the mean over them with the theory, within
four standard errors of that mean (the seeds are fixed, so the test is deterministic;
the tolerance is what makes a wrong engine fail it). The partitioned pool's check is one
long run instead, its tolerance a batch-means confidence interval from its own latencies.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable

import pytest

from dopool._cluster.routing import stable_hash
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


# -- partition routing: each instance an M/M/1 queue, checked by batch means -----------
MU = 10.0  # service rate: exponential service of mean 0.1 s
LAMBDA = 32.0  # Poisson arrivals over 4 instances: rho = 0.8 on average
INSTANCES = 4
KEYS = 10_000
PARTITIONED_ARRIVALS = 400_000
# M/M/1 at rho = 0.8 forgets its state over ~1/(mu (1 - sqrt(rho))^2) ~ 90 service times,
# 9 s here (14 s for the busiest instance, at rho ~ 0.84). A batch of 3,000 successes spans
# ~94 s, ~10 of those times: in the same model fed to a Lindley recursion, the lag-1
# correlation of such batch means is ~0.01, against ~0.1 for batches of 1,000. The first
# batch is dropped as the warm-up from empty (~7 relaxation times of the busiest instance).
BATCH = 3000
CONFIDENCE = 0.99
# The half-width a run of this length gives is fixed by the queue, not by the batching: the
# mean of n sojourn times of an M/M/1 queue at rho = 0.8 has a variance of ~2,000 / n mean
# service times squared, so a 99% interval over 400,000 events is ~4% of the mean (this
# run: 0.5197 s +- 3.7%, 132 batches, against a theory of 0.5105 s).
MAX_HALF_WIDTH = 0.05


def t_quantile(probability: float, df: int) -> float:
    """Student's t quantile by its Cornish-Fisher expansion around the normal one (within
    2e-5 for ``df`` >= 30, where the test uses it)."""
    z = statistics.NormalDist().inv_cdf(probability)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
    )
    return z + math.fsum(term / df ** (power + 1) for power, term in enumerate(terms))


def batch_means_interval(samples: list[float], batch: int) -> tuple[float, float, int]:
    """The mean of ``samples`` (an autocorrelated series, in time order) and the half-width
    of its CONFIDENCE interval by batch means, after dropping the first batch; and the
    number of batches."""
    kept = samples[batch:]
    count = len(kept) // batch
    means = [statistics.fmean(kept[b * batch : (b + 1) * batch]) for b in range(count)]
    mean = statistics.fmean(means)
    quantile = t_quantile(1 - (1 - CONFIDENCE) / 2, count - 1)
    return mean, quantile * statistics.stdev(means, mean) / math.sqrt(count), count


@pytest.mark.slow
def test_partitioned_instances_are_m_m_1_queues() -> None:
    """Partition routing over 10,000 uniformly drawn keys: the router hashes each key to an
    instance, so instance i sees a thinned Poisson stream of rate lambda_i = lambda * p_i and
    is an M/M/1 queue, its mean time in system 1 / (mu - lambda_i). p_i is the instance's
    actual share of the arrivals, not 1/4: the hash splits these keys 2470/2622/2485/2423,
    so the busiest instance runs at rho ~ 0.84 and its 1/(mu - lambda_i) is ~24% over the
    even split's. The mean over every event is then sum_i p_i / (mu - lambda_i).

    One run, its per-event latencies (arrival to success) in the order they succeeded, and
    a 99% batch-means interval (see BATCH): the theory must lie inside it, and the interval
    must be narrow enough to mean something (MAX_HALF_WIDTH)."""
    result = run(
        loading.loads(
            f"""
            seed = 1
            instances = {INSTANCES}
            routing = "partition"
            [partitions]
            keys = {KEYS}
            zipf = 0.0
            [arrivals]
            rate = {LAMBDA}
            total = {PARTITIONED_ARRIVALS}
            [service]
            distribution = "exponential"
            mean = {1 / MU}
            """
        )
    ).result
    assert result.passed
    assert result.finished
    assert len(result.latencies) == result.succeeded == PARTITIONED_ARRIVALS
    shares = [instance.enqueued / result.acknowledged for instance in result.instances]
    # The router did split by the keys' hash: each share within 4 standard errors of the
    # share of keys hashed to the instance.
    hashed = Counter(stable_hash(f"k{key}") % INSTANCES for key in range(KEYS))
    for index, share in enumerate(shares):
        expected = hashed[index] / KEYS
        error = math.sqrt(expected * (1 - expected) / PARTITIONED_ARRIVALS)
        assert abs(share - expected) <= 4 * error, (index, share, expected)
    theory = math.fsum(share / (MU - LAMBDA * share) for share in shares)
    # Result.latencies lists the events as they succeeded (the collector's order): a time
    # series, as batch means need. Out of order, the batches would differ wildly and the
    # interval's width fail the test rather than pass it.
    mean, half_width, batches = batch_means_interval(result.latencies, BATCH)
    summary = (
        f"mean {mean:.4f} s +- {half_width:.4f} ({half_width / mean:.1%}, {batches} batches), "
        f"theory {theory:.4f} s, shares {[round(share, 4) for share in shares]}"
    )
    assert abs(mean - theory) <= half_width, summary
    assert half_width <= MAX_HALF_WIDTH * mean, summary
