"""The tables of a scenario: arrivals, partitions, service, retry, faults, pauses, kills.

Each is a frozen dataclass that checks its fields as it is made; an error names
the field by its dotted path (``service.mean``).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from dopool._errors import MAX_DELAY, ScenarioError
from dopool._sim import gates
from dopool._sim.checks import Section, assign, choice, number, probability, text
from dopool._store.layout.limits import MAX_CONCURRENCY, MAX_PARTITION_KEY_BYTES

ROUTINGS = ("round-robin", "partition")
PROCESSES = ("steady", "poisson", "bursts", "phases", "daily", "replay")
PHASE_PROCESSES = ("poisson", "steady")
REPLAY_SUFFIXES = (".csv", ".jsonl", ".ndjson")
ENDED = ("phases", "replay")  # processes that end by themselves: total and duration only cap them
REQUIRED = {"phases": ("phases",), "daily": ("peak", "trough"), "replay": ("file",)}
# The latest virtual time a scenario may name (about 32 years): there a double still
# tells microseconds apart; at 1e300 a service time of 50 ms vanished from the sums.
MAX_TIME = 1e9
BOUNDS: dict[str, dict[str, Any]] = {  # the optional numbers of daily and replay
    **{"peak": {"above": 0.0}, "trough": {"minimum": 0.0}},
    **{"period": {"above": 0.0, "maximum": MAX_TIME}},
    **{"peak_at": {"minimum": -MAX_TIME, "maximum": MAX_TIME}},
    **{"time_scale": {"above": 0.0}},  # the times it scales are checked as they are read
}
DISTRIBUTIONS = ("fixed", "exponential", "lognormal")

DEFAULT_TOTAL = 1000
MAX_INSTANCES = MAX_CONCURRENCY  # a pool's instances, as the engine takes them (2**32)
PER_KEY_INSTANCES = "per-key"  # ``instances = "per-key"``: an instance per partition key
#: A pause of every instance (``instance`` absent) sends each its own message: in a pool
#: of more than this many, the pause names its instance.
MAX_PAUSED_ALL = 1024
MAX_EVENTS = 10_000_000
MAX_PAYLOAD_BYTES = 100_000  # below the engine's 128 KiB event limit, with room for the rest
MAX_KEYS = 1_000_000
DEFAULT_KEYS = 64
# A storage or alarm fault that always fires would never let an instance recover or an
# alarm land, so a run could never end: keep them below certainty.
MAX_LIVELOCK_PROBABILITY = 0.5


# -- the sections -----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Phase:
    """A phase of ``process = "phases"``: ``duration`` seconds at ``rate``, or ramping
    linearly from ``rate`` to ``ramp_to``; Poisson arrivals, or ``process = "steady"``.
    """

    rate: float
    ramp_to: float | None = None
    duration: float
    process: str = "poisson"

    def __post_init__(self) -> None:
        assign(self, "rate", number("rate", self.rate, minimum=0.0))
        if self.ramp_to is not None:
            assign(self, "ramp_to", number("ramp_to", self.ramp_to, minimum=0.0))
        assign(self, "duration", number("duration", self.duration, above=0.0, maximum=MAX_TIME))
        assign(self, "process", choice("process", self.process, PHASE_PROCESSES))

    def expected_events(self, within: float) -> float:
        """The expected count of the phase's first ``within`` seconds (the trapezoid)."""
        span, end = min(within, self.duration), self.rate if self.ramp_to is None else self.ramp_to
        return (self.rate + (end - self.rate) * span / self.duration / 2.0) * span


@dataclass(frozen=True, kw_only=True)
class Arrivals(Section):
    """When events arrive (:mod:`dopool._sim.arrivals` has each ``process``, its
    fields and how its times are made; fields of the other processes are ignored).
    Give ``total`` events or a ``duration`` of arrivals in virtual seconds, not
    both: steady, poisson, bursts and daily need one (neither: 1000 events), phases
    and replay end by themselves and take either as a cap. ``pool`` names the pool
    they enter (absent: the first pool); with an app, ``payload`` names the function
    of its module that makes each event.
    """

    section: ClassVar[str] = "arrivals"
    arrays: ClassVar[dict[str, type[Any]]] = {"phases": Phase}
    sparse: ClassVar[tuple[str, ...]] = ("pool", "payload", "phases", *BOUNDS, "file")

    pool: str | None = None
    payload: str | None = None
    process: str = "poisson"
    rate: float = 50.0
    total: int | None = None
    duration: float | None = None
    burst_size: int = 100
    burst_interval: float = 10.0
    phases: tuple[Phase, ...] = ()
    peak: float | None = None
    trough: float | None = None
    period: float | None = None  # absent: a day, 86400 s
    peak_at: float | None = None  # absent: half a period (the run starts at the trough)
    file: str | None = None
    time_scale: float | None = None  # absent: 1.0

    def _check(self) -> None:
        _check_pool(self.pool)
        if self.payload is not None and not (
            isinstance(self.payload, str) and self.payload.isidentifier()
        ):
            raise ScenarioError("payload", f"must name a function, got {self.payload!r}")
        assign(self, "process", choice("process", self.process, PROCESSES))
        assign(self, "rate", number("rate", self.rate, above=0.0))
        if self.total is not None:
            number("total", self.total, integer=True, minimum=1, maximum=MAX_EVENTS)
        if self.duration is not None:
            assign(self, "duration", number("duration", self.duration, above=0.0, maximum=MAX_TIME))
        if self.total is not None and self.duration is not None:
            raise ScenarioError("duration", "cannot be given together with arrivals.total")
        if self.total is None and self.duration is None and self.process not in ENDED:
            assign(self, "total", DEFAULT_TOTAL)
        number("burst_size", self.burst_size, integer=True, minimum=1, maximum=MAX_EVENTS)
        interval = number("burst_interval", self.burst_interval, above=0.0, maximum=MAX_TIME)
        assign(self, "burst_interval", interval)
        self._check_varying()
        bounded = self.duration is not None or self.process == "phases"
        if bounded and self.expected_events() > MAX_EVENTS:
            raise ScenarioError(
                "duration" if self.duration is not None else "phases",
                f"gives about {about(self.expected_events())} events, over the limit of "
                f"{MAX_EVENTS:,}",
            )

    def _check_varying(self) -> None:
        """The fields of phases, daily and replay."""
        phases = self.phases
        if not isinstance(phases, list | tuple) or not all(isinstance(p, Phase) for p in phases):
            raise ScenarioError("phases", f"must be an array of phases, got {phases!r}")
        assign(self, "phases", tuple(phases))
        for name, bounds in BOUNDS.items():
            if getattr(self, name) is not None:
                assign(self, name, number(name, getattr(self, name), **bounds))
        if self.file is not None and not text("file", self.file).lower().endswith(REPLAY_SUFFIXES):
            raise ScenarioError("file", f"must end in .csv, .jsonl or .ndjson, got {self.file!r}")
        for name in REQUIRED.get(self.process, ()):
            if getattr(self, name) in (None, ()):
                raise ScenarioError(name, f"is required with process = '{self.process}'")
        if self.process == "daily" and self.trough > self.peak:  # type: ignore[operator]
            raise ScenarioError("trough", f"must be <= peak ({self.peak!r}), got {self.trough!r}")

    def expected_events(self) -> float:
        """How many events arrive: the mean for a random process; for ``replay``
        the ``total`` cap, or NaN (unknown until the file is read)."""
        if self.process == "replay":
            return math.nan if self.total is None else float(self.total)
        if self.process == "phases":
            left, expected = (math.inf if self.duration is None else self.duration), 0.0
            for phase in self.phases:
                expected += phase.expected_events(max(left, 0.0))
                left -= phase.duration
            return expected if self.total is None else min(expected, float(self.total))
        if self.total is not None:
            return float(self.total)
        assert self.duration is not None
        if self.process == "bursts":
            return math.ceil(self.duration / self.burst_interval) * self.burst_size
        if self.process == "daily":  # the mean rate: exact over whole periods
            return self.duration * (self.peak + self.trough) / 2.0  # type: ignore[operator]
        return self.duration * self.rate


def about(count: float) -> str:
    """An expected count as an error gives it: ``12,000,000``, but ``1.2e+300``, not 301
    digits."""
    return f"{count:,.0f}" if count < 1e15 else f"{min(count, sys.float_info.max):.3g}"


@dataclass(frozen=True, kw_only=True)
class Partitions(Section):
    """Partition keys ``k0 .. k{keys-1}``, or the ``names`` listed, or a ``file``'s
    lines: the key at position ``k`` is drawn with weight ``1 / (k + 1) ** zipf``
    (0 = uniform); ``hot_key_share`` sends that share of all events to the first on
    top. With ``names`` or ``file``, ``keys`` is left out (or is their count). Used
    only with ``routing = "partition"``.
    """

    section: ClassVar[str] = "partitions"
    sparse: ClassVar[tuple[str, ...]] = ("names", "file")

    keys: int = DEFAULT_KEYS
    zipf: float = 0.0
    hot_key_share: float = 0.0
    names: tuple[str, ...] | None = None
    file: str | None = None

    def _check(self) -> None:
        number("keys", self.keys, integer=True, minimum=1, maximum=MAX_KEYS)
        assign(self, "zipf", number("zipf", self.zipf, minimum=0.0, maximum=10.0))
        assign(self, "hot_key_share", probability("hot_key_share", self.hot_key_share))
        if self.names is not None and self.file is not None:
            raise ScenarioError("file", "cannot be given together with partitions.names")
        if self.names is not None:
            if not isinstance(self.names, list | tuple):
                raise ScenarioError("names", f"must be an array of strings, got {self.names!r}")
            assign(self, "names", tuple(self.names))
        if self.names is None and self.file is None:
            return
        given = self.drawn()
        if self.keys not in (DEFAULT_KEYS, len(given)):
            source = "names" if self.file is None else "file"
            raise ScenarioError(
                "keys",
                f"must be left out with partitions.{source}, which gives {len(given):,} "
                f"keys, got {self.keys!r}",
            )

    def drawn(self) -> tuple[str, ...]:
        """The keys, by position: the ``names``, the ``file``'s lines (read and checked
        on each call), or ``k0 .. k{keys-1}``."""
        if self.file is not None:
            return _keys("file", _lines(text("file", self.file)))
        if self.names is not None:
            return _keys("names", [(f"names[{n}]", "", key) for n, key in enumerate(self.names)])
        return tuple(f"k{n}" for n in range(self.keys))

    def to_dict(self) -> dict[str, Any]:
        """``keys`` is left out when ``names`` or ``file`` gives them."""
        result = super().to_dict()
        if self.names is not None or self.file is not None:
            del result["keys"]
        return result


def _lines(path: str) -> list[tuple[str, str, object]]:
    """A keys file's lines, each stripped, blank ones left out, as :func:`_keys` takes them."""
    try:
        with open(path, encoding="utf-8") as lines:
            found = [("file", f"line {n}: ", line.strip()) for n, line in enumerate(lines, 1)]
    except OSError as exc:
        raise ScenarioError("file", f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise ScenarioError("file", problem) from None
    return [item for item in found if item[2]]


def _keys(field: str, items: list[tuple[str, str, object]]) -> tuple[str, ...]:
    """Partition keys given as ``(path, where, key)``: at least one, at most
    :data:`MAX_KEYS`, each a non-empty string of at most 2 KiB of UTF-8 (the engine's
    partition key limit), none twice."""
    if not items:
        raise ScenarioError(field, "gives no keys: list at least one")
    if len(items) > MAX_KEYS:
        raise ScenarioError(field, f"gives {len(items):,} keys, over the limit of {MAX_KEYS:,}")
    seen: dict[str, str] = {}
    for path, where, key in items:
        if not isinstance(key, str) or not key:
            raise ScenarioError(path, f"{where}must be a non-empty string, got {key!r}")
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ScenarioError(path, f"{where}is not valid UTF-8 text ({exc.reason})") from None
        if size > MAX_PARTITION_KEY_BYTES:
            limit = f"over the partition key limit of {MAX_PARTITION_KEY_BYTES:,}"
            raise ScenarioError(path, f"{where}is {size:,} bytes of UTF-8, {limit}")
        if key in seen:
            first = f"first given at {seen[key]}"
            raise ScenarioError(path, f"{where}repeats the key {key!r} ({first})")
        seen[key] = where.removesuffix(": ") or path
    return tuple(seen)


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
        assign(self, "distribution", choice("distribution", self.distribution, DISTRIBUTIONS))
        assign(self, "mean", number("mean", self.mean, minimum=0.0, maximum=86_400.0))
        assign(self, "sigma", number("sigma", self.sigma, minimum=0.0, maximum=5.0))


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
        number("max_attempts", self.max_attempts, integer=True, minimum=1, maximum=1000)
        # The engine's bounds (RetryPolicy), checked here so that a scenario names the field.
        assign(
            self,
            "initial_delay",
            number("initial_delay", self.initial_delay, minimum=0.0, maximum=MAX_DELAY),
        )
        assign(self, "multiplier", number("multiplier", self.multiplier, minimum=1.0))
        assign(
            self,
            "max_delay",
            number("max_delay", self.max_delay, minimum=self.initial_delay, maximum=MAX_DELAY),
        )
        assign(self, "jitter", probability("jitter", self.jitter))


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
            assign(self, name, probability(name, getattr(self, name)))
        for name in ("alarm_error", "storage_error"):
            assign(self, name, probability(name, getattr(self, name), MAX_LIVELOCK_PROBABILITY))

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) > 0 for f in fields(self))


@dataclass(frozen=True, kw_only=True)
class Pause:
    """Pause one instance (or all, ``instance`` absent) of ``pool`` (absent: the first)
    at ``at`` for ``duration`` seconds."""

    at: float
    duration: float
    instance: int | None = None
    pool: str | None = None

    def __post_init__(self) -> None:
        _check_pool(self.pool)
        assign(self, "at", number("at", self.at, minimum=0.0, maximum=MAX_TIME))
        assign(self, "duration", number("duration", self.duration, above=0.0, maximum=MAX_TIME))
        if self.instance is not None:
            number("instance", self.instance, integer=True, minimum=0)


@dataclass(frozen=True, kw_only=True)
class Kill:
    """Crash one instance of ``pool`` (absent: the first) at virtual time ``at``
    (as ``runtime.kill`` does)."""

    at: float
    instance: int = 0
    pool: str | None = None

    def __post_init__(self) -> None:
        _check_pool(self.pool)
        assign(self, "at", number("at", self.at, minimum=0.0, maximum=MAX_TIME))
        number("instance", self.instance, integer=True, minimum=0)


def _check_pool(pool: object) -> None:
    if pool is not None and not isinstance(pool, str):
        raise ScenarioError("pool", f"must be a pool's name, got {pool!r}")


@dataclass(frozen=True, kw_only=True)
class Gate:
    """A gate on the run's figures, ``[[assert]]``: ``check = "p99 <= 0.5"``
    (:mod:`dopool._sim.gates`), and ``why`` it matters, shown if it fails."""

    check: str
    why: str | None = None

    def __post_init__(self) -> None:
        text("check", self.check)
        if self.why is not None:
            text("why", self.why)
        try:
            gates.parse(self.check)
        except gates.GateError as exc:
            raise ScenarioError("check", str(exc)) from None


GATES = "assert"  # the gates' array of tables in a file; the field is ``asserts``
