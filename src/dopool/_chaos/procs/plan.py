"""One seed's multi-process scenario: the pool, each producer's stream, the workers' fate.

Everything here is drawn from the seed alone, so the worker's app, each producer
process and the checker draw the same :class:`Plan` from the seed they are given.
The actions on the worker (SIGKILL, SIGTERM, a restart, a live pause and resume)
are placed on the run's *progress*: acknowledged enqueues plus attempts started,
counted by the runner as the processes report them, never on wall time.

Half the seeds run a second worker beside the first (``workers == 2``): two ``dopool
worker`` processes share the store, each serving the instances it leases, and the
second has kills and restarts of its own (chain 1), so that one worker takes the
other's instances over once their leases expire. What a second worker does is drawn
from a random generator of its own, so every seed's first worker, producers and
behaviours are what they were before there could be a second.

Half the seeds also **freeze a writer** (``freeze``, :mod:`.freeze`): a producer or a
worker is stopped (SIGSTOP) while it holds the store's writer lock, for a fraction of
the workers' lease ttl up to three times it, then continued; drawn from a generator of
its own as well.

One seed in :data:`BIG_EVERY` (those whose number is :data:`BIG_AT` modulo it) is of
the **big** family instead (:func:`draw_big`): a pool of 2,048 to 4,096 instances
shared by two or three workers, a third or fourth worker joining mid-run and one
leaving, and producers whose events reach every instance. Half of those (drawn from a
generator of their own, :func:`_per_key`) run the same streams on a **per-key** pool
instead: each event of the first producer's sweep its own key, so thousands of
instances are activated on demand, evicted after a short ``idle_timeout`` and started
again, in workers of few slots (``--max-active``), while workers join, leave and die.

Two more draws come from generators of their own, so that the others are what they were
before them: about half the seeds give the pool an ``async def`` handler
(:func:`async_handler`), and about three in ten a rate limit (:func:`rate_limit`, the big
family's faster). :meth:`Plan.describe` says both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Literal

from dopool._engine.options import DEFAULT_IDLE_TIMEOUT
from dopool._rates import RateLimit
from dopool._retry import RetryPolicy
from dopool._store.layout.limits import PER_KEY

POOL = "mp"
#: High enough that no planned failure and no kill dead-letters an event by accident:
#: an event takes its planned failures (at most 2), one attempt per kill that
#: interrupts it (at most ``MAX_KILLS``), and one more.
MAX_ATTEMPTS = 8
MAX_KILLS = 3
RETRY = RetryPolicy(max_attempts=MAX_ATTEMPTS, initial_delay=0.01, multiplier=2.0, max_delay=0.04)
DEDUP_WINDOWS = (0.0, 3600.0)  # a key freed once its event ends; held for the whole run
LEASE_TTL = 0.6  # the workers' --lease-ttl: a killed worker's instances move this soon
#: One seed in ``BIG_EVERY``, ``seed % BIG_EVERY == BIG_AT``, is of the big family: a
#: fixed share, so that any ``BIG_EVERY`` consecutive seeds (CI runs 30 from a random
#: start) hold the same number of them, evenly spaced, and a run's time varies little.
#: Fifteen: a big seed costs as much CPU as six others (docs/chaos.md, the big family).
BIG_EVERY = 15
BIG_AT = 2
BIG_CONCURRENCY = (2048, 4096)  # the big family's pools: this many instances, at random
BIG_KEYED = 300  # the most events a big seed's producer other than the first sends
#: The big family's --lease-ttl: a third of it between renewals leaves a worker of
#: thousands of instance threads, on a loaded two-core machine, a margin 0.6 s does not.
BIG_LEASE_TTL = 2.0
ASYNC_SHARE = 0.5  # of the seeds, those whose handler is an ``async def``
RATE_SHARE = 0.3  # of the seeds, those whose pool is rate limited
#: The limits they draw from. A run starts 50 to 200 attempts in a few seconds, a dozen
#: or more within 10 ms at times (several hundred a second): each binds, and adds a
#: second or two at most to a run.
RATES = (
    RateLimit(rate=200, burst=5),
    RateLimit(rate=100, burst=1),
    RateLimit(rate=50, burst=3),
)
#: The big family's: thousands of attempts, some 500 a second on average and bursts of
#: twice that, kept to at most about 4 s more.
BIG_RATE = RateLimit(rate=1000, burst=20)
#: The big family's workers' --max-active: at the default 1,024, a worker whose thousand
#: threads all wake at once (a frozen writer let go) kept its renewal thread from the GIL
#: past the ttl on a loaded two-core machine, and lost live leases (seed 694982 beside two
#: other runs, with the code of before this bound too, when every instance of a unit
#: taken had a thread).
BIG_MAX_ACTIVE = 256
#: The share of the big family's seeds run on a per-key pool (:func:`_per_key`), the
#: idle timeouts their pool takes, and the --max-active their workers take.
PER_KEY_SHARE = 0.5
PER_KEY_IDLE = (0.2, 1.0)
PER_KEY_ACTIVE = (16, 64)
#: A freeze keeps its target stopped for ``FREEZE_TTLS`` times the lease ttl at most.
FREEZE_TTLS = 3.0


@dataclass(frozen=True, slots=True)
class Send:
    """One producer call: ``enqueue`` (one id) or ``enqueue_many`` (several)."""

    ids: tuple[str, ...]
    partition_key: str | None
    priority: int
    delay: float | None
    dedup_keys: tuple[str | None, ...]

    @property
    def batch(self) -> bool:
        return len(self.ids) > 1


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What the handler does with one event: ``fails`` attempts raise first; ``mode``
    ``"perm"`` raises ``PermanentError`` at once, ``"always"`` raises every time; ``slow``
    seconds of real time per attempt."""

    fails: int = 0
    mode: str = "ok"
    slow: float = 0.0

    @property
    def dead(self) -> bool:
        """Whether the event must end dead-lettered (otherwise it must succeed)."""
        return self.mode in ("perm", "always")


@dataclass(frozen=True, slots=True)
class Action:
    """Something the runner does once progress reaches ``at``: ``kill`` (SIGKILL the
    worker), ``term`` (SIGTERM it, and wait for its graceful exit), ``start`` (a new
    worker), ``pause`` or ``resume`` (``dopool pause|resume`` from the command line),
    ``freeze`` (stop a process while it holds the writer lock: producer ``producer``,
    or the chain's worker if None, for ``seconds``).
    A ``mid`` kill waits, past ``at``, for the start of a slow attempt, which it
    interrupts: a kill at a mere count mostly finds the worker between attempts."""

    at: int
    verb: str
    mid: bool = False
    chain: int = 0  # which worker: the first (0), the second (1)... and their restarts
    producer: int | None = None  # a freeze's target, if a producer
    seconds: float = 0.0  # how long a freeze keeps its target stopped

    def describe(self) -> str:
        mid = "-mid" if self.mid else ""
        chain = f"/{self.chain + 1}" if self.chain else ""
        if self.verb != "freeze":
            return f"{self.verb}{mid}{chain}@{self.at}"
        target = f"producer{self.producer}" if self.producer is not None else f"worker{chain}"
        return f"freeze-{target}-{self.seconds:g}s@{self.at}"


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    concurrency: int
    durability: str
    dedup_window: float
    streams: tuple[tuple[Send, ...], ...]  # one per producer process
    behaviours: dict[str, Behaviour]  # by event id; absent: succeeds at once
    actions: tuple[Action, ...]
    workers: int = 1  # worker processes started at once, sharing the store by leases
    lease_ttl: float = LEASE_TTL  # the workers' --lease-ttl
    big: bool = False  # of the big family (draw_big)
    lock_timeout: float | None = None  # the producers' connect(lock_timeout=); None: 10 s
    per_key: bool = False  # the pool is "per-key" (concurrency PER_KEY)
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT  # the pool's
    max_active: int | None = None  # the workers' --max-active; None: the default
    # The producers' connect(via_owner=): their calls sent to the workers, stored by
    # themselves, or as their durability decides (None).
    via_owner: bool | None = None

    @property
    def size(self) -> int | Literal["per-key"]:
        """The pool's ``concurrency`` as ``define`` takes it."""
        return "per-key" if self.per_key else self.concurrency

    @property
    def producers(self) -> int:
        return len(self.streams)

    @property
    def async_handler(self) -> bool:
        """Whether the pool's handler is an ``async def`` (about half the seeds)."""
        return async_handler(self.seed)

    @property
    def rate_limit(self) -> RateLimit | None:
        """The pool's rate limit, the same in every worker (about three seeds in ten)."""
        return rate_limit(self.seed)

    @property
    def chains(self) -> int:
        """Worker chains: those started at once, and any a ``start`` begins later."""
        return max([self.workers, *(a.chain + 1 for a in self.actions)])

    @property
    def events(self) -> int:
        return sum(len(send.ids) for stream in self.streams for send in stream)

    def describe(self) -> str:
        verbs = " ".join(a.describe() for a in self.actions)
        keyed = sum(1 for s in self.streams for send in s for k in send.dedup_keys if k)
        family = " (big family)" if self.big else ""
        size = f"of {self.concurrency}"
        if self.per_key:
            size = (
                f"per key, idle timeout {self.idle_timeout:g} s, workers' max active "
                f"{self.max_active}"
            )
        timeout = "" if self.lock_timeout is None else f", lock timeout {self.lock_timeout:g} s"
        owner = "" if self.via_owner is None else f", via owner {self.via_owner}"
        handler = "async def handler" if self.async_handler else "plain handler"
        limit = self.rate_limit
        if limit is not None:
            handler += f", rate limit {limit.rate:g} per {limit.per:g} s, burst {limit.burst}"
        return (
            f"seed {self.seed}{family}: pool {POOL!r} {size} ({handler}), "
            f"{self.producers} producers, "
            f"{self.events} events ({keyed} keyed, window {self.dedup_window:g} s), "
            f"durability {self.durability}{timeout}{owner}; {self.workers} worker(s), lease ttl "
            f"{self.lease_ttl:g} s: {verbs}"
        )


def async_handler(seed: int) -> bool:
    """Whether ``seed``'s pool has an ``async def`` handler, drawn from a generator of its
    own (so the plan's other draws are what they were before there could be one)."""
    return random.Random(f"dopool-procs-handler:{seed}").random() < ASYNC_SHARE


def rate_limit(seed: int) -> RateLimit | None:
    """``seed``'s pool's rate limit, drawn from a generator of its own too."""
    rng = random.Random(f"dopool-procs-rate:{seed}")
    if rng.random() >= RATE_SHARE:
        return None
    return BIG_RATE if seed % BIG_EVERY == BIG_AT else rng.choice(RATES)


def draw(seed: int) -> Plan:
    """The scenario of ``seed``: of the big family or not, and its frozen writers."""
    plan = draw_big(seed) if seed % BIG_EVERY == BIG_AT else _draw(seed)
    keyed = random.Random(f"dopool-procs-per-key:{seed}")
    if plan.big and keyed.random() < PER_KEY_SHARE:
        plan = _per_key(plan, keyed)
    rng = random.Random(f"dopool-procs-freeze:{seed}")
    freezes = _freezes(rng, plan)
    longest = max((a.seconds for a in freezes), default=0.0)
    # In half the seeds with a freeze of a second or more, the producers wait for the
    # writer lock for half of it to nine tenths, and give up (StoreBusyError) if it
    # holds them longer: their refusals are exercised, and must have stored nothing.
    timeout = None
    if longest >= 1.0 and rng.random() < 0.5:
        timeout = round(rng.uniform(0.5, 0.9) * longest, 2)
    # A stable sort: a freeze drawn at an action's point comes after it.
    actions = tuple(sorted((*plan.actions, *freezes), key=lambda a: a.at))
    # Whether the producers send their calls to the workers (a generator of its own, so
    # that no other draw moves): the workers' kills, freezes and restarts then land on
    # calls in flight on both sides, the owner's and the fallback's.
    owner = random.Random(f"dopool-procs-owner:{seed}").choice((None, True, False))
    return replace(plan, actions=actions, lock_timeout=timeout, via_owner=owner)


def _draw(seed: int) -> Plan:
    rng = random.Random(f"dopool-procs:{seed}")
    concurrency = rng.randint(1, 3)
    producers = rng.randint(2, 4)
    keyed = rng.random() < 0.4
    keys = [f"k{n}" for n in range(rng.randint(3, 8))]
    partitions = [f"p{n}" for n in range(rng.randint(2, 6))]
    behaviours: dict[str, Behaviour] = {}
    streams = []
    for p in range(producers):
        stream: list[Send] = []
        count = rng.randint(12, 35)
        k = 0
        while k < count:
            size = rng.randint(2, 5) if rng.random() < 0.25 else 1
            ids = tuple(f"{p}.{n}" for n in range(k, min(k + size, count)))
            k += len(ids)
            # Zipf-ish: the first partitions are hot; a fifth of the sends are round-robin.
            hot = min(int(rng.paretovariate(1.2)), len(partitions)) - 1
            pk = None if rng.random() < 0.2 else partitions[hot]
            priority = rng.choice((0, 0, 0, 1, 2))
            delay = round(rng.uniform(0.0, 0.15), 3) if rng.random() < 0.12 else None
            dedup = tuple(rng.choice(keys) if keyed and rng.random() < 0.35 else None for _ in ids)
            stream.append(Send(ids, pk, priority, delay, dedup))
            for ident in ids:
                behaviour = _behaviour(rng)
                if behaviour != Behaviour():
                    behaviours[ident] = behaviour
        streams.append(tuple(stream))
    events = sum(len(s.ids) for stream in streams for s in stream)
    durability = rng.choice(("sync", "async"))
    window = rng.choice(DEDUP_WINDOWS) if keyed else 0.0
    actions = _actions(rng, 2 * events)
    second = random.Random(f"dopool-procs-second:{seed}")
    workers = 2 if second.random() < 0.5 else 1
    if workers == 2:
        actions = tuple(sorted((*actions, *_second(second, 2 * events)), key=lambda a: a.at))
    return Plan(
        seed=seed,
        concurrency=concurrency,
        durability=durability,
        dedup_window=window,
        streams=tuple(streams),
        behaviours=behaviours,
        actions=actions,
        workers=workers,
    )


def draw_big(seed: int) -> Plan:
    """The big family's scenario of ``seed``: 2,048-4,096 instances, 2-3 workers from the
    start, another joining and one leaving (SIGTERM, or SIGKILL for good) mid-run.

    Producer 0 sweeps the pool once, round-robin in ``enqueue_many`` batches (one
    transaction each), so every instance gets an event; the others send their events one
    by one or in small batches, each with a partition key drawn from as many keys as
    instances (hashed over them), some of them hot, so that the instances those reach get
    several events, in an order the checker follows across producers and workers.
    """
    rng = random.Random(f"dopool-procs-big:{seed}")
    concurrency = rng.randint(*BIG_CONCURRENCY)
    workers = rng.randint(2, 3)
    producers = rng.randint(2, 3)
    behaviours: dict[str, Behaviour] = {}
    streams: list[tuple[Send, ...]] = []
    for p in range(producers):
        stream: list[Send] = []
        count = concurrency if p == 0 else rng.randint(BIG_KEYED // 2, BIG_KEYED)
        k = 0
        while k < count:
            size = (
                rng.randint(64, 256) if p == 0 else (rng.randint(2, 6) if rng.random() < 0.3 else 1)
            )
            ids = tuple(f"{p}.{n}" for n in range(k, min(k + size, count)))
            k += len(ids)
            if p == 0:
                pk = None
            elif rng.random() < 0.2:  # a hot key: several events on one instance
                pk = f"h{rng.randrange(8)}"
            else:
                pk = f"k{rng.randrange(concurrency)}"
            priority = rng.choice((0, 0, 0, 1, 2))
            delay = round(rng.uniform(0.0, 0.15), 3) if rng.random() < 0.05 else None
            stream.append(Send(ids, pk, priority, delay, (None,) * len(ids)))
            for ident in ids:
                behaviour = _behaviour(rng, lean=True)
                if behaviour != Behaviour():
                    behaviours[ident] = behaviour
        streams.append(tuple(stream))
    progress = 2 * sum(len(s.ids) for stream in streams for s in stream)
    joins = Action(rng.randint(progress // 10, progress // 2), "start", chain=workers)
    leaving = rng.choice(("term", "kill"))
    leaves = Action(
        rng.randint(progress // 5, progress * 7 // 10), leaving, chain=rng.randrange(workers)
    )
    return Plan(
        seed=seed,
        concurrency=concurrency,
        durability="async",  # sync: each instance's recovery, as it is taken, is an fsync
        dedup_window=0.0,
        streams=tuple(streams),
        behaviours=behaviours,
        actions=tuple(sorted((joins, leaves), key=lambda a: a.at)),
        workers=workers,
        lease_ttl=BIG_LEASE_TTL,
        big=True,
        max_active=BIG_MAX_ACTIVE,
    )


def _per_key(plan: Plan, rng: random.Random) -> Plan:
    """``plan``'s streams on a per-key pool: each event the first producer sent without a
    key is sent alone, with a key of its own (an instance each); the other producers'
    keys stay. Instances idle for ``PER_KEY_IDLE`` seconds are evicted, and each worker
    runs few at once (``PER_KEY_ACTIVE``), so the slots' line moves all run long."""
    streams = []
    for stream in plan.streams:
        sends: list[Send] = []
        for send in stream:
            if send.partition_key is not None:
                sends.append(send)
                continue
            for ident in send.ids:  # (the big family's events carry no dedup key)
                sends.append(Send((ident,), f"s{ident}", send.priority, send.delay, (None,)))
        streams.append(tuple(sends))
    return replace(
        plan,
        concurrency=PER_KEY,
        streams=tuple(streams),
        per_key=True,
        idle_timeout=rng.choice(PER_KEY_IDLE),
        max_active=rng.choice(PER_KEY_ACTIVE),
    )


def _freezes(rng: random.Random, plan: Plan) -> list[Action]:
    """In half the seeds, one frozen writer (in a fifth of those, two): a producer
    (early, while the producers send) or a worker, stopped for 0.3-1 lease ttl in a
    third of the freezes, 1-3 in the others (its leases, and the other workers', look
    expired once it is continued, unless the engine does not count that time)."""
    if rng.random() >= 0.5:
        return []
    progress = 2 * plan.events
    freezes = []
    for _ in range(1 if rng.random() < 0.8 else 2):
        ttls = rng.uniform(0.3, 1.0) if rng.random() < 1 / 3 else rng.uniform(1.0, FREEZE_TTLS)
        seconds = round(ttls * plan.lease_ttl, 2)
        if rng.random() < 0.5:
            at = rng.randint(progress // 20, progress // 4)
            freezes.append(
                Action(at, "freeze", producer=rng.randrange(plan.producers), seconds=seconds)
            )
        else:
            at = rng.randint(progress // 10, progress * 7 // 10)
            freezes.append(Action(at, "freeze", chain=rng.randrange(plan.workers), seconds=seconds))
    return freezes


def _second(rng: random.Random, progress: int) -> list[Action]:
    """The second worker's fate: 1-2 SIGKILLs (the first worker takes its instances over
    once their leases expire), each restarted after some more progress or never."""
    actions = []
    for _ in range(rng.randint(1, 2)):
        at = rng.randint(progress // 10, progress * 8 // 10)
        actions.append(Action(at, "kill", mid=rng.random() < 0.5, chain=1))
        if rng.random() < 0.7:
            actions.append(Action(at + rng.randint(1, max(2, progress // 8)), "start", chain=1))
    return actions


def _behaviour(rng: random.Random, *, lean: bool = False) -> Behaviour:
    """Most events succeed at once; a fifth fail first, or for good (a tenth of that,
    ``lean``: the big family's thousands of events, each attempt a handful of writes)."""
    roll = rng.random() * (10 if lean else 1)
    slow = round(rng.uniform(0.02, 0.06), 3) if rng.random() < 0.15 else 0.0
    if roll < 0.1:
        return Behaviour(fails=1, slow=slow)
    if roll < 0.15:
        return Behaviour(fails=2, slow=slow)
    if roll < 0.18:
        return Behaviour(mode="perm", slow=slow)
    if roll < 0.2:
        return Behaviour(mode="always", slow=slow)
    return Behaviour(slow=slow)


def _actions(rng: random.Random, progress: int) -> tuple[Action, ...]:
    """1-3 kills, maybe a graceful stop, maybe a pause and its resume, each restart at once
    or after some more progress (producers then enqueue with no worker up)."""
    stops = ["kill"] * rng.randint(1, MAX_KILLS)
    if rng.random() < 0.5:
        stops.insert(rng.randrange(len(stops) + 1), "term")
    points = sorted(rng.randint(progress // 20, progress * 9 // 10) for _ in stops)
    actions: list[Action] = []
    for verb, at in zip(stops, points, strict=True):
        actions.append(Action(at, verb, mid=verb == "kill" and rng.random() < 0.6))
        later = 0 if rng.random() < 0.7 else rng.randint(1, max(1, progress // 10))
        actions.append(Action(at + later, "start"))
    if rng.random() < 0.4:
        at = rng.randint(progress // 10, progress * 3 // 4)
        actions.append(Action(at, "pause"))
        actions.append(Action(at + rng.randint(2, max(3, progress // 8)), "resume"))
    # A stable sort: a stop's restart stays after it, a pause before its resume. A stop
    # that finds no worker up, or a start that finds one, is skipped: as the order is the
    # plan's, so is which are.
    return tuple(sorted(actions, key=lambda a: a.at))
