"""Scenarios: what a simulation runs, as frozen dataclasses validated field by field.

A scenario comes from a TOML file (:func:`load_file`), a built-in name
(:func:`builtin`), or either of those changed by flags (:func:`with_overrides`,
``"arrivals.rate" -> "80"``). Every error is a :class:`ScenarioError` that names
the bad field by its dotted path (``arrivals.rate``, ``pauses[1].at``), so a
user can find it in the file or the flag that set it.

The TOML layout mirrors the dataclasses: top-level fields, then one table per
section (``[arrivals]``, ``[partitions]``, ``[service]``, ``[retry]``,
``[faults]``) and arrays of tables for ``[[pauses]]`` and ``[[kills]]``.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from dopool._errors import ConfigurationError

ROUTINGS = ("round-robin", "partition")
PROCESSES = ("steady", "poisson", "bursts")
DISTRIBUTIONS = ("fixed", "exponential", "lognormal")
BUILTINS = ("steady", "burst", "hot-partition", "poison", "crash-storm", "maintenance")

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
class _Section:
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
class Arrivals(_Section):
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
class Partitions(_Section):
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
class Service(_Section):
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
class Retry(_Section):
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
class Faults(_Section):
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


_SECTIONS: dict[str, type[Any]] = {
    "arrivals": Arrivals,
    "partitions": Partitions,
    "service": Service,
    "retry": Retry,
    "faults": Faults,
}
_LISTS: dict[str, type[Any]] = {"pauses": Pause, "kills": Kill}


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
        for name, kind in _SECTIONS.items():
            if not isinstance(getattr(self, name), kind):
                raise ScenarioError(name, f"must be a {kind.__name__}, got {getattr(self, name)!r}")
        for name, kind in _LISTS.items():
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

    # -- conversions ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field, nested sections as dicts, ``None`` for absent options."""
        result: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name in _SECTIONS:
                value = {f.name: getattr(value, f.name) for f in fields(value)}
            elif spec.name in _LISTS:
                value = [{f.name: getattr(item, f.name) for f in fields(item)} for item in value]
            result[spec.name] = value
        return result

    def to_toml(self) -> str:
        """The scenario as a TOML document that :func:`load_file` reads back."""
        data = self.to_dict()
        lines: list[str] = []
        for key, value in data.items():
            if key not in _SECTIONS and key not in _LISTS and value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        for key in _SECTIONS:
            lines.extend(("", f"[{key}]"))
            lines.extend(
                f"{name} = {_toml_value(value)}"
                for name, value in data[key].items()
                if value is not None
            )
        for key in _LISTS:
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
    return f'"{text}"'


# -- building from plain data -------------------------------------------------------
def from_mapping(data: Mapping[str, Any]) -> Scenario:
    """Build a scenario from TOML-like data, refusing unknown keys by their path."""
    if not isinstance(data, Mapping):
        raise ScenarioError("", f"must be a table, got {data!r}")
    top = {f.name for f in fields(Scenario)}
    _refuse_unknown("", data, top)
    arguments: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SECTIONS:
            arguments[key] = _build(key, _SECTIONS[key], value)
        elif key in _LISTS:
            if not isinstance(value, list):
                raise ScenarioError(key, f"must be an array of tables ([[{key}]]), got {value!r}")
            arguments[key] = tuple(
                _build(f"{key}[{position}]", _LISTS[key], item)
                for position, item in enumerate(value)
            )
        else:
            arguments[key] = value
    scenario: Scenario = _construct("", Scenario, arguments)
    return scenario


def _build(path: str, kind: type[Any], value: object) -> Any:
    if not isinstance(value, Mapping):
        raise ScenarioError(path, f"must be a table, got {value!r}")
    _refuse_unknown(path, value, {f.name for f in fields(kind)})
    return _construct(path, kind, dict(value))


def _construct(path: str, kind: type[Any], arguments: dict[str, Any]) -> Any:
    required = [
        f.name
        for f in fields(kind)
        if f.default is MISSING and f.default_factory is MISSING and f.name not in arguments
    ]
    if required:
        name = f"{path}.{required[0]}" if path else required[0]
        raise ScenarioError(name, "is required")
    try:
        return kind(**arguments)
    except ScenarioError as exc:
        # Sections name their own fields; list items only know their own names.
        nested = path and not issubclass(kind, _Section) and kind is not Scenario
        raise (exc.within(path) if nested else exc) from None


def _refuse_unknown(path: str, data: Mapping[str, Any], known: set[str]) -> None:
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            name = f"{path}.{key}" if path else str(key)
            raise ScenarioError(name, f"is not a scenario field{hint}")


def load_file(path: str | Path) -> Scenario:
    """Read a scenario from a TOML file; errors name the file and the field."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError("", f"cannot be read: {exc.strerror or exc}", source=source) from None
    return loads(text, source=source)


def loads(text: str, *, source: str = "<scenario>") -> Scenario:
    """Parse a scenario from TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError("", f"is not valid TOML: {exc}", source=source) from None
    try:
        return from_mapping(data)
    except ScenarioError as exc:
        raise exc.from_source(source) from None


def builtin(name: str) -> Scenario:
    """One of the built-in scenarios (:data:`BUILTINS`), shipped as TOML files."""
    if name not in BUILTINS:
        raise ScenarioError("", f"'{name}' is not a built-in scenario ({', '.join(BUILTINS)})")
    text = resources.files("dopool._sim").joinpath("scenarios", f"{name}.toml").read_text("utf-8")
    return loads(text, source=f"built-in scenario '{name}'")


def resolve(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file by path."""
    if name_or_path in BUILTINS:
        return builtin(name_or_path)
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists() or "/" in name_or_path:
        return load_file(path)
    raise ScenarioError(
        "",
        f"'{name_or_path}' is neither a built-in scenario ({', '.join(BUILTINS)}) nor a file",
    )


# -- overrides (flags) --------------------------------------------------------------
def _field_kind(path: str) -> tuple[type[Any], str, str]:
    """``(dataclass, field name, annotation)`` of a dotted path, or a ScenarioError."""
    parts = path.split(".")
    if len(parts) == 1:
        kind: type[Any] = Scenario
        name = parts[0]
    elif len(parts) == 2 and parts[0] in _SECTIONS:
        kind, name = _SECTIONS[parts[0]], parts[1]
    elif parts[0] in _LISTS:
        raise ScenarioError(parts[0], "can only be set in a scenario file")
    else:
        raise ScenarioError(path, "is not a scenario field")
    specs = {f.name: f for f in fields(kind)}
    if name in _SECTIONS or name in _LISTS:
        if name in _LISTS:
            raise ScenarioError(name, "can only be set in a scenario file")
        raise ScenarioError(
            name, f"is a table; set one of its fields, e.g. '{name}.{_first(name)}'"
        )
    if name not in specs:
        close = difflib.get_close_matches(path, settable_fields(), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ScenarioError(path, f"is not a scenario field{hint}")
    return kind, name, str(specs[name].type)


def _first(section: str) -> str:
    return fields(_SECTIONS[section])[0].name


def settable_fields() -> list[str]:
    """Every dotted path a flag can set."""
    paths = [f.name for f in fields(Scenario) if f.name not in _SECTIONS and f.name not in _LISTS]
    for section, kind in _SECTIONS.items():
        paths.extend(f"{section}.{f.name}" for f in fields(kind))
    return paths


def numeric_fields() -> list[str]:
    """Every dotted path that holds a number (what ``--sweep`` accepts)."""
    result = []
    for path in settable_fields():
        annotation = _field_kind(path)[2]
        if annotation.startswith(("int", "float")):
            result.append(path)
    return result


def parse_value(path: str, text: str) -> Any:
    """Turn a flag's text into the field's type; ``none`` clears an optional field."""
    _, _, annotation = _field_kind(path)
    optional = "None" in annotation
    if optional and text.strip().lower() in ("none", ""):
        return None
    base = annotation.split("|")[0].strip()
    if base == "int":
        try:
            return int(text.replace("_", ""))
        except ValueError:
            raise ScenarioError(path, f"must be an integer, got {text!r}") from None
    if base == "float":
        try:
            return float(text.replace("_", ""))
        except ValueError:
            raise ScenarioError(path, f"must be a number, got {text!r}") from None
    return text


def with_overrides(scenario: Scenario, overrides: Mapping[str, Any]) -> Scenario:
    """A copy with dotted-path fields replaced (values already typed, or flag text).

    Setting one of ``arrivals.total`` / ``arrivals.duration`` clears the other
    unless both are given.
    """
    data = scenario.to_dict()
    for path, raw in overrides.items():
        _field_kind(path)
        value = parse_value(path, raw) if isinstance(raw, str) else raw
        parts = path.split(".")
        target = data if len(parts) == 1 else data[parts[0]]
        target[parts[-1]] = value
    arrivals = data["arrivals"]
    if "arrivals.total" in overrides and "arrivals.duration" not in overrides:
        arrivals["duration"] = None
    if "arrivals.duration" in overrides and "arrivals.total" not in overrides:
        arrivals["total"] = None
    return from_mapping(_without_none(data))


def _without_none(data: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            result[key] = _without_none(value)
        elif isinstance(value, list):
            result[key] = [_without_none(item) for item in value]
        elif value is not None:
            result[key] = value
    return result


def with_seed(scenario: Scenario, seed: int) -> Scenario:
    """A copy with another seed."""
    return replace(scenario, seed=seed)
