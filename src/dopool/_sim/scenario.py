"""Scenarios: what a simulation runs, as frozen dataclasses validated field by field.

Every error is a :class:`ScenarioError` that names the bad field by its dotted
path (``arrivals.rate``, ``pauses[1].at``), so a user can find it in the file or
the flag that set it. :mod:`dopool._sim.loading` makes a scenario from a TOML
file, a built-in name or flags.

The TOML layout mirrors the dataclasses: top-level fields, then one table per
section (``[arrivals]``, ``[partitions]``, ``[service]``, ``[retry]``,
``[faults]``) and arrays of tables for ``[[pauses]]``, ``[[kills]]`` and ``[[assert]]``
(the gates: ``assert`` is a Python keyword, so their field is ``Scenario.asserts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from dopool._errors import ConfigurationError
from dopool._sim import gates

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


class ScenarioError(ConfigurationError):
    """A scenario field is missing, unknown, of the wrong type or out of range.

    Attributes:
        field: the dotted path of the field (``"arrivals.rate"``), or ``""`` for the whole.
        problem: what is wrong with it.
        source: where the scenario came from (a file path, a flag), if known.
    """

    def __init__(self, field: str, problem: str, *, source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.source = source
        where = f"{source}: " if source else ""
        name = f"field '{field}'" if field else "scenario"
        super().__init__(f"{where}{name} {problem}")

    def within(self, prefix: str) -> ScenarioError:
        """The same error for a field nested under ``prefix`` (``pauses[0]``)."""
        path = f"{prefix}.{self.field}" if self.field else prefix
        return ScenarioError(path, self.problem, source=self.source)

    def from_source(self, source: str) -> ScenarioError:
        return ScenarioError(self.field, self.problem, source=source)


# -- field checks ---------------------------------------------------------------
def _number(
    path: str,
    value: object,
    *,
    integer: bool = False,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
) -> Any:
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        raise ScenarioError(path, f"must be {kind}, got {value!r}")
    if not integer:
        value = float(value)
        if not math.isfinite(value):
            raise ScenarioError(path, f"must be finite, got {value!r}")
    if minimum is not None and value < minimum:
        raise ScenarioError(path, f"must be >= {minimum:g}, got {value!r}")
    if above is not None and value <= above:
        raise ScenarioError(path, f"must be > {above:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ScenarioError(path, f"must be <= {maximum:g}, got {value!r}")
    return value


def _probability(path: str, value: object, maximum: float = 1.0) -> float:
    result: float = _number(path, value, minimum=0.0, maximum=maximum)
    return result


def _choice(path: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ScenarioError(path, f"must be one of {allowed}, got {value!r}")
    return value


def _text(path: str, value: object) -> str:
    if not isinstance(value, str):
        raise ScenarioError(path, f"must be a string, got {value!r}")
    return value


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


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
    """

    section: ClassVar[str] = "arrivals"

    process: str = "poisson"
    rate: float = 50.0
    total: int | None = None
    duration: float | None = None
    burst_size: int = 100
    burst_interval: float = 10.0

    def _check(self) -> None:
        _set(self, "process", _choice("process", self.process, PROCESSES))
        _set(self, "rate", _number("rate", self.rate, above=0.0))
        if self.total is not None:
            _number("total", self.total, integer=True, minimum=1, maximum=MAX_EVENTS)
        if self.duration is not None:
            _set(self, "duration", _number("duration", self.duration, above=0.0))
        if self.total is not None and self.duration is not None:
            raise ScenarioError("duration", "cannot be given together with arrivals.total")
        if self.total is None and self.duration is None:
            _set(self, "total", DEFAULT_TOTAL)
        _number("burst_size", self.burst_size, integer=True, minimum=1, maximum=MAX_EVENTS)
        _set(self, "burst_interval", _number("burst_interval", self.burst_interval, above=0.0))
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
        _number("keys", self.keys, integer=True, minimum=1, maximum=MAX_KEYS)
        _set(self, "zipf", _number("zipf", self.zipf, minimum=0.0, maximum=10.0))
        _set(self, "hot_key_share", _probability("hot_key_share", self.hot_key_share))


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
        _set(self, "distribution", _choice("distribution", self.distribution, DISTRIBUTIONS))
        _set(self, "mean", _number("mean", self.mean, minimum=0.0, maximum=86_400.0))
        _set(self, "sigma", _number("sigma", self.sigma, minimum=0.0, maximum=5.0))


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
        _number("max_attempts", self.max_attempts, integer=True, minimum=1, maximum=1000)
        _set(self, "initial_delay", _number("initial_delay", self.initial_delay, minimum=0.0))
        _set(self, "multiplier", _number("multiplier", self.multiplier, minimum=1.0))
        _set(self, "max_delay", _number("max_delay", self.max_delay, minimum=self.initial_delay))
        _set(self, "jitter", _probability("jitter", self.jitter))


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
            _set(self, name, _probability(name, getattr(self, name)))
        for name in ("alarm_error", "storage_error"):
            _set(self, name, _probability(name, getattr(self, name), MAX_LIVELOCK_PROBABILITY))

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) > 0 for f in fields(self))


@dataclass(frozen=True, kw_only=True)
class Pause:
    """Pause one instance (or all, ``instance`` absent) at ``at`` for ``duration`` seconds."""

    at: float
    duration: float
    instance: int | None = None

    def __post_init__(self) -> None:
        _set(self, "at", _number("at", self.at, minimum=0.0))
        _set(self, "duration", _number("duration", self.duration, above=0.0))
        if self.instance is not None:
            _number("instance", self.instance, integer=True, minimum=0)


@dataclass(frozen=True, kw_only=True)
class Kill:
    """Crash one instance at virtual time ``at`` (as ``runtime.kill`` does)."""

    at: float
    instance: int = 0

    def __post_init__(self) -> None:
        _set(self, "at", _number("at", self.at, minimum=0.0))
        _number("instance", self.instance, integer=True, minimum=0)


@dataclass(frozen=True, kw_only=True)
class Gate:
    """A gate on the run's figures, ``[[assert]]``: ``check = "p99 <= 0.5"``
    (:mod:`dopool._sim.gates`), and ``why`` it matters, shown if it fails."""

    check: str
    why: str | None = None

    def __post_init__(self) -> None:
        _text("check", self.check)
        if self.why is not None:
            _text("why", self.why)
        try:
            gates.parse(self.check)
        except gates.GateError as exc:
            raise ScenarioError("check", str(exc)) from None


GATES = "assert"  # the gates' array of tables in a file; the field is ``asserts``


# The tables of a scenario by name, and its arrays of tables.
SECTIONS: dict[str, type[Any]] = {
    "arrivals": Arrivals,
    "partitions": Partitions,
    "service": Service,
    "retry": Retry,
    "faults": Faults,
}
LISTS: dict[str, type[Any]] = {"pauses": Pause, "kills": Kill}


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A whole simulation: the pool, its load, its handler's behaviour and its faults.

    Attributes:
        name, description: shown in the report; the description says what it teaches.
        seed: every random draw of the run (arrivals, service times, failures,
            retry jitter, faults) derives from it.
        instances: the pool's concurrency.
        routing: ``"round-robin"``, or ``"partition"`` (by the events' partition keys).
        duration: stop at this virtual time (events still pending are reported as
            pending); absent = run until every event is processed.
        max_queue_depth: the pool's limit per instance; arrivals over it are rejected.
        payload_bytes: padding bytes added to each event.
        failure_probability: each attempt fails (and is retried) with this probability.
        poison_share: this share of events fail on every attempt (and are dead-lettered).
        asserts: the gates checked on the run's figures (``[[assert]]`` in a file).
    """

    name: str = "custom"
    description: str = ""
    seed: int = 0
    instances: int = 4
    routing: str = "round-robin"
    duration: float | None = None
    max_queue_depth: int | None = None
    payload_bytes: int = 0
    failure_probability: float = 0.0
    poison_share: float = 0.0
    arrivals: Arrivals = field(default_factory=Arrivals)
    partitions: Partitions = field(default_factory=Partitions)
    service: Service = field(default_factory=Service)
    retry: Retry = field(default_factory=Retry)
    faults: Faults = field(default_factory=Faults)
    pauses: tuple[Pause, ...] = ()
    kills: tuple[Kill, ...] = ()
    asserts: tuple[Gate, ...] = ()

    def __post_init__(self) -> None:
        _text("name", self.name)
        _text("description", self.description)
        _number("seed", self.seed, integer=True, minimum=0, maximum=2**63 - 1)
        _number("instances", self.instances, integer=True, minimum=1, maximum=MAX_INSTANCES)
        _set(self, "routing", _choice("routing", self.routing, ROUTINGS))
        if self.duration is not None:
            _set(self, "duration", _number("duration", self.duration, above=0.0))
        if self.max_queue_depth is not None:
            _number("max_queue_depth", self.max_queue_depth, integer=True, minimum=1)
        _number("payload_bytes", self.payload_bytes, integer=True, minimum=0)
        if self.payload_bytes > MAX_PAYLOAD_BYTES:
            raise ScenarioError(
                "payload_bytes", f"must be <= {MAX_PAYLOAD_BYTES:,}, got {self.payload_bytes:,}"
            )
        _set(
            self,
            "failure_probability",
            _probability("failure_probability", self.failure_probability),
        )
        _set(self, "poison_share", _probability("poison_share", self.poison_share))
        for name, kind in SECTIONS.items():
            if not isinstance(getattr(self, name), kind):
                raise ScenarioError(name, f"must be a {kind.__name__}, got {getattr(self, name)!r}")
        for name, kind in LISTS.items():
            items = tuple(getattr(self, name))
            _set(self, name, items)
            for position, item in enumerate(items):
                if not isinstance(item, kind):
                    raise ScenarioError(f"{name}[{position}]", f"must be a {kind.__name__}")
                index = item.instance
                if index is not None and index >= self.instances:
                    raise ScenarioError(
                        f"{name}[{position}].instance",
                        f"must be < instances ({self.instances}), got {index}",
                    )
        _set(self, "asserts", tuple(self.asserts))
        for position, gate in enumerate(self.asserts):
            if not isinstance(gate, Gate):
                raise ScenarioError(f"{GATES}[{position}]", "must be a Gate")

    # -- conversions ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field, nested sections as dicts, ``None`` for absent options; the gates
        under ``assert``, as in a file."""
        result: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name in SECTIONS:
                value = {f.name: getattr(value, f.name) for f in fields(value)}
            elif spec.name in LISTS or spec.name == "asserts":
                value = [{f.name: getattr(item, f.name) for f in fields(item)} for item in value]
            result[GATES if spec.name == "asserts" else spec.name] = value
        return result

    def to_toml(self) -> str:
        """The scenario as a TOML document that :mod:`dopool._sim.loading` reads back."""
        data = self.to_dict()
        arrays = [*LISTS, GATES]
        lines: list[str] = []
        for key, value in data.items():
            if key not in SECTIONS and key not in arrays and value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        for key in SECTIONS:
            lines.extend(("", f"[{key}]"))
            lines.extend(
                f"{name} = {_toml_value(value)}"
                for name, value in data[key].items()
                if value is not None
            )
        for key in arrays:
            for item in data[key]:
                lines.extend(("", f"[[{key}]]"))
                lines.extend(
                    f"{name} = {_toml_value(value)}"
                    for name, value in item.items()
                    if value is not None
                )
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    # Any other control character (a tab aside) is escaped too: TOML refuses it raw.
    text = "".join(
        f"\\u{ord(char):04x}" if (char < " " and char != "\t") or char == "\x7f" else char
        for char in text
    )
    return f'"{text}"'
