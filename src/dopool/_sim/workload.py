"""The workload a scenario gives the pool: its arrivals and its handler, from the seed alone."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dopool._context import EventContext
from dopool._sim.arrivals import records
from dopool._sim.scenario import Scenario

POOL = "sim"  # the simulated pool's name


class SimulatedFailure(Exception):
    """A transient failure the scenario injects (``failure_probability``)."""


class PoisonEventError(Exception):
    """A poison event fails on every attempt."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """One event to enqueue at virtual time ``time`` (``pool``: a replayed record's, unused)."""

    time: float
    event_id: int
    partition_key: str | None
    poison: bool
    pool: str | None = None


def arrivals(scenario: Scenario) -> list[Arrival]:
    """Every arrival of the scenario, in time order, from its seed alone.

    Times (:mod:`dopool._sim.arrivals`), keys and poison draws come from separate
    seeded streams, so changing one knob (say the key skew) does not reshuffle
    the others. A replayed record's partition key replaces the picked one (the
    pick is drawn all the same, so the other events keep theirs).
    """
    seed = scenario.seed
    keys = _key_picker(scenario, random.Random(f"{seed}/keys"))
    poison = random.Random(f"{seed}/poison")
    share = scenario.poison_share
    keyed = scenario.routing == "partition"
    result = []
    times = random.Random(f"{seed}/times")
    for number, record in enumerate(records(scenario.arrivals, times)):
        key = keys()
        if keyed and record.partition_key is not None:
            key = record.partition_key
        bad = share > 0 and poison.random() < share
        result.append(Arrival(record.time, number, key, bad, record.pool))
    return result


def _key_picker(scenario: Scenario, rng: random.Random) -> Callable[[], str | None]:
    if scenario.routing != "partition":
        return lambda: None
    spec = scenario.partitions
    names = [f"k{n}" for n in range(spec.keys)]
    cumulative = list(
        itertools.accumulate(1.0 / (rank + 1) ** spec.zipf for rank in range(spec.keys))
    )
    total = cumulative[-1]
    hot = spec.hot_key_share

    def pick() -> str:
        if hot > 0 and rng.random() < hot:
            return names[0]
        return names[min(bisect.bisect_right(cumulative, rng.random() * total), spec.keys - 1)]

    return pick


def service_time(scenario: Scenario, rng: random.Random) -> float:
    """One attempt's virtual service time, drawn from the scenario's distribution."""
    spec = scenario.service
    if spec.mean <= 0:
        return 0.0
    if spec.distribution == "fixed":
        return spec.mean
    if spec.distribution == "exponential":
        return rng.expovariate(1.0 / spec.mean)
    mu = math.log(spec.mean) - spec.sigma**2 / 2.0  # so that the mean is ``spec.mean``
    return rng.lognormvariate(mu, spec.sigma)


def make_handler(scenario: Scenario) -> Callable[[EventContext], None]:
    """The pool's handler: sleep for the service time, then fail as the scenario says.

    Each attempt draws from its own ``random.Random`` seeded by (scenario seed,
    event id, attempt), so an attempt behaves the same whatever ran before it.
    """
    seed = scenario.seed
    failure = scenario.failure_probability

    def handle(ctx: EventContext) -> None:
        event = ctx.event
        number = event["id"]
        rng = random.Random(f"{seed}/{number}/{ctx.attempt}")
        seconds = service_time(scenario, rng)
        if seconds > 0:
            ctx.sleep(seconds)
        if event.get("poison"):
            raise PoisonEventError(f"poison event {number} can never succeed")
        if failure > 0 and rng.random() < failure:
            raise SimulatedFailure(f"event {number} failed on attempt {ctx.attempt}")

    return handle


def make_event(arrival: Arrival, padding: bytes) -> dict[str, Any]:
    event: dict[str, Any] = {"id": arrival.event_id}
    if arrival.poison:
        event["poison"] = True
    if padding:
        event["pad"] = padding
    return event
