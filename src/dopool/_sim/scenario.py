"""Scenarios: what a simulation runs, as frozen dataclasses validated field by field.

Every error is a :class:`ScenarioError` that names the bad field by its dotted
path (``arrivals.rate``, ``pools[1].service.mean``, ``pauses[1].at``), so a user
can find it in the file or the flag that set it. :mod:`dopool._sim.loading`
makes a scenario from a TOML file, a built-in name or flags.

The TOML layout mirrors the dataclasses: top-level fields, one table per
section (``[partitions]``, ``[service]``, ``[retry]``, ``[faults]``, ``[cost]``), the
arrivals as one ``[arrivals]`` table or several ``[[arrivals]]``, the pools as
``[[pools]]`` (see :mod:`dopool._sim.pools`), and arrays of tables for
``[[pauses]]``, ``[[kills]]`` and ``[[assert]]`` (the gates: ``assert`` is a
Python keyword, so their field is ``Scenario.asserts``). An app is ``app =
"module:function"``, or an ``[app]`` table with its ``function`` and ``params``
(``Scenario.app`` and ``Scenario.app_params``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from dopool._engine.options import DEFAULT_IDLE_TIMEOUT
from dopool._errors import ScenarioError
from dopool._sim.checks import choice, number, text
from dopool._sim.cost import Prices
from dopool._sim.pools import (
    POOL_FIELDS,
    Pool,
    PoolTable,
    amplification,
    pool_of,
    resolve,
)
from dopool._sim.sections import (
    DEFAULT_TOTAL,
    GATES,
    MAX_EVENTS,
    MAX_PAUSED_ALL,
    MAX_TIME,
    Arrivals,
    Faults,
    Gate,
    Kill,
    Partitions,
    Pause,
    Retry,
    Service,
    about,
)
from dopool._store.layout.limits import PER_KEY

__all__ = [
    "DEFAULT_TOTAL",
    "GATES",
    "LISTS",
    "PRESETS",
    "SECTIONS",
    "Arrivals",
    "Faults",
    "Gate",
    "Kill",
    "Partitions",
    "Pause",
    "Prices",
    "Retry",
    "Scenario",
    "Service",
]

#: What a preset fills in of a scenario, as TOML data: the file's own values win.
PRESETS: dict[str, dict[str, Any]] = {
    # Cloudflare Durable Objects (developers.cloudflare.com/durable-objects/api/alarms/):
    # a failing alarm is retried from 2 s, exponentially, at most 6 times; then none
    # fires until something sets one. An event's own failures get the same schedule
    # (7 executions, 2 s doubling: the 6th retry after 64 s, not capped at 60 s).
    # Storage limits (2 KiB keys, 128 KiB values) are dopool's own already.
    "cloudflare": {
        "alarm_retries": 6,
        "retry": {
            "max_attempts": 7,
            "initial_delay": 2.0,
            "multiplier": 2.0,
            "max_delay": 64.0,
            "jitter": 0.0,
        },
    },
}

# The tables of a scenario by name (``arrivals`` may also be an array), and its
# arrays of tables.
SECTIONS: dict[str, type[Any]] = {
    "arrivals": Arrivals,
    "partitions": Partitions,
    "service": Service,
    "retry": Retry,
    "faults": Faults,
    "cost": Prices,
}
LISTS: dict[str, type[Any]] = {"pauses": Pause, "kills": Kill}
APP_PARAMS = "app.params"  # the app's table: its function, and the parameters it is given
NO_APP = "is a parameter of an app, and the scenario names none (--app)"
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A whole simulation: the pools, their load, their handlers' behaviour, the faults.

    Attributes:
        name, description: shown in the report; the description says what it teaches.
        seed: every random draw of the run (arrivals, service times, failures,
            follow-ups, retry jitter, faults) derives from it.
        instances: the pool's concurrency, or ``"per-key"`` (an instance per partition
            key; ``routing = "partition"``).
        routing: ``"round-robin"``, or ``"partition"`` (by the events' partition keys).
        duration: stop at this virtual time (events still pending are reported as
            pending); absent = run until every event is processed.
        max_queue_depth: the pool's limit per instance; arrivals over it are rejected.
        payload_bytes: padding bytes added to each event.
        failure_probability: each attempt fails (and is retried) with this probability.
        poison_share: this share of events fail on every attempt (and are dead-lettered).
        alarm_retries: how often a failed alarm is retried before it is given up until
            the next write (``None``: until it lands, dopool's own policy).
        duplicate_share: this share of arrivals repeats a recent arrival's dedup key
            (every arrival then carries one); 0 = no dedup keys.
        dedup_window: the pool's ``dedup_window``, virtual seconds.
        idle_timeout: the pool's ``idle_timeout``: virtual seconds an instance with
            nothing to do runs before it is evicted.
        rate_limit: the pool's ``rate_limit``: the most attempts (retries too) it starts
            per virtual second, a number, or text such as ``"8/s"`` or ``"30/m"``;
            ``None`` (or ``"none"``) for no limit.
        delayed_share: this share of arrivals is enqueued with ``delay`` (0 = none).
        delay: the virtual seconds a delayed arrival waits before it is due.
        preset: ``"cloudflare"`` fills in Cloudflare's rules for what the file leaves
            out (:data:`PRESETS`).
        arrivals: the arrival streams, each into one pool.
        pools: ``[[pools]]`` tables; without any, the pool fields above describe one
            pool named ``sim``; with some, they are every pool's defaults.
        app: ``"module:function"`` that defines the pools with real handlers instead
            (:mod:`dopool._ops.app`); the pool fields then only shape the arrivals'
            partition keys. A file's path in a scenario file is joined to its folder
            as it is read (:mod:`dopool._sim.building`).
        app_params: keyword arguments of the app's function (``[app] params`` in a
            file, ``app.NAME`` on the command line), TOML values.
        asserts: the gates checked on the run's figures (``[[assert]]`` in a file).
        cost: the prices the run's bill is reckoned at (``[cost]``, :mod:`dopool._sim.cost`).
    """

    name: str = "custom"
    description: str = ""
    seed: int = 0
    instances: int | Literal["per-key"] = 4
    routing: str = "round-robin"
    duration: float | None = None
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
    preset: str | None = None
    arrivals: tuple[Arrivals, ...] = (Arrivals(),)
    partitions: Partitions = field(default_factory=Partitions)
    service: Service = field(default_factory=Service)
    retry: Retry = field(default_factory=Retry)
    faults: Faults = field(default_factory=Faults)
    cost: Prices = field(default_factory=Prices)
    pools: tuple[PoolTable, ...] = ()
    app: str | None = None
    app_params: dict[str, Any] = field(default_factory=dict)
    pauses: tuple[Pause, ...] = ()
    kills: tuple[Kill, ...] = ()
    asserts: tuple[Gate, ...] = ()

    def __post_init__(self) -> None:
        text("name", self.name)
        text("description", self.description)
        self._check_gates()
        number("seed", self.seed, integer=True, minimum=0, maximum=2**63 - 1)
        if self.duration is not None:
            duration = number("duration", self.duration, above=0.0, maximum=MAX_TIME)
            object.__setattr__(self, "duration", duration)
        if self.preset is not None:
            choice("preset", self.preset, tuple(PRESETS))
        for name, kind in SECTIONS.items():
            if name != "arrivals" and not isinstance(getattr(self, name), kind):
                raise ScenarioError(name, f"must be a {kind.__name__}, got {getattr(self, name)!r}")
        defaults = Pool(
            name="sim",
            **{name: getattr(self, name) for name in POOL_FIELDS},
            partitions=self.partitions,
            service=self.service,
            retry=self.retry,
        )
        object.__setattr__(self, "rate_limit", defaults.rate_limit)  # "none" is None
        tables = tuple(self.pools)
        for position, table in enumerate(tables):
            if not isinstance(table, PoolTable):
                raise ScenarioError(f"pools[{position}]", "must be a PoolTable")
        object.__setattr__(self, "pools", tables)
        if self.app is not None:
            if not isinstance(self.app, str) or ":" not in self.app:
                raise ScenarioError("app", f"must be 'module:function', got {self.app!r}")
            if tables:
                raise ScenarioError("pools", "cannot be given with an app: it defines the pools")
        self._check_params()
        resolved = resolve(defaults, tables)
        object.__setattr__(self, "_resolved", resolved)
        self._check_arrivals(resolved)
        for name, kind in LISTS.items():
            items = tuple(getattr(self, name))
            object.__setattr__(self, name, items)
            for position, item in enumerate(items):
                path = f"{name}[{position}]"
                if not isinstance(item, kind):
                    raise ScenarioError(path, f"must be a {kind.__name__}")
                if self.app is not None:
                    continue  # the app's pools are known when it runs
                pool = pool_of(item.pool, resolved, f"{path}.pool")
                check_instance(path, item, pool.name, pool.concurrency)
        self._check_pauses(resolved)

    def _check_pauses(self, pools: tuple[Pool, ...]) -> None:
        """Two pauses of one instance must not overlap, nor touch: the first resume would
        end both (an instance is paused or not), or, at the same time as the other's
        pause, might come after it; the run would not be the one described."""
        spans: list[tuple[str | None, int | None, float, float, int]] = []
        for position, pause in enumerate(self.pauses):
            pool = pause.pool if self.app is not None else pool_of(pause.pool, pools, "").name
            start, end = pause.at, pause.at + pause.duration
            for other, index, since, until, earlier in spans:
                shared = None in (index, pause.instance) or index == pause.instance  # None: all
                if other == pool and shared and start <= until and since <= end:  # or touch
                    raise ScenarioError(
                        f"pauses[{position}]",
                        f"overlaps or touches pauses[{earlier}] (t={since:g} to {until:g}) "
                        "on an instance: the first resume would end both; make them one "
                        "pause, or let one end before the next begins",
                    )
            spans.append((pool, pause.instance, start, end, position))

    def _check_params(self) -> None:
        if not isinstance(self.app_params, Mapping):
            raise ScenarioError(APP_PARAMS, f"must be a table, got {self.app_params!r}")
        params = dict(self.app_params)
        object.__setattr__(self, "app_params", params)
        for name, value in params.items():
            if not (isinstance(name, str) and name.isidentifier()):
                raise ScenarioError(APP_PARAMS, f"names {name!r}, not a keyword argument's name")
            if self.app is None:
                raise ScenarioError(f"app.{name}", NO_APP)
            _check_param(f"app.{name}", value)

    def _check_gates(self) -> None:
        object.__setattr__(self, "asserts", tuple(self.asserts))
        for position, gate in enumerate(self.asserts):
            if not isinstance(gate, Gate):
                raise ScenarioError(f"{GATES}[{position}]", "must be a Gate")

    def _check_arrivals(self, pools: tuple[Pool, ...]) -> None:
        streams = self.arrivals
        if isinstance(streams, Arrivals):  # one stream, as a plain table
            streams = (streams,)
        streams = tuple(streams)
        if not streams:
            raise ScenarioError("arrivals", "must list at least one arrival stream")
        object.__setattr__(self, "arrivals", streams)
        growth = amplification(pools)
        expected = 0.0
        for position, stream in enumerate(streams):
            path = "arrivals" if len(streams) == 1 else f"arrivals[{position}]"
            if not isinstance(stream, Arrivals):
                raise ScenarioError(path, f"must be an Arrivals, got {stream!r}")
            if self.app is not None:
                expected += stream.expected_events()
                continue
            entry = pool_of(stream.pool, pools, f"{path}.pool")
            expected += stream.expected_events() * growth[entry.name]
        if expected > MAX_EVENTS:
            raise ScenarioError(
                "arrivals",
                f"give about {about(expected)} events, follow-ups included, over the limit "
                f"of {MAX_EVENTS:,}",
            )

    # -- what the run uses ------------------------------------------------------
    @property
    def resolved_pools(self) -> tuple[Pool, ...]:
        """Every pool, its settings resolved: the one named ``sim``, or the [[pools]]."""
        pools: tuple[Pool, ...] = getattr(self, "_resolved")  # noqa: B009 - set in __post_init__
        return pools

    def pool(self, name: str | None) -> Pool:
        """The pool named ``name`` (None: the first)."""
        return pool_of(name, self.resolved_pools, "pool")

    @property
    def expected_arrivals(self) -> float:
        """How many arrivals the streams give (the mean, for Poisson streams)."""
        return sum(stream.expected_events() for stream in self.arrivals)

    # -- conversions ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field, nested sections as dicts, ``None`` for absent options."""
        result: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name == "arrivals":
                value = [stream.to_dict() for stream in value]
            elif spec.name in SECTIONS:
                value = value.to_dict()
            elif spec.name == "pools":
                value = [table.to_dict() for table in value]
            elif spec.name in LISTS or spec.name == "asserts":
                value = [_fields(item) for item in value]
            elif spec.name == "app_params":
                continue  # in the app's table, as in a file
            elif spec.name == "app" and self.app_params:
                value = {"function": value, "params": dict(self.app_params)}
            result[GATES if spec.name == "asserts" else spec.name] = value
        return result

    def to_toml(self) -> str:
        """The scenario as a TOML document that :mod:`dopool._sim.loading` reads back."""
        data = self.to_dict()
        lines: list[str] = []
        for key, value in data.items():
            tables = (*SECTIONS, *LISTS, "pools", GATES)
            if key not in tables and value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        streams = data["arrivals"]
        single = len(streams) == 1
        for stream in streams:
            lines.extend(("", "[arrivals]" if single else "[[arrivals]]"))
            lines.extend(_assignments(stream))
            for phase in stream.get("phases", []):
                lines.extend(("", "[[arrivals.phases]]", *_assignments(phase)))
        for key in SECTIONS:
            if key != "arrivals":
                lines.extend(("", f"[{key}]", *_assignments(data[key])))
        for table in data["pools"]:
            lines.extend(("", "[[pools]]", *_assignments(table)))
            for key, value in table.items():
                if isinstance(value, dict):
                    lines.extend(("", f"[pools.{key}]", *_assignments(value)))
            for rule in table.get("follow_ups", []):
                lines.extend(("", "[[pools.follow_ups]]", *_assignments(rule)))
        for key in (*LISTS, GATES):
            for item in data[key]:
                lines.extend(("", f"[[{key}]]", *_assignments(item)))
        return "\n".join(lines) + "\n"


def _fields(item: Any) -> dict[str, Any]:
    return {f.name: getattr(item, f.name) for f in fields(item)}


def _assignments(table: dict[str, Any]) -> list[str]:
    """``name = value`` for a table's plain values (absent options and sub-tables left out)."""
    return [
        f"{name} = {_toml_value(value)}"
        for name, value in table.items()
        if value is not None and not isinstance(value, dict) and not _tables(value)
    ]


def _tables(value: Any) -> bool:
    """An array of tables (``follow_ups``, ``phases``), written as its own tables."""
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):  # an inline table: an app's, its parameters
        pairs = (f"{_toml_key(key)} = {_toml_value(item)}" for key, item in value.items())
        return "{ " + ", ".join(pairs) + " }" if value else "{}"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    # Any other control character (a tab aside) is escaped too: TOML refuses it raw.
    text = "".join(
        f"\\u{ord(char):04x}" if (char < " " and char != "\t") or char == "\x7f" else char
        for char in text
    )
    return f'"{text}"'


def _toml_key(key: str) -> str:
    return key if BARE_KEY.fullmatch(key) else _toml_value(key)


def _check_param(path: str, value: object) -> None:
    """An app's parameter holds what TOML and JSON both do: no dates, no objects."""
    if isinstance(value, list | tuple):
        for item in value:
            _check_param(path, item)
    elif isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        for item in value.values():
            _check_param(path, item)
    elif isinstance(value, Mapping) or not isinstance(value, str | int | float):  # bool is an int
        raise ScenarioError(
            path, f"must be a string, number, boolean, array or table, got {value!r}"
        )


def check_instance(path: str, item: Pause | Kill, pool: str, concurrency: int) -> None:
    """Refuse a pause or kill (``path``, ``pauses[0]``) of an instance ``pool`` lacks, or a
    pause of every instance of a pool too large for one message each."""
    if item.instance is not None and item.instance >= concurrency:
        shown = "per-key" if concurrency == PER_KEY else concurrency
        raise ScenarioError(
            f"{path}.instance",
            f"must be < instances ({shown}) of pool {pool!r}, got {item.instance}",
        )
    if item.instance is None and concurrency > MAX_PAUSED_ALL:
        raise ScenarioError(
            f"{path}.instance",
            f"must name one instance: a pause of every instance of a pool of more than "
            f"{MAX_PAUSED_ALL:,} sends each a message (pool {pool!r})",
        )
