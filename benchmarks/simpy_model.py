"""A SimPy model of the simulator benchmark's scenario, to time ``dopool simulate`` against.

``dopool simulate`` runs the real engine in virtual time; this runs the textbook
model of the same pool in SimPy: one FIFO single server (``simpy.Resource`` of
capacity 1) per instance. It takes the scenario's own draws: the arrivals
(times, event ids, partition keys) from :func:`dopool._sim.workload.arrivals`
and each event's service time from the stream its first attempt draws from in
dopool (:func:`~dopool._sim.draws.attempt_draws`), and routes each arrival as
dopool's router does (round-robin in arrival order, or the key's stable hash).
So its times in system (arrival to completion) are dopool's latencies (arrival
to success), up to the rounding of adding the same floats in another order, and
the two runs' events per wall second compare like with like.

Only the benchmark's shape is modelled: one pool, one Poisson arrival stream,
exponential service, round-robin or partition routing, and nothing that fails,
retries, rejects, pauses, stops early or enqueues follow-ups.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import simpy

from dopool._cluster.routing import stable_hash
from dopool._sim.draws import attempt_draws
from dopool._sim.latency import Latency
from dopool._sim.pools import Pool
from dopool._sim.scenario import Scenario
from dopool._sim.workload import Arrival, arrivals, service_time

Steps = Generator[simpy.Event, Any, None]  # a SimPy process: what it waits for, in turn


@dataclass(frozen=True, slots=True)
class SimPyRun:
    """A finished SimPy run: each arrival's time in system, and the wall-clock cost."""

    in_system: list[float]  # virtual seconds, arrival to completion, in arrival order
    wall_seconds: float

    @property
    def events_per_wall_second(self) -> float:
        """Arrivals simulated per second of wall time (as dopool's ``Run`` counts them)."""
        return len(self.in_system) / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def latency(self) -> Latency:
        """The times in system summarised as dopool summarises its latencies."""
        return Latency.of(self.in_system)


def run(scenario: Scenario) -> SimPyRun:
    """Run the SimPy model of ``scenario`` and time it.

    The wall time covers what dopool's :func:`~dopool._sim.driver.run` covers of
    the same work: making the arrivals, routing them, drawing each service time
    (when its event starts, as dopool's handler does) and the simulation itself.

    Raises:
        ValueError: the scenario is not of the benchmark's shape (see the module).
    """
    pool = benchmark_pool(scenario)
    seed, service = scenario.seed, pool.service
    started = time.perf_counter()
    schedule = arrivals(scenario)
    env = simpy.Environment()
    assert isinstance(pool.instances, int), "refused by benchmark_pool"
    servers = [simpy.Resource(env, capacity=1) for _ in range(pool.instances)]
    route = _router(pool.instances)
    in_system = [math.nan] * len(schedule)

    def event(position: int, arrival: Arrival, server: simpy.Resource) -> Steps:
        with server.request() as turn:
            yield turn
            draws = attempt_draws(seed, arrival.event_id, 1)
            yield env.timeout(service_time(service, draws))
        in_system[position] = env.now - arrival.time

    def source() -> Steps:
        for position, arrival in enumerate(schedule):
            yield env.timeout(arrival.time - env.now)
            env.process(event(position, arrival, servers[route(arrival.partition_key)]))

    env.process(source())
    env.run()
    wall = time.perf_counter() - started
    return SimPyRun(in_system, wall)


def benchmark_pool(scenario: Scenario) -> Pool:
    """The scenario's one pool, if the model covers the scenario; else ValueError."""
    pools, streams = scenario.resolved_pools, scenario.arrivals
    pool = pools[0]
    refusals = [
        (scenario.app is not None, "an app (--app)"),
        (len(pools) != 1, f"{len(pools)} pools"),
        (len(streams) != 1, f"{len(streams)} arrival streams"),
        (
            any(stream.process != "poisson" for stream in streams),
            "arrivals that are not Poisson",
        ),
        (
            pool.service.distribution != "exponential",
            f"{pool.service.distribution} service",
        ),
        (pool.routing not in ("round-robin", "partition"), f"{pool.routing} routing"),
        (not isinstance(pool.instances, int), "an instance per key"),
        (pool.failure_probability > 0, "failures"),
        (pool.poison_share > 0, "poison events"),
        (bool(pool.follow_ups), "follow-ups"),
        (pool.max_queue_depth is not None, "a max_queue_depth"),
        (scenario.faults.any, "faults"),
        (bool(scenario.pauses), "pauses"),
        (bool(scenario.kills), "kills"),
        (scenario.duration is not None, "a duration"),
    ]
    found = [what for refused, what in refusals if refused]
    if found:
        raise ValueError(
            f"the SimPy model covers one pool with Poisson arrivals, exponential service "
            f"and nothing that fails, rejects, pauses or stops early; scenario "
            f"{scenario.name!r} has {', '.join(found)}"
        )
    return pool


def _router(instances: int) -> Callable[[str | None], int]:
    """``route(partition_key)``: the instance dopool's router picks, given the arrivals
    in order (``dopool._cluster.routing.Router.choose`` without its lock)."""
    turns = itertools.count()

    def route(partition_key: str | None) -> int:
        if partition_key is not None:
            return stable_hash(partition_key) % instances
        return next(turns) % instances

    return route
