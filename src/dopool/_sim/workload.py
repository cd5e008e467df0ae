"""The workload a scenario gives its pools: arrivals and handlers, from the seed alone."""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dopool._engine.context import EventContext
from dopool._errors import ScenarioError
from dopool._sim.arrivals import records
from dopool._sim.draws import Draws, attempt_draws
from dopool._sim.pools import DEFAULT_POOL, FollowUp, Pool
from dopool._sim.scenario import Arrivals, Scenario
from dopool._sim.sections import Service

POOL = DEFAULT_POOL  # the pool of a scenario without [[pools]]

#: ``pick(rng)``: a partition key for one event, or None.
KeyPicker = Callable[[random.Random], str | None]


class SimulatedFailure(Exception):
    """A transient failure the scenario injects (``failure_probability``)."""


class PoisonEventError(Exception):
    """A poison event fails on every attempt."""


class Arrival(NamedTuple):
    """One event to enqueue into ``pool`` at virtual time ``time`` (a named tuple: a run
    makes one per event, and a frozen dataclass costs three times as much to make)."""

    time: float
    event_id: int
    partition_key: str | None
    poison: bool
    pool: str = POOL
    payload: str | None = None  # the app's function that makes the event
    dedup_key: str | None = None  # with a pool's duplicate_share: its own, or a recent one's
    delay: float | None = None  # with a pool's delayed_share: its delay, virtual seconds


def arrivals(scenario: Scenario, app_pools: Sequence[str] = ()) -> list[Arrival]:
    """Every arrival of the scenario, in time order, from its seed alone.

    Times (:mod:`dopool._sim.arrivals`), keys and poison draws come from separate
    seeded streams, so changing one knob (say the key skew) does not reshuffle
    the others; each arrival stream has its own (the first one's are those of a
    one-stream scenario). Arrivals are numbered in time order across the streams
    (ties: stream order). A replayed record's pool replaces the stream's, and its
    partition key the picked one (the pick is drawn all the same, so the other
    events keep theirs). With an app, ``app_pools`` are the pools it defined: a
    stream without a pool enters the first, and keys follow the scenario's
    top-level routing.
    """
    seed = scenario.seed
    if scenario.app is None:
        designs = {pool.name: pool for pool in scenario.resolved_pools}
    else:
        defaults = scenario.resolved_pools[0]
        designs = {name: dataclasses.replace(defaults, name=name) for name in app_pools}
    drafts: list[Iterator[Draft]] = []
    payloads: dict[int, str | None] = {}
    for position, stream in enumerate(scenario.arrivals):
        suffix = "" if position == 0 else f"/{position}"
        payloads[position] = stream.payload
        drafts.append(
            _stream(
                stream,
                position,
                designs,
                random.Random(f"{seed}/times{suffix}"),
                random.Random(f"{seed}/keys{suffix}"),
                random.Random(f"{seed}/poison{suffix}"),
                random.Random(f"{seed}/keys{suffix}/moved"),
                random.Random(f"{seed}/dups{suffix}"),
                random.Random(f"{seed}/delays{suffix}"),
            )
        )
    return [
        Arrival(at, number, key, poison, pool, payloads[stream], dedup, delay)
        for number, (at, stream, key, poison, pool, dedup, delay) in enumerate(heapq.merge(*drafts))
    ]


# An arrival before its number: time, stream, key, poison, pool, dedup key, delay.
Draft = tuple[float, int, str | None, bool, str, str | None, float | None]


def _stream(
    spec: Arrivals,
    position: int,
    designs: dict[str, Pool],
    times: random.Random,
    keys: random.Random,
    poison: random.Random,
    moved: random.Random,  # keys of records replayed into another pool
    dups: random.Random,  # which arrivals repeat a recent one's dedup key
    delays: random.Random,  # which arrivals are delayed
) -> Iterator[Draft]:
    entry = designs[spec.pool] if spec.pool is not None else next(iter(designs.values()))
    pickers = {name: key_picker(design) for name, design in designs.items()}
    recent: dict[str, list[str]] = {}  # each pool's last RECENT_KEYS dedup keys
    for count, record in enumerate(records(spec, times)):
        pool = entry
        if record.pool is not None and record.pool != entry.name:
            if record.pool not in designs:
                raise ScenarioError(
                    "arrivals.file",
                    f"{spec.file}: a record names pool {record.pool!r}, which the scenario "
                    f"does not have ({', '.join(designs)})",
                )
            pool = designs[record.pool]
        key = pickers[entry.name](keys)  # drawn all the same: the others keep theirs
        if pool is not entry:
            key = pickers[pool.name](moved)
        if record.partition_key is not None and pool.routing == "partition":
            key = record.partition_key
        share = pool.poison_share
        is_poison = share > 0 and poison.random() < share
        dedup = None
        if pool.duplicate_share > 0:
            dedup = _dedup_key(pool, f"{position}/{count}", dups, recent.setdefault(pool.name, []))
        delay = (
            pool.delay if pool.delayed_share > 0 and delays.random() < pool.delayed_share else None
        )
        yield record.time, position, key, is_poison, pool.name, dedup, delay


#: How far back a duplicate arrival reaches: one of its pool's last this many keys.
RECENT_KEYS = 16


def _dedup_key(pool: Pool, own: str, dups: random.Random, recent: list[str]) -> str:
    """An arrival's dedup key: with the pool's ``duplicate_share``, one of the pool's
    recent keys (a duplicate arrival), else its own, ``own``."""
    if recent and dups.random() < pool.duplicate_share:
        return recent[dups.randrange(len(recent))]
    recent.append(own)
    if len(recent) > RECENT_KEYS:
        del recent[0]
    return own


def key_picker(pool: Pool) -> KeyPicker:
    """How a pool's events get partition keys: none under round-robin routing."""
    if pool.routing != "partition":
        return lambda _rng: None
    spec = pool.partitions
    names = spec.drawn()
    cumulative = list(
        itertools.accumulate(1.0 / (rank + 1) ** spec.zipf for rank in range(len(names)))
    )
    total = cumulative[-1]
    hot = spec.hot_key_share

    def pick(rng: random.Random) -> str:
        if hot > 0 and rng.random() < hot:
            return names[0]
        return names[min(bisect.bisect_right(cumulative, rng.random() * total), len(names) - 1)]

    return pick


def service_time(spec: Service, rng: random.Random) -> float:
    """One attempt's virtual service time, drawn from the pool's distribution."""
    if spec.mean <= 0:
        return 0.0
    if spec.distribution == "fixed":
        return spec.mean
    if spec.distribution == "exponential":
        return rng.expovariate(1.0 / spec.mean)
    mu = math.log(spec.mean) - spec.sigma**2 / 2.0  # so that the mean is ``spec.mean``
    return rng.lognormvariate(mu, spec.sigma)


@dataclass(slots=True)
class Lineage:
    """Which request each executed event belongs to, and how many follow-ups each
    attempt enqueued: what end-to-end latency is measured with.

    ``requests[(pool, index, sequence)]`` is the arrival number whose request the
    event is part of; ``spawned[(pool, index, sequence, attempt)]`` the follow-ups
    that attempt enqueued (they commit only if it succeeds); ``parents`` maps a
    follow-up to the event that enqueued it, so its time in its pool can run from
    its parent's success (the moment it was handed on), not from its being stored.
    A scenario without follow-ups leaves it empty: each event is its own request.
    """

    requests: dict[tuple[str, int, int], int] = field(default_factory=dict)
    spawned: dict[tuple[str, int, int, int], int] = field(default_factory=dict)
    keys: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # event id -> key
    parents: dict[tuple[str, int, int], tuple[str, int, int]] = field(default_factory=dict)

    def executed(self, key: tuple[str, int, int], identity: Any, request: int) -> None:
        """The handler ran event ``identity`` (of ``request``), stored under ``key``."""
        self.requests[key] = request
        self.keys[str(identity)] = key
        if isinstance(identity, str):  # a follow-up: "<parent id>/<rule>.<copy>"
            parent = self.keys.get(identity.rpartition("/")[0])
            if parent is not None:
                self.parents[key] = parent


def make_handler(
    seed: int, pool: Pool, pools: dict[str, Pool], lineage: Lineage
) -> Callable[[EventContext], None]:
    """A pool's handler: sleep for the service time, fail as the pool says, else enqueue
    its follow-ups.

    Each attempt draws from streams seeded by (scenario seed, event id, attempt)
    (:mod:`dopool._sim.draws`), so an attempt behaves the same whatever ran before it.
    """
    failure = pool.failure_probability
    pickers = {name: key_picker(target) for name, target in pools.items()}
    padding = {name: b"\0" * target.payload_bytes for name, target in pools.items()}
    # Without follow-ups anywhere, every event is its own request: nothing to trace.
    traced = any(target.follow_ups for target in pools.values())

    def handle(ctx: EventContext) -> None:
        event = ctx.event
        number = event["id"]
        request = event.get("req", number)
        if traced:
            lineage.executed((pool.name, ctx.instance_index, ctx.sequence), number, request)
        rng = attempt_draws(seed, number, ctx.attempt)
        seconds = service_time(pool.service, rng)
        if seconds > 0:
            ctx.sleep(seconds)
        if event.get("poison"):
            raise PoisonEventError(f"poison event {number} can never succeed")
        if failure > 0 and rng.random() < failure:
            raise SimulatedFailure(f"event {number} failed on attempt {ctx.attempt}")
        spawned = 0
        if pool.follow_ups:
            draws = Draws(f"{seed}/{number}/{ctx.attempt}/follow")
            for rule, follow in enumerate(pool.follow_ups):
                for copy in range(_fanout(follow, draws)):
                    child = f"{number}/{rule}.{copy}"
                    target = pools[follow.to]
                    local = Draws(f"{seed}/{child}")
                    key = pickers[follow.to](local)
                    share = target.poison_share
                    poison = share > 0 and local.random() < share
                    payload = _payload(child, request, poison, padding[follow.to])
                    ctx.enqueue(payload, partition_key=key, pool=follow.to)
                    spawned += 1
        if traced:
            lineage.spawned[(pool.name, ctx.instance_index, ctx.sequence, ctx.attempt)] = spawned

    return handle


def _fanout(follow: FollowUp, rng: random.Random) -> int:
    """How many follow-ups one success enqueues under ``follow``."""
    if rng.random() >= follow.probability:
        return 0
    if follow.fanout == "fixed":
        return int(follow.count)
    if follow.fanout == "poisson":
        # Knuth's method: fine for the small means a fan-out has.
        limit, count, product = math.exp(-follow.count), 0, rng.random()
        while product > limit:
            count += 1
            product *= rng.random()
        return count
    # Geometric on 0, 1, 2, ... with mean ``count``: failures before the first success.
    success = 1.0 / (1.0 + follow.count)
    return int(math.log(1.0 - rng.random()) / math.log(1.0 - success)) if success < 1 else 0


def _payload(identity: Any, request: int, poison: bool, padding: bytes) -> dict[str, Any]:
    event: dict[str, Any] = {"id": identity}
    if identity != request:
        event["req"] = request
    if poison:
        event["poison"] = True
    if padding:
        event["pad"] = padding
    return event


def make_event(arrival: Arrival, padding: bytes) -> dict[str, Any]:
    """An arriving event: its number (its request's too), and what the scenario adds."""
    return _payload(arrival.event_id, arrival.event_id, arrival.poison, padding)
