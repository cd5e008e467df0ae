"""The tables of a scenario: arrivals, partitions, service, retry, faults, pauses, kills.

Each is a frozen dataclass that checks its fields as it is made; an error names
the field by its dotted path (``service.mean``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

from dopool._sim.checks import (
    ScenarioError,
    assign,
    choice,
    number,
    probability,
)

ROUTINGS = ("round-robin", "partition")
PROCESSES = ("steady", "poisson", "bursts")
DISTRIBUTIONS = ("fixed", "exponential", "lognormal")

DEFAULT_TOTAL = 1000
MAX_INSTANCES = 1024
MAX_EVENTS = 10_000_000
MAX_PAYLOAD_BYTES = 100_000  # below the engine's 128 KiB event limit, with room for the rest
MAX_KEYS = 1_000_000
# A storage or alarm fault that always fires would never let an instance recover or an
# alarm land, so a run could never end: keep them below certainty.
MAX_LIVELOCK_PROBABILITY = 0.5


# -- the sections -----------------------------------------------------------------
class Section:
    """A table of the scenario: its checks name fields as ``<section>.<field>``."""

    section: ClassVar[str]

    def __post_init__(self) -> None:
        try:
            self._check()
        except ScenarioError as exc:
            raise exc.within(self.section) from None

    def _check(self) -> None:
        """Validate the section's fields; each section overrides this."""


@dataclass(frozen=True, kw_only=True)
class Arrivals(Section):
    """When events arrive: ``steady`` (evenly spaced at ``rate``), ``poisson``
    (exponential gaps, mean rate ``rate``) or ``bursts`` (``burst_size`` events
    at once every ``burst_interval`` seconds). Give ``total`` events or a
    ``duration`` of arrivals in virtual seconds, not both (neither: 1000 events).
    ``pool`` names the pool they enter (absent: the first pool); with an app,
    ``payload`` names the function of its module that makes each event.
    """

    section: ClassVar[str] = "arrivals"

    pool: str | None = None
    payload: str | None = None
    process: str = "poisson"
    rate: float = 50.0
    total: int | None = None
    duration: float | None = None
    burst_size: int = 100
    burst_interval: float = 10.0

    def _check(self) -> None:
        _check_pool(self.pool)
        if self.payload is not None and not (
            isinstance(self.payload, str) and self.payload.isidentifier()
        ):
            raise ScenarioError("payload", f"must name a function, got {self.payload!r}")
        assign(self, "process", choice("process", self.process, PROCESSES))
        assign(self, "rate", number("rate", self.rate, above=0.0))
        if self.total is not None:
            number("total", self.total, integer=True, minimum=1, maximum=MAX_EVENTS)
        if self.duration is not None:
            assign(self, "duration", number("duration", self.duration, above=0.0))
        if self.total is not None and self.duration is not None:
            raise ScenarioError("duration", "cannot be given together with arrivals.total")
        if self.total is None and self.duration is None:
            assign(self, "total", DEFAULT_TOTAL)
        number("burst_size", self.burst_size, integer=True, minimum=1, maximum=MAX_EVENTS)
        assign(self, "burst_interval", number("burst_interval", self.burst_interval, above=0.0))
        if self.duration is not None and self.expected_events() > MAX_EVENTS:
            raise ScenarioError(
                "duration",
                f"gives about {self.expected_events():,.0f} events, over the limit of "
                f"{MAX_EVENTS:,}",
            )

    def expected_events(self) -> float:
        """How many events arrive (the mean, for a Poisson process of given duration)."""
        if self.total is not None:
            return float(self.total)
        assert self.duration is not None
        if self.process == "bursts":
            return math.ceil(self.duration / self.burst_interval) * self.burst_size
        return self.duration * self.rate


@dataclass(frozen=True, kw_only=True)
class Partitions(Section):
    """Partition keys ``k0 .. k{keys-1}``: key ``k`` is drawn with weight
    ``1 / (k + 1) ** zipf`` (0 = uniform); ``hot_key_share`` sends that share
    of all events to ``k0`` on top. Used only with ``routing = "partition"``.
    """

    section: ClassVar[str] = "partitions"

    keys: int = 64
    zipf: float = 0.0
    hot_key_share: float = 0.0

    def _check(self) -> None:
        number("keys", self.keys, integer=True, minimum=1, maximum=MAX_KEYS)
        assign(self, "zipf", number("zipf", self.zipf, minimum=0.0, maximum=10.0))
        assign(self, "hot_key_share", probability("hot_key_share", self.hot_key_share))


@dataclass(frozen=True, kw_only=True)
class Service(Section):
    """Virtual seconds one attempt takes (``ctx.sleep``): ``fixed`` at ``mean``,
    ``exponential`` with that mean, or ``lognormal`` with that mean and shape
    ``sigma`` (the standard deviation of its logarithm).
    """

    section: ClassVar[str] = "service"

    distribution: str = "exponential"
    mean: float = 0.05
    sigma: float = 0.5

    def _check(self) -> None:
        assign(self, "distribution", choice("distribution", self.distribution, DISTRIBUTIONS))
        assign(self, "mean", number("mean", self.mean, minimum=0.0, maximum=86_400.0))
        assign(self, "sigma", number("sigma", self.sigma, minimum=0.0, maximum=5.0))


@dataclass(frozen=True, kw_only=True)
class Retry(Section):
    """The pool's :class:`~dopool.RetryPolicy`; ``max_attempts = 1`` means no retries."""

    section: ClassVar[str] = "retry"

    max_attempts: int = 3
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.1

    def _check(self) -> None:
        number("max_attempts", self.max_attempts, integer=True, minimum=1, maximum=1000)
        assign(self, "initial_delay", number("initial_delay", self.initial_delay, minimum=0.0))
        assign(self, "multiplier", number("multiplier", self.multiplier, minimum=1.0))
        assign(self, "max_delay", number("max_delay", self.max_delay, minimum=self.initial_delay))
        assign(self, "jitter", probability("jitter", self.jitter))


@dataclass(frozen=True, kw_only=True)
class Faults(Section):
    """Probabilities of the engine's fault points (:class:`dopool.chaos.FaultPlan`)."""

    section: ClassVar[str] = "faults"

    crash_before_execute: float = 0.0
    crash_after_execute: float = 0.0
    crash_during_enqueue: float = 0.0
    alarm_error: float = 0.0
    storage_error: float = 0.0

    def _check(self) -> None:
        for name in ("crash_before_execute", "crash_after_execute", "crash_during_enqueue"):
            assign(self, name, probability(name, getattr(self, name)))
        for name in ("alarm_error", "storage_error"):
            assign(self, name, probability(name, getattr(self, name), MAX_LIVELOCK_PROBABILITY))

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) > 0 for f in fields(self))


@dataclass(frozen=True, kw_only=True)
class Pause:
    """Pause one instance (or all, ``instance`` absent) of ``pool`` (absent: the first)
    at ``at`` for ``duration`` seconds."""

    at: float
    duration: float
    instance: int | None = None
    pool: str | None = None

    def __post_init__(self) -> None:
        _check_pool(self.pool)
        assign(self, "at", number("at", self.at, minimum=0.0))
        assign(self, "duration", number("duration", self.duration, above=0.0))
        if self.instance is not None:
            number("instance", self.instance, integer=True, minimum=0)


@dataclass(frozen=True, kw_only=True)
class Kill:
    """Crash one instance of ``pool`` (absent: the first) at virtual time ``at``
    (as ``runtime.kill`` does)."""

    at: float
    instance: int = 0
    pool: str | None = None

    def __post_init__(self) -> None:
        _check_pool(self.pool)
        assign(self, "at", number("at", self.at, minimum=0.0))
        number("instance", self.instance, integer=True, minimum=0)


def _check_pool(pool: object) -> None:
    if pool is not None and not isinstance(pool, str):
        raise ScenarioError("pool", f"must be a pool's name, got {pool!r}")
