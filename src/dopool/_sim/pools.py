"""The pools of a scenario: each one's settings, and the follow-ups that chain them.

A scenario's top-level pool fields (``instances``, ``[service]``, ...) describe
one pool named ``sim``. With ``[[pools]]`` tables it has several: each table
names a pool and overrides what it changes of those top-level settings (a
section merges field by field), and may list ``[[pools.follow_ups]]``, the
events its handler enqueues (``ctx.enqueue``) when an event succeeds.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from dopool._engine.options import DEFAULT_IDLE_TIMEOUT
from dopool._errors import MAX_DELAY, ConfigurationError, ScenarioError
from dopool._machine.validation import check_pool_name
from dopool._rates import RateLimit
from dopool._sim.checks import assign, choice, number, probability
from dopool._sim.sections import (
    MAX_INSTANCES,
    MAX_PAYLOAD_BYTES,
    MAX_TIME,
    PER_KEY_INSTANCES,
    ROUTINGS,
    Partitions,
    Retry,
    Service,
)
from dopool._store.layout.limits import PER_KEY

DEFAULT_POOL = "sim"  # the pool of a scenario without [[pools]]
FANOUTS = ("fixed", "poisson", "geometric")
MAX_FANOUT = 1000.0
MAX_POOLS = 64
# Figures of the whole run are named "<word>.<figure>" like a pool's (docs/simulate.md,
# "Figures"): a pool may not take one of those words as its name.
RESERVED = ("e2e", "wait", "utilisation", "stall")
# The expected events per arrival, follow-ups included, over which a design is refused:
# follow-ups that (on average) cause as many again grow without end.
MAX_AMPLIFICATION = 10_000.0

#: The pool setting that caps how many attempts it starts (the engine's ``rate_limit``).
RATE_LIMIT = "rate_limit"

#: A pool's settings that a [[pools]] table may override, and its sections.
POOL_FIELDS = (
    "instances",
    "routing",
    "max_queue_depth",
    "payload_bytes",
    "failure_probability",
    "poison_share",
    "alarm_retries",
    "duplicate_share",
    "dedup_window",
    "idle_timeout",
    "rate_limit",
    "delayed_share",
    "delay",
)
POOL_SECTIONS: dict[str, type[Any]] = {
    "partitions": Partitions,
    "service": Service,
    "retry": Retry,
}


@dataclass(frozen=True, kw_only=True)
class FollowUp:
    """When an event of the pool succeeds: with ``probability``, ``count`` follow-ups
    into pool ``to`` (``fanout = "fixed"``), or a count drawn with mean ``count``
    (``"poisson"``, or ``"geometric"``: 0, 1, 2, ... with a long tail).
    """

    to: str
    probability: float = 1.0
    count: float = 1.0
    fanout: str = "fixed"

    def __post_init__(self) -> None:
        if not isinstance(self.to, str):
            raise ScenarioError("to", f"must be a pool's name, got {self.to!r}")
        assign(self, "probability", probability("probability", self.probability))
        assign(self, "fanout", choice("fanout", self.fanout, FANOUTS))
        assign(self, "count", number("count", self.count, minimum=0.0, maximum=MAX_FANOUT))
        if self.fanout == "fixed" and not float(self.count).is_integer():
            raise ScenarioError(
                "count", f"must be a whole number with fanout 'fixed', got {self.count!r}"
            )

    @property
    def mean(self) -> float:
        """Follow-ups per success, on average."""
        return self.probability * self.count


@dataclass(frozen=True, kw_only=True)
class Pool:
    """One pool of a scenario, every setting resolved."""

    name: str
    instances: int | Literal["per-key"] = 4
    routing: str = "round-robin"
    max_queue_depth: int | None = None
    payload_bytes: int = 0
    failure_probability: float = 0.0
    poison_share: float = 0.0
    alarm_retries: int | None = None
    duplicate_share: float = 0.0
    dedup_window: float = 0.0
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    rate_limit: float | str | None = None
    delayed_share: float = 0.0
    delay: float = 0.0
    partitions: Partitions = field(default_factory=Partitions)
    service: Service = field(default_factory=Service)
    retry: Retry = field(default_factory=Retry)
    follow_ups: tuple[FollowUp, ...] = ()

    def __post_init__(self) -> None:
        assign(self, "routing", choice("routing", self.routing, ROUTINGS))
        if self.instances == PER_KEY_INSTANCES:
            if self.routing != "partition":
                raise ScenarioError(
                    "routing",
                    f'must be "partition" with instances = "{PER_KEY_INSTANCES}" (each '
                    f'event goes to its key\'s instance), got "{self.routing}"',
                )
        elif isinstance(self.instances, str):
            raise ScenarioError(
                "instances",
                f'must be an integer or "{PER_KEY_INSTANCES}", got {self.instances!r}',
            )
        else:
            number("instances", self.instances, integer=True, minimum=1, maximum=MAX_INSTANCES)
        if self.max_queue_depth is not None:
            number("max_queue_depth", self.max_queue_depth, integer=True, minimum=1)
        number("payload_bytes", self.payload_bytes, integer=True, minimum=0)
        if self.payload_bytes > MAX_PAYLOAD_BYTES:
            raise ScenarioError(
                "payload_bytes", f"must be <= {MAX_PAYLOAD_BYTES:,}, got {self.payload_bytes:,}"
            )
        failure = probability("failure_probability", self.failure_probability)
        assign(self, "failure_probability", failure)
        assign(self, "poison_share", probability("poison_share", self.poison_share))
        if self.alarm_retries is not None:
            number("alarm_retries", self.alarm_retries, integer=True, minimum=0, maximum=1000)
        assign(self, "duplicate_share", probability("duplicate_share", self.duplicate_share))
        assign(self, "dedup_window", number("dedup_window", self.dedup_window, minimum=0.0))
        idle = number("idle_timeout", self.idle_timeout, above=0.0, maximum=MAX_TIME)
        assign(self, "idle_timeout", idle)
        assign(self, RATE_LIMIT, check_rate_limit(self.rate_limit))
        assign(self, "delayed_share", probability("delayed_share", self.delayed_share))
        delay = number("delay", self.delay, minimum=0.0, maximum=MAX_DELAY)
        if self.delayed_share > 0 and delay <= 0:
            raise ScenarioError("delay", "must be > 0 when delayed_share is set")
        assign(self, "delay", delay)

    @property
    def limit(self) -> RateLimit | None:
        """The pool's ``rate_limit`` as the engine takes it (None: no limit)."""
        if self.rate_limit is None:
            return None
        if isinstance(self.rate_limit, str):
            return RateLimit.of(self.rate_limit, RATE_LIMIT)
        return RateLimit(rate=self.rate_limit)

    @property
    def concurrency(self) -> int:
        """The pool's number of instances, as the engine counts them (``PER_KEY`` for
        ``"per-key"``)."""
        return PER_KEY if self.instances == PER_KEY_INSTANCES else int(self.instances)


def check_rate_limit(value: object) -> float | str | None:
    """A pool's ``rate_limit`` checked: None (or ``"none"``) for no limit, a number for
    starts per second, or text such as ``"8/s"`` or ``"30/m"`` (:meth:`RateLimit.of`).

    Raises:
        ScenarioError: naming ``rate_limit``.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, str):
        try:
            RateLimit.of(value, RATE_LIMIT)
        except ConfigurationError as exc:
            problem = str(exc).removeprefix(f"{RATE_LIMIT} {value!r}: ")
            if problem.startswith(f"{RATE_LIMIT} must "):
                raise ScenarioError(RATE_LIMIT, problem.removeprefix(f"{RATE_LIMIT} ")) from None
            raise ScenarioError(RATE_LIMIT, f"cannot be {value!r}: {problem}") from None
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(
            RATE_LIMIT,
            "must be starts per second (a number > 0), text such as '8/s' or '30/m', "
            f"or 'none', got {value!r}",
        )
    rate: float = number(RATE_LIMIT, value, above=0.0)
    try:
        RateLimit(rate=rate)
    except ConfigurationError as exc:
        raise ScenarioError(RATE_LIMIT, f"cannot be {value!r}: {exc}") from None
    return rate


@dataclass(frozen=True)
class PoolTable:
    """One ``[[pools]]`` table as written: the pool's name and what it overrides."""

    name: str
    settings: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **_plain(self.settings)}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def resolve(defaults: Pool, tables: Sequence[PoolTable]) -> tuple[Pool, ...]:
    """The scenario's pools: ``defaults`` alone (named ``sim``), or one per table.

    Raises:
        ScenarioError: naming the table's field (``pools[1].service.mean``).
    """
    if not tables:
        return (defaults,)
    if len(tables) > MAX_POOLS:
        raise ScenarioError("pools", f"must list at most {MAX_POOLS} pools, got {len(tables)}")
    pools: list[Pool] = []
    for position, table in enumerate(tables):
        try:
            pools.append(_resolve_one(defaults, table))
        except ScenarioError as exc:
            raise exc.within(f"pools[{position}]") from None
    names = [pool.name for pool in pools]
    for position, name in enumerate(names):
        if name in names[:position]:
            raise ScenarioError(f"pools[{position}].name", f"repeats the pool name {name!r}")
    for position, pool in enumerate(pools):
        for rule, follow in enumerate(pool.follow_ups):
            if follow.to not in names:
                raise ScenarioError(
                    f"pools[{position}].follow_ups[{rule}].to", _unknown_pool(follow.to, names)
                )
    return tuple(pools)


def _resolve_one(defaults: Pool, table: PoolTable) -> Pool:
    try:
        name = check_pool_name(table.name)
    except ConfigurationError as exc:
        raise ScenarioError("name", str(exc)) from None
    if name in RESERVED:
        raise ScenarioError("name", f"{name!r} names figures of the whole run; choose another")
    settings = dict(table.settings)
    known = {*POOL_FIELDS, *POOL_SECTIONS, "follow_ups"}
    for key in settings:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ScenarioError(str(key), f"is not a pool setting{hint}")
    arguments: dict[str, Any] = {f: getattr(defaults, f) for f in POOL_FIELDS}
    arguments.update({f: settings[f] for f in POOL_FIELDS if f in settings})
    for section, kind in POOL_SECTIONS.items():
        base = {f.name: getattr(getattr(defaults, section), f.name) for f in fields(kind)}
        override = settings.get(section, {})
        if not isinstance(override, Mapping):
            raise ScenarioError(section, f"must be a table, got {override!r}")
        for key in override:
            if key not in base:
                raise ScenarioError(f"{section}.{key}", "is not a scenario field")
        arguments[section] = kind(**{**base, **override})
    follow_ups = settings.get("follow_ups", [])
    if not isinstance(follow_ups, list | tuple):
        raise ScenarioError("follow_ups", "must be an array of tables ([[pools.follow_ups]])")
    arguments["follow_ups"] = tuple(_follow_up(rule, item) for rule, item in enumerate(follow_ups))
    return Pool(name=name, **arguments)


def _follow_up(rule: int, item: object) -> FollowUp:
    path = f"follow_ups[{rule}]"
    if not isinstance(item, Mapping):
        raise ScenarioError(path, f"must be a table, got {item!r}")
    known = {f.name for f in fields(FollowUp)}
    for key in item:
        if key not in known:
            raise ScenarioError(f"{path}.{key}", "is not a follow-up field")
    if "to" not in item:
        raise ScenarioError(f"{path}.to", "is required")
    try:
        return FollowUp(**item)
    except ScenarioError as exc:
        raise exc.within(path) from None


def _unknown_pool(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"names no pool of the scenario: {name!r}{hint}"


def pool_of(name: str | None, pools: Sequence[Pool], path: str) -> Pool:
    """The pool ``name`` names (None: the first), or a ScenarioError at ``path``."""
    chosen = pool_named(name, [pool.name for pool in pools], path)
    return next(pool for pool in pools if pool.name == chosen)


def pool_named(name: str | None, names: Sequence[str], path: str) -> str:
    """``name`` if it is one of ``names`` (None: the first), or a ScenarioError at ``path``."""
    if name is None:
        return names[0]
    if name not in names:
        raise ScenarioError(path, _unknown_pool(name, names))
    return name


def amplification(pools: Sequence[Pool]) -> dict[str, float]:
    """Events expected in each pool per event entering it, its follow-ups' included.

    Raises:
        ScenarioError: follow-ups that cause, on average, too many events (a cycle
            whose mean fan-out is 1 or more never ends).
    """
    index = {pool.name: position for position, pool in enumerate(pools)}
    result: dict[str, float] = {}
    for start in pools:
        level = [0.0] * len(pools)
        level[index[start.name]] = 1.0
        total = 0.0
        for _ in range(10_000):
            size = math.fsum(level)
            total += size
            if size < 1e-12 or total > MAX_AMPLIFICATION:
                break
            following = [0.0] * len(pools)
            for position, share in enumerate(level):
                if share:
                    for rule in pools[position].follow_ups:
                        following[index[rule.to]] += share * rule.mean
            level = following
        if total > MAX_AMPLIFICATION or math.fsum(level) >= 1e-12:
            raise ScenarioError(
                "pools",
                f"follow-ups from pool {start.name!r} cause more than "
                f"{MAX_AMPLIFICATION:,.0f} events per event on average (a cycle of "
                "follow-ups whose mean fan-out is 1 or more never ends)",
            )
        result[start.name] = total
    return result
