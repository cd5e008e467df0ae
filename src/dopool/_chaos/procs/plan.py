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
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dopool._retry import RetryPolicy

POOL = "mp"
#: High enough that no planned failure and no kill dead-letters an event by accident:
#: an event takes its planned failures (at most 2), one attempt per kill that
#: interrupts it (at most ``MAX_KILLS``), and one more.
MAX_ATTEMPTS = 8
MAX_KILLS = 3
RETRY = RetryPolicy(max_attempts=MAX_ATTEMPTS, initial_delay=0.01, multiplier=2.0, max_delay=0.04)
DEDUP_WINDOWS = (0.0, 3600.0)  # a key freed once its event ends; held for the whole run
LEASE_TTL = 0.6  # the workers' --lease-ttl: a killed worker's instances move this soon


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
    worker), ``pause`` or ``resume`` (``dopool pause|resume`` from the command line).
    A ``mid`` kill waits, past ``at``, for the start of a slow attempt, which it
    interrupts: a kill at a mere count mostly finds the worker between attempts."""

    at: int
    verb: str
    mid: bool = False
    chain: int = 0  # which worker: the first (0) or the second (1) and their restarts


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    concurrency: int
    durability: str
    dedup_window: float
    streams: tuple[tuple[Send, ...], ...]  # one per producer process
    behaviours: dict[str, Behaviour]  # by event id; absent: succeeds at once
    actions: tuple[Action, ...]
    workers: int = 1  # worker processes serving the store at once (leases between them)

    @property
    def producers(self) -> int:
        return len(self.streams)

    @property
    def events(self) -> int:
        return sum(len(send.ids) for stream in self.streams for send in stream)

    def describe(self) -> str:
        verbs = " ".join(
            f"{a.verb}{'-mid' if a.mid else ''}{'/2' if a.chain else ''}@{a.at}"
            for a in self.actions
        )
        keyed = sum(1 for s in self.streams for send in s for k in send.dedup_keys if k)
        return (
            f"seed {self.seed}: pool {POOL!r} of {self.concurrency}, {self.producers} producers, "
            f"{self.events} events ({keyed} keyed, window {self.dedup_window:g} s), "
            f"durability {self.durability}; {self.workers} worker(s): {verbs}"
        )


def draw(seed: int) -> Plan:
    """The scenario of ``seed``."""
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


def _behaviour(rng: random.Random) -> Behaviour:
    roll = rng.random()
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
