"""A chaos scenario, generated from one integer seed.

``generate(seed)`` draws everything from ``random.Random(seed)``: the pool's
concurrency (1-4), its retry policy, a queue depth limit, a fault plan with
small probabilities (seeded from the scenario seed), and a list of steps. The
pool's ``alarm_retries`` (mostly None; else a limit, after which a failing alarm
is given up and its instance stalls until a write) comes from a generator of its
own, so that every other draw is what it was before the option existed. That
generator also raises ``alarm_error`` in half of the scenarios with a limit, since
at the usual probabilities ``n + 1`` failures in a row would hardly ever happen.
Each event says how its handler behaves (see :data:`EVENT_FIELDS`), so the
checker can tell a legitimate retry from a spurious re-execution.

About one seed in three also has a second pool (:data:`SECOND_POOL`, 1-3
instances, the same handler and options): its follow-ups and the first pool's
go into either pool, some steps address it, and some reopens leave it
undefined for a while. Those draws come from a second generator,
``random.Random(f"second-pool:{seed}")``, after the rest: a seed without the
second pool is the same scenario it was before there was one.

About three seeds in five delay a share of their enqueues (:data:`DELAYED_SHARE`):
an enqueue step's events, or an ``enqueue_many`` batch, get a ``when`` (see
:func:`when_args`): a delay of 0 to 8 virtual seconds, or a ``not_before`` up to 2 s
in the past or 8 s ahead. Those draws come from a generator of their own,
``random.Random(f"delays:{seed}")``, so a seed without delays is unchanged too.

About half the seeds give a share of their enqueued events a dedup key
(:data:`DEDUP_SHARE`), one of a few (:data:`DEDUP_KEYS`), so that keys repeat while
their events are pending, running, dead or finished, and pick the pools'
``dedup_window`` (:data:`DEDUP_WINDOWS`). The key rides in the event as ``dedup``.
Those draws come from ``random.Random(f"dedup:{seed}")``.

About half the seeds give a share of their events a ``ttl`` (:data:`TTLS`: riding in
the event as ``ttl``, or in an ``enqueue_many`` step's args for its batch) and insert
``cancel`` steps, each of one of the last events enqueued into the first pool (``back``
counts from the last), and, with faults, crash some cancels before they commit
(``crash_during_cancel``). Those draws come from ``random.Random(f"lifecycle:{seed}")``,
after all the rest.

About one seed in four (:data:`SCHEDULE_SHARE`) defines recurring schedules on the first
pool, and with faults half of them crash some fires before they commit
(``crash_during_fire``): see :mod:`dopool._chaos.recurring`. Those draws come from
``random.Random(f"schedules:{seed}")``, last.

About half the seeds (:data:`EVICTION_SHARE`) give the pools an ``idle_timeout`` of a
few virtual seconds (:data:`IDLE_TIMEOUTS`), so that instances are evicted between
steps, while delayed events, retries and schedules wait, and started again mid-run by
the next message or their alarm; the others keep the default (60 s, which a run rarely
reaches). That draw comes from ``random.Random(f"eviction:{seed}")``.

About a third of the seeds (:data:`SLOTS_SHARE`) bound the runtime to 1 to 3 instances
running at once (``max_active``), fewer than the pools have, so that instances wait in
line for a slot, their enqueues stored from the caller's thread, and give their slots up
mid-run while others wait. That draw comes from ``random.Random(f"slots:{seed}")``.

About three seeds in ten (:data:`SCALE_SHARE`) make the first pool large: 2**20 or 2**32
instances, or one per partition key (``concurrency="per-key"``; :data:`LARGE_POOLS`).
Their partition keys come from a wider set (:data:`SCALE_KEYS`, skewed like the usual
ones), so that a run touches a few dozen instances among billions, each started on
demand and, in the eviction seeds, evicted and started again; the steps that name an
instance name one a key reaches. In a per-key seed every enqueue, follow-up and schedule
carries a key (a per-key pool refuses one without). Those draws come from
``random.Random(f"scale:{seed}")``, after all the rest.

About half the seeds (:data:`ASYNC_SHARE`) run the pools with an ``async def`` handler
(``handler == "async"``) that does what the plain one does, through the same code, but
sleeps with ``await ctx.sleep_async``: the engine awaits it on a loop in virtual time, and
everything else (retries, kills, crash recovery, the trace) must be as with a plain one.
That draw comes from ``random.Random(f"handler:{seed}")``, so it disturbs no other.

About three seeds in ten (:data:`RATE_SHARE`) give the first pool a rate limit, and in
half of those with a second pool that one a limit of its own (:data:`RATES`, with a
burst from :data:`RATE_BURSTS`): a few starts per virtual second at most, where a run
starts two a second on average and a dozen or more at once after an enqueue or a
reopen, so that the limit binds and instances wait for tokens, through crashes,
evictions and reopens (each defines the pool again with the same limit; the bucket is
stored, so it holds across them). The first pool's limit is at least twice the rate at
which its schedules fire, if it has any (:data:`RATE_MARGIN`): a schedule is the one
source of events that never runs dry, and one faster than the limit would make a
backlog that grows for ever (a join never ends). The checker holds every window of each
limited pool's starts to the limit (:meth:`~dopool._chaos.checker.Model.finish`). Those
draws come from ``random.Random(f"rate:{seed}")``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from dopool._cluster.routing import stable_hash
from dopool._engine.options import DEFAULT_IDLE_TIMEOUT
from dopool._rates import RateLimit
from dopool._retry import RetryPolicy
from dopool._store.layout import PER_KEY
from dopool.chaos import FaultPlan

POOL = "chaos"
SECOND_POOL = "chaos2"
SECOND_POOL_SHARE = 1 / 3  # of the seeds
PARTITION_KEYS = tuple(f"k{n}" for n in range(8))
# Zipf-like skew: k0 is picked about twice as often as k1, eight times as often as k7.
PARTITION_WEIGHTS = tuple(1.0 / (rank + 1) for rank in range(len(PARTITION_KEYS)))
PRIORITIES = (0, 0, 0, 0, 0, 0, 0, 1, -1, 5)
FAULT_POINTS = (
    "crash_before_execute",
    "crash_after_execute",
    "crash_during_enqueue",
    "alarm_error",
    "storage_error",
)
MAX_FAULT_PROBABILITY = 0.05
ALARM_RETRIES = (0, 1, 2, 6)  # the limits a scenario may set (6: Cloudflare's)
LIMITED_ALARM_SHARE = 0.3  # the share of scenarios that set one
FAILING_ALARMS = (0.1, 0.5)  # the range of a raised alarm_error, with a limit
DELAYED_SHARE = 0.6  # of the seeds, those that delay some enqueues
DELAYED_ENQUEUES = (0.1, 0.6)  # the range of the share of enqueues such a seed delays
DEDUP_SHARE = 0.5  # of the seeds, those whose enqueues carry dedup keys
DEDUP_ENQUEUES = (0.2, 0.8)  # the range of the share of events such a seed keys
DEDUP_KEYS = tuple(f"d{n}" for n in range(6))
DEDUP_WINDOWS = (0.0, 0.0, 1.0, 5.0)  # virtual seconds
LIFECYCLE_SHARE = 0.5  # of the seeds, those that give ttls and cancel events
TTL_EVENTS = (0.1, 0.5)  # the range of the share of events such a seed gives a ttl
TTLS = (0.5, 1.0, 3.0, 8.0)  # virtual seconds
CANCEL_STEPS = 0.2  # the chance of a cancel step after each step, in such a seed
CANCEL_FAULTS = (0.05, 0.3)  # the range of crash_during_cancel, with faults
SCHEDULE_SHARE = 0.25  # of the seeds, those that define recurring schedules
EVICTION_SHARE = 0.5  # of the seeds, those whose instances are evicted after a short idle
IDLE_TIMEOUTS = (0.5, 1.0, 2.0, 4.0)  # virtual seconds
SLOTS_SHARE = 0.35  # of the seeds, those whose runtime bounds the instances running at once
MAX_ACTIVE = (1, 2, 3)  # the bounds they choose among
SCHEDULE_EVERY = (1.5, 2.5, 4.0)  # virtual seconds
SCALE_SHARE = 0.3  # of the seeds, those whose first pool is large or per-key
LARGE_POOLS = (2**20, 2**32, PER_KEY)  # the first pool's concurrency in such a seed
SCALE_KEYS = tuple(f"r{n}" for n in range(24))  # their partition keys
SCALE_WEIGHTS = tuple(1.0 / (rank + 1) for rank in range(len(SCALE_KEYS)))
ASYNC_SHARE = 0.5  # of the seeds, those whose pools' handler is an ``async def``
RATE_SHARE = 0.3  # of the seeds, those whose first pool (and maybe the second) is rate limited
SECOND_RATE_SHARE = 0.5  # of those with a second pool, those that limit it too
#: The limits they draw from, as (starts, per seconds): 0.5 to 10 starts a virtual second.
RATES = ((1.0, 1.0), (2.0, 1.0), (4.0, 1.0), (10.0, 1.0), (3.0, 2.0), (30.0, 60.0))
RATE_BURSTS = (1, 1, 2, 3, 5)  # the burst they draw with each
RATE_MARGIN = 2.0  # a limited first pool starts this many times its schedules' fires, at least

#: When an enqueue makes its events due: ``("delay", seconds)``, or ``("not_before", s)``
#: for the clock time ``s`` seconds after the call (before it, if negative).
When = tuple[str, float]


def when_args(when: When | None, now: float) -> tuple[dict[str, Any], float | None]:
    """``enqueue``'s arguments for ``when`` at clock time ``now``, and the due time they
    ask for (the engine's own arithmetic, so the checker can compare it exactly)."""
    if when is None:
        return {}, None
    kind, seconds = when
    if kind == "delay":
        return {"delay": seconds}, now + seconds
    return {"not_before": now + seconds}, now + seconds


#: What an event's fields tell its handler to do, attempt by attempt.
EVENT_FIELDS = {
    "id": "unique name; a follow-up is named '<parent>.<attempt>.<n>'",
    "fail": "attempts 1..fail end with `mode` (a large value: always)",
    "mode": "'error' (RuntimeError), 'retry' (RetryAfter(after)) or 'perm' (PermanentError)",
    "after": "the RetryAfter delay in seconds",
    "sleep": "virtual seconds the handler sleeps (ctx.sleep; async: ctx.sleep_async) each attempt",
    "kids": "follow-ups enqueued on every attempt (committed only with a success)",
    "pk": "the partition key it was enqueued with",
    "prio": "the priority it was enqueued with",
    "poison": "the handler kills its own instance on every attempt",
    "to": "of a follow-up: None for its parent's pool, 'other' for the other pool",
    "dedup": "the dedup key it was enqueued with (absent: none); follow-ups take none",
}


def make_event(ident: str, **fields: Any) -> dict[str, Any]:
    """An event content with well-behaved defaults (for hand-written scenarios)."""
    content: dict[str, Any] = {
        "id": ident,
        "fail": 0,
        "mode": "error",
        "after": 0.0,
        "sleep": 0.0,
        "kids": [],
        "pk": None,
        "prio": 0,
        "poison": False,
        "to": None,
    }
    unknown = set(fields) - set(content) - {"dedup"}
    if unknown:
        raise ValueError(f"unknown event fields {sorted(unknown)}; see EVENT_FIELDS")
    content.update(fields)
    return content


class Step(NamedTuple):
    """One call the runner makes: ``kind`` names it, ``args`` parameterise it."""

    kind: str
    args: dict[str, Any]

    def describe(self) -> str:
        """A short line for traces and failure reports."""
        if self.kind in ("enqueue", "enqueue_many"):
            ids = [event["id"] for event in self.args["events"]]
            span = ids[0] if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"
            extra = ""
            if self.kind == "enqueue_many":
                extra = f" pk={self.args['pk']} prio={self.args['prio']}"
            into = self.args.get("pool", POOL)
            extra += "" if into == POOL else f" into {into}"
            keyed = sum("dedup" in event for event in self.args["events"])
            extra += f" ({keyed} keyed)" if keyed else ""
            when = self.args.get("when")
            if isinstance(when, list):
                delayed = sum(item is not None for item in when)
                extra += f" ({delayed} delayed)" if delayed else ""
            elif when is not None:
                extra += f" {when[0]}={when[1]}"
            return f"{self.kind} {len(ids)} ({span}){extra}"
        detail = " ".join(f"{key}={value}" for key, value in self.args.items())
        return f"{self.kind} {detail}".strip()


@dataclass(frozen=True)
class Scenario:
    """Everything one run needs; a pure function of ``seed``."""

    seed: int
    concurrency: int  # the first pool's (PER_KEY: an instance per partition key)
    retry: RetryPolicy | None
    faults: FaultPlan | None
    max_queue_depth: int | None
    steps: tuple[Step, ...] = field(default=())
    alarm_retries: int | None = None
    second: int = 0  # instances of SECOND_POOL; 0: the scenario has one pool
    dedup_window: float = 0.0  # the pools'
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT  # the pools'
    max_active: int | None = None  # the runtime's (None: no bound, a simulated clock's)
    handler: Literal["sync", "async"] = "sync"  # the pools' handler: a def, or an async def
    rate_limits: tuple[tuple[str, RateLimit], ...] = ()  # (pool, its limit); others: none

    def rate_limit(self, pool: str) -> RateLimit | None:
        """``pool``'s rate limit, the same each time it is defined; None: it has none."""
        return dict(self.rate_limits).get(pool)

    @property
    def max_attempts(self) -> int:
        return 1 if self.retry is None else self.retry.max_attempts

    @property
    def pools(self) -> dict[str, int]:
        """Each pool's name and concurrency, the first pool first."""
        pools = {POOL: self.concurrency}
        if self.second:
            pools[SECOND_POOL] = self.second
        return pools

    def flat(self, pool: str, index: int) -> int:
        """The instance's number in the checker's history: the second pool's come after."""
        return index if pool == POOL else self.concurrency + index

    def span(self, pool: str) -> tuple[int, int]:
        """The flat numbers of ``pool``'s instances: ``first`` to ``end - 1``."""
        first = self.flat(pool, 0)
        return first, first + self.pools[pool]

    def where(self, number: int) -> tuple[str, int]:
        """The pool and index of the instance numbered ``number`` (flat)."""
        if number < self.concurrency:
            return POOL, number
        return SECOND_POOL, number - self.concurrency

    def defined(self, pool: str) -> int | Literal["per-key"]:
        """``pool``'s concurrency as ``define`` takes it."""
        size = self.pools[pool]
        return "per-key" if size == PER_KEY else size

    def describe(self) -> str:
        """A few lines naming the configuration and every step."""
        faults = "none"
        if self.faults is not None:
            faults = ", ".join(
                f"{point}={getattr(self.faults, point):.3f}"
                for point in (*FAULT_POINTS, "crash_during_cancel", "crash_during_fire")
                if getattr(self.faults, point)
            )
        second = ""
        if self.second:
            first = self.concurrency
            second = (
                f" second pool {SECOND_POOL}: concurrency={self.second} "
                f"(instances {first}..{first + self.second - 1} in the history)"
            )
        lines = [
            f"seed {self.seed}: concurrency={self.defined(POOL)} retry={self.retry!r} "
            f"max_queue_depth={self.max_queue_depth} alarm_retries={self.alarm_retries}"
            f" dedup_window={self.dedup_window} idle_timeout={self.idle_timeout}"
            f" max_active={self.max_active} handler={self.handler}{second}",
            f"  faults: {faults or 'none'}",
        ]
        if self.rate_limits:
            limits = ", ".join(f"{pool} {limit}" for pool, limit in self.rate_limits)
            lines.append(f"  rate limits: {limits}")
        lines += [f"  step {n}: {step.describe()}" for n, step in enumerate(self.steps)]
        return "\n".join(lines)


def generate(seed: int, *, steps: int | None = None) -> Scenario:
    """The scenario for ``seed``; ``steps`` overrides the drawn number of steps."""
    rng = random.Random(seed)
    concurrency = rng.randint(1, 4)
    retry = _retry_policy(rng)
    faults = _fault_plan(rng, seed)
    max_queue_depth = rng.randint(8, 30) if rng.random() < 0.15 else None
    count = rng.randint(8, 30) if steps is None else steps
    events = _EventSource(rng)
    plan = tuple(_step(rng, events, concurrency) for _ in range(count))
    alarm_retries, faults = _alarm_limit(seed, faults)
    second = 0
    other = random.Random(f"second-pool:{seed}")
    if other.random() < SECOND_POOL_SHARE:
        second = other.randint(1, 3)
        plan = tuple(_across(step, other, second) for step in plan)
    delays = random.Random(f"delays:{seed}")
    if delays.random() < DELAYED_SHARE:
        share = delays.uniform(*DELAYED_ENQUEUES)
        plan = tuple(_delayed(step, delays, share) for step in plan)
    window = 0.0
    dedup = random.Random(f"dedup:{seed}")
    if dedup.random() < DEDUP_SHARE:
        window = dedup.choice(DEDUP_WINDOWS)
        share = dedup.uniform(*DEDUP_ENQUEUES)
        plan = tuple(_keyed(step, dedup, share) for step in plan)
    lifecycle = random.Random(f"lifecycle:{seed}")
    if lifecycle.random() < LIFECYCLE_SHARE:
        plan = _lifecycle(plan, lifecycle, lifecycle.uniform(*TTL_EVENTS))
        if faults is not None:
            chance = round(lifecycle.uniform(*CANCEL_FAULTS), 4)
            faults = replace(faults, crash_during_cancel=chance)
    recurring = random.Random(f"schedules:{seed}")
    if recurring.random() < SCHEDULE_SHARE:
        plan = _with_schedules(plan, recurring)
        if faults is not None and recurring.random() < 0.5:
            faults = replace(faults, crash_during_fire=round(recurring.uniform(0.05, 0.3), 4))
    eviction = random.Random(f"eviction:{seed}")
    idle_timeout = DEFAULT_IDLE_TIMEOUT
    if eviction.random() < EVICTION_SHARE:
        idle_timeout = eviction.choice(IDLE_TIMEOUTS)
    slots = random.Random(f"slots:{seed}")
    max_active = slots.choice(MAX_ACTIVE) if slots.random() < SLOTS_SHARE else None
    scale = random.Random(f"scale:{seed}")
    if scale.random() < SCALE_SHARE:
        concurrency = scale.choice(LARGE_POOLS)
        schedules: dict[str, str | None] = {}
        plan = tuple(_scaled(step, scale, concurrency, schedules) for step in plan)
    styles = random.Random(f"handler:{seed}")
    handler: Literal["sync", "async"] = "async" if styles.random() < ASYNC_SHARE else "sync"
    limits = _rate_limits(random.Random(f"rate:{seed}"), second, plan)
    return Scenario(
        seed,
        concurrency,
        retry,
        faults,
        max_queue_depth,
        plan,
        alarm_retries,
        second,
        window,
        idle_timeout,
        max_active,
        handler,
        limits,
    )


def _rate_limits(
    rng: random.Random, second: int, plan: tuple[Step, ...]
) -> tuple[tuple[str, RateLimit], ...]:
    """The pools' rate limits (see the module docstring), drawn from ``rng``: the first
    pool's above :data:`RATE_MARGIN` times the rate its schedules in ``plan`` fire at."""
    if rng.random() >= RATE_SHARE:
        return ()
    every = {step.args["name"]: step.args["every"] for step in plan if step.kind == "schedule"}
    fires = sum(1 / seconds for seconds in every.values())  # per virtual second

    def limit(least: float) -> RateLimit:
        rate, per = rng.choice([(r, p) for r, p in RATES if r / p >= least])
        return RateLimit(rate=rate, per=per, burst=rng.choice(RATE_BURSTS))

    limits = [(POOL, limit(RATE_MARGIN * fires))]
    if second and rng.random() < SECOND_RATE_SHARE:
        limits.append((SECOND_POOL, limit(0.0)))
    return tuple(limits)


def _alarm_limit(seed: int, faults: FaultPlan | None) -> tuple[int | None, FaultPlan | None]:
    """The pool's ``alarm_retries``, and the fault plan, failing alarms more often with one."""
    rng = random.Random(f"alarm_retries {seed}")
    if rng.random() >= LIMITED_ALARM_SHARE:
        return None, faults
    limit = rng.choice(ALARM_RETRIES)
    if faults is not None and rng.random() < 0.5:
        faults = replace(faults, alarm_error=round(rng.uniform(*FAILING_ALARMS), 4))
    return limit, faults


def _retry_policy(rng: random.Random) -> RetryPolicy | None:
    if rng.random() < 0.1:
        return None
    initial = round(rng.uniform(0.05, 2.0), 2)
    return RetryPolicy(
        max_attempts=rng.randint(1, 5),
        initial_delay=initial,
        multiplier=rng.choice([1.0, 1.5, 2.0, 3.0]),
        max_delay=initial * rng.choice([1, 5, 20]),
        jitter=rng.choice([0.0, 0.1, 0.5]),
    )


def _fault_plan(rng: random.Random, seed: int) -> FaultPlan | None:
    if rng.random() < 0.2:
        return None
    probabilities = {
        point: 0.0 if rng.random() < 0.5 else round(rng.uniform(0, MAX_FAULT_PROBABILITY), 4)
        for point in FAULT_POINTS
    }
    return FaultPlan(seed=seed, **probabilities)


class _EventSource:
    """Makes event contents with fresh ids: mostly well-behaved, some flaky or poisonous."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._next = 0

    def partition_key(self) -> str | None:
        rng = self._rng
        if rng.random() < 0.3:
            return None
        return rng.choices(PARTITION_KEYS, PARTITION_WEIGHTS)[0]

    def event(self, pk: str | None, prio: int, depth: int = 0) -> dict[str, Any]:
        content = self._behaviour(depth)
        content["pk"] = pk
        content["prio"] = prio
        if depth == 0:
            content = {"id": f"e{self._next}", **content}
            self._next += 1
        return content

    def _behaviour(self, depth: int) -> dict[str, Any]:
        rng = self._rng
        roll = rng.random()
        if roll < 0.70:
            fail = 0
        elif roll < 0.90:
            fail = rng.randint(1, 3)
        else:
            fail = 99  # never succeeds: dead-lettered after max_attempts
        kids: list[dict[str, Any]] = []
        if depth < 2 and rng.random() < (0.15 if depth == 0 else 0.05):
            for _ in range(rng.randint(1, 3)):
                kid = self._behaviour(depth + 1)
                kid["pk"] = self.partition_key()
                kid["prio"] = rng.choice(PRIORITIES)
                kids.append(kid)
        return {
            "fail": fail,
            "mode": rng.choices(["error", "retry", "perm"], [0.75, 0.15, 0.1])[0],
            "after": round(rng.uniform(0.0, 2.0), 2),
            "sleep": 0.0 if rng.random() < 0.8 else round(rng.uniform(0.1, 3.0), 1),
            "kids": kids,
            "poison": rng.random() < 0.01,
        }


def _index(rng: random.Random, concurrency: int) -> int | None:
    return None if rng.random() < 0.5 else rng.randrange(concurrency)


def _step(rng: random.Random, events: _EventSource, concurrency: int) -> Step:
    kinds = {
        "enqueue": 30,
        "enqueue_many": 8,
        "advance": 25,
        "pause": 4,
        "resume": 4,
        "drain": 2,
        "kill": 8,
        "reopen": 4,
        "redrive": 3,
        "purge": 1,
        "join": 6,
    }
    kind = rng.choices(list(kinds), list(kinds.values()))[0]
    if kind == "enqueue":
        burst = [
            events.event(events.partition_key(), rng.choice(PRIORITIES))
            for _ in range(rng.randint(1, 20))
        ]
        return Step(kind, {"events": burst})
    if kind == "enqueue_many":
        pk, prio = events.partition_key(), rng.choice(PRIORITIES)
        batch = [events.event(pk, prio) for _ in range(rng.randint(1, 12))]
        return Step(kind, {"events": batch, "pk": pk, "prio": prio})
    if kind == "advance":
        return Step(kind, {"seconds": round(rng.uniform(0.0, 5.0), 2)})
    if kind in ("pause", "resume", "drain"):
        return Step(kind, {"index": _index(rng, concurrency)})
    if kind == "kill":
        return Step(kind, {"index": rng.randrange(concurrency)})
    if kind == "redrive":
        return Step(kind, {"which": rng.choice(["all", "odd"])})
    return Step(kind, {})


def _across(step: Step, rng: random.Random, second: int) -> Step:
    """``step`` for a scenario with a second pool: it may address it, and the follow-ups
    of its events may go to the other pool (drawn from ``rng``, not the scenario's)."""
    kind, args = step.kind, dict(step.args)
    if kind in ("enqueue", "enqueue_many"):
        for event in args["events"]:
            _send_across(event, rng)
    into = SECOND_POOL if rng.random() < 0.3 else POOL
    if kind in ("enqueue", "enqueue_many", "redrive", "purge", "join"):
        args["pool"] = into
    elif kind in ("pause", "resume", "drain", "kill") and into == SECOND_POOL:
        args["pool"] = into
        if args["index"] is not None:
            args["index"] = rng.randrange(second)
    elif kind == "reopen" and rng.random() < 0.4:
        args["without"] = SECOND_POOL  # defined again before a later step needs it
    return Step(kind, args)


def _delayed(step: Step, rng: random.Random, share: float) -> Step:
    """``step`` with a ``when`` for a ``share`` of its enqueues (drawn from ``rng``)."""
    if step.kind == "enqueue":
        whens = [_when(rng) if rng.random() < share else None for _ in step.args["events"]]
        if any(whens):
            return Step(step.kind, {**step.args, "when": whens})
    elif step.kind == "enqueue_many" and rng.random() < share:
        return Step(step.kind, {**step.args, "when": _when(rng)})
    return step


def _keyed(step: Step, rng: random.Random, share: float) -> Step:
    """``step`` with a dedup key on a ``share`` of its events (drawn from ``rng``)."""
    if step.kind not in ("enqueue", "enqueue_many"):
        return step
    events = [
        {**event, "dedup": rng.choice(DEDUP_KEYS)} if rng.random() < share else event
        for event in step.args["events"]
    ]
    return Step(step.kind, {**step.args, "events": events})


def _lifecycle(plan: tuple[Step, ...], rng: random.Random, share: float) -> tuple[Step, ...]:
    """``plan`` with a ``ttl`` on a ``share`` of its events, and cancel steps inserted."""
    steps = []
    for drawn in plan:
        step = drawn
        if step.kind == "enqueue":
            events = [
                {**event, "ttl": rng.choice(TTLS)} if rng.random() < share else event
                for event in step.args["events"]
            ]
            step = Step(step.kind, {**step.args, "events": events})
        elif step.kind == "enqueue_many" and rng.random() < share:
            step = Step(step.kind, {**step.args, "ttl": rng.choice(TTLS)})
        steps.append(step)
        if rng.random() < CANCEL_STEPS:
            steps.append(Step("cancel", {"back": rng.randrange(8)}))
    return tuple(steps)


def _when(rng: random.Random) -> When:
    roll = rng.random()
    if roll < 0.1:
        return ("delay", 0.0)  # due at once
    if roll < 0.3:
        return ("not_before", round(rng.uniform(-2.0, 8.0), 2))  # may be past: due at once
    return ("delay", round(rng.uniform(0.0, 8.0), 2))


def _send_across(event: dict[str, Any], rng: random.Random) -> None:
    """Send each follow-up of ``event`` (at any depth) to the other pool, or not, at random."""
    for kid in event["kids"]:
        kid["to"] = "other" if rng.random() < 0.5 else None
        _send_across(kid, rng)


def _with_schedules(plan: tuple[Step, ...], rng: random.Random) -> tuple[Step, ...]:
    """``plan`` with ``schedule`` steps inserted (drawn from ``rng``)."""
    steps = list(plan)
    for number in range(rng.randint(1, 2)):
        args = {
            "name": f"s{number}",
            "every": rng.choice(SCHEDULE_EVERY),
            "pk": None if rng.random() < 0.5 else rng.choice(PARTITION_KEYS),
            "prio": rng.choice(PRIORITIES),
        }
        for _ in range(1 if rng.random() < 0.7 else 2):  # a second time: nothing changes
            steps.insert(rng.randint(0, len(steps)), Step("schedule", args))
    return tuple(steps)


def _scaled(
    step: Step, rng: random.Random, concurrency: int, schedules: dict[str, str | None]
) -> Step:
    """``step`` for a first pool of ``concurrency`` instances (see the module docstring):
    keys from :data:`SCALE_KEYS` (every one set, for a per-key pool), and an instance a
    key reaches where the step names one of the first pool's. A schedule keeps the key
    it was first given (``schedules``, by name): defined again, it is the same one."""

    def key(pk: str | None) -> str | None:
        if pk is None and concurrency != PER_KEY:
            return None  # round-robin, over instances 0, 1, 2...
        return rng.choices(SCALE_KEYS, SCALE_WEIGHTS)[0]

    def event(content: dict[str, Any], pk: str | None) -> dict[str, Any]:
        kids = [event(kid, key(kid["pk"])) for kid in content["kids"]]
        return {**content, "pk": pk, "kids": kids}

    args = dict(step.args)
    if step.kind == "enqueue":
        args["events"] = [event(content, key(content["pk"])) for content in args["events"]]
    elif step.kind == "enqueue_many":
        args["pk"] = key(args["pk"])
        args["events"] = [event(content, args["pk"]) for content in args["events"]]
    elif step.kind == "schedule":
        name = args["name"]
        if name not in schedules:
            schedules[name] = key(args["pk"])
        args["pk"] = schedules[name]
    elif args.get("index") is not None and args.get("pool", POOL) == POOL:
        reached = rng.choices(SCALE_KEYS, SCALE_WEIGHTS)[0]
        args["index"] = stable_hash(reached) % concurrency
    return Step(step.kind, args)
