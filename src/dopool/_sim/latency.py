"""A distribution of durations, as a run's report gives it: count, mean, percentiles."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty one)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Latency:
    """A distribution of durations in virtual seconds (nearest-rank percentiles).

    ``unfinished`` counts what the sample leaves out because it had not finished when
    the run stopped (a ``duration``): the sample is then *censored*, its slowest members
    missing, and its percentiles optimistic.
    """

    count: int
    mean: float
    p50: float
    p95: float
    p99: float
    max: float
    unfinished: int = 0

    @classmethod
    def of(cls, samples: list[float], *, unfinished: int = 0) -> Latency:
        ordered = sorted(samples)
        if not ordered:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, unfinished)
        return cls(
            count=len(ordered),
            mean=math.fsum(ordered) / len(ordered),
            p50=percentile(ordered, 50),
            p95=percentile(ordered, 95),
            p99=percentile(ordered, 99),
            max=ordered[-1],
            unfinished=unfinished,
        )

    @property
    def censored(self) -> bool:
        """Whether some of the population had not finished: the figures cover the rest."""
        return self.unfinished > 0

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "mean": round(self.mean, 6),
            "p50": round(self.p50, 6),
            "p95": round(self.p95, 6),
            "p99": round(self.p99, 6),
            "max": round(self.max, 6),
            "unfinished": self.unfinished,
            "censored": self.censored,
        }
