"""Arrival processes: when events arrive, from an ``[arrivals]`` spec and a seeded stream.

The processes (docs/simulate.md, "Arrival processes"):

- ``steady``: evenly spaced at ``rate``, the first at time 0.
- ``poisson``: exponential gaps of mean ``1 / rate``.
- ``bursts``: ``burst_size`` events at once, every ``burst_interval`` seconds.
- ``phases``: one phase after another, each ``duration`` seconds long at ``rate``
  (a step) or ramping linearly from ``rate`` to ``ramp_to``; Poisson arrivals,
  or steady ones if the phase says ``process = "steady"``.
- ``daily``: a sinusoidal rate ``mean + amplitude * cos(2 pi (t - peak_at) / period)``
  between ``trough`` and ``peak``; Poisson arrivals.
- ``replay``: the records of a recorded log (:func:`replay`).

**How a changing rate is followed.** The expected count by time ``t``,
``L(t)``, is the integral of the rate. Phases and the daily cycle map a
unit-rate process through its inverse (the time-change theorem): a Poisson
process of rate ``r(t)`` arrives at ``L^-1(s1), L^-1(s2), ...`` where
``s1, s2, ...`` is a Poisson process of rate 1 (gaps drawn as ``Exp(1)``). A
piecewise-linear rate has a closed-form ``L^-1`` (a quadratic per ramp); the daily
``L^-1`` is found by Newton's method, kept inside a bracket. A steady phase maps
the points ``1/2, 3/2, 5/2, ...`` instead, starting afresh at the start of each
phase: a phase whose expected count is ``n`` has ``n`` arrivals, rounded (a half
down), and a step of rate ``r`` has one every ``1/r`` seconds from ``1/(2r)`` in.

One unit-rate stream serves every Poisson phase (what is left of a gap at the
end of a phase carries over to the next, which memorylessness allows). So a draw
makes the same arrival whatever the rates are: changing a rate moves arrivals
rather than reshuffling them, which keeps runs of a sweep comparable.

Every draw comes from the ``rng`` given (the scenario's ``"{seed}/times"``
stream); ``steady``, ``poisson`` and ``bursts`` draw exactly as they always did.
Nothing here knows about pools or instances: a record carries an optional
``pool`` for the scenarios that feed several.
"""

from __future__ import annotations

import csv
import difflib
import itertools
import json
import math
import random
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from dopool._errors import ConfigurationError, ScenarioError
from dopool._machine.validation import check_pool_name
from dopool._sim.sections import MAX_EVENTS, MAX_TIME, Arrivals, Phase
from dopool._store.layout import MAX_PARTITION_KEY_BYTES

DEFAULT_PERIOD = 86_400.0  # a daily cycle: one day
COLUMNS = ("time", "partition_key", "pool")  # what a replay record may hold
_NEWTON_STEPS = 200  # far more than the bracketed Newton search ever takes


class Record(NamedTuple):
    """One arrival: its time, and for a replayed one its partition key and pool if given."""

    time: float
    partition_key: str | None = None
    pool: str | None = None


class ReplayError(ScenarioError):
    """A replay file cannot be read, or one of its records is wrong.

    The message names the file and, for a record, its line: ``arrivals.csv:12: ...``.
    ``field`` is ``"arrivals.file"``; ``path`` and ``line`` (0: the whole file) say where.
    """

    def __init__(self, path: str, line: int, problem: str) -> None:
        where = f"{path}:{line}" if line else path
        super().__init__("arrivals.file", problem, source=where)
        self.path = path
        self.line = line
        self.args = (f"{where}: {problem}",)


# -- every arrival of a spec ----------------------------------------------------------
def records(spec: Arrivals, rng: random.Random) -> Iterator[Record]:
    """Every arrival of ``spec`` in time order, capped by its ``total`` and ``duration``.

    A replayed file is read as the records are taken (so a ``total`` cap reads
    only that many); its errors are :class:`ReplayError`.
    """
    if spec.process != "replay":
        yield from (Record(at) for at in arrival_times(spec, rng))
        return
    assert spec.file is not None
    limit = math.inf if spec.duration is None else spec.duration
    count = spec.total  # None: every record (the reader refuses more than MAX_EVENTS)
    scale = 1.0 if spec.time_scale is None else spec.time_scale
    source = replay(spec.file, time_scale=scale)
    try:
        for record in itertools.islice(source, count):
            if record.time >= limit:
                return
            yield record
    finally:
        source.close()


def arrival_times(spec: Arrivals, rng: random.Random) -> Iterator[float]:
    """The arrival times of a generated process (any but ``replay``), in order."""
    limit = math.inf if spec.duration is None else spec.duration
    count = itertools.count() if spec.total is None else iter(range(spec.total))
    if spec.process == "bursts":
        for number in count:
            at = (number // spec.burst_size) * spec.burst_interval
            if at >= limit:
                return
            yield at
    elif spec.process == "steady":
        for number in count:
            at = number / spec.rate
            if at >= limit:
                return
            yield at
    elif spec.process == "poisson":
        at = 0.0
        for _ in count:
            at += rng.expovariate(spec.rate)
            if at >= limit:
                return
            yield at
    else:
        if spec.process == "phases":
            times = phase_times(spec.phases, rng)
        elif spec.process == "daily":
            times = daily_times(spec, rng)
        else:
            raise ValueError(f"process {spec.process!r} has no generated times")
        for _, at in zip(count, times, strict=False):
            if at >= limit:
                return
            yield at


# -- phases -----------------------------------------------------------------------------
def phase_times(phases: Iterable[Phase], rng: random.Random) -> Iterator[float]:
    """The arrivals of the phases, one after another (see the module's docstring)."""
    start = 0.0
    left: float | None = None  # of the unit-rate gap that ran past the last Poisson phase
    for phase in phases:
        expected = phase.expected_events(phase.duration)
        if phase.process == "steady":
            for number in itertools.count():
                if number + 0.5 >= expected:
                    break
                yield start + _ramp_inverse(phase, number + 0.5)
        else:
            unit = rng.expovariate(1.0) if left is None else left
            while unit < expected:
                yield start + _ramp_inverse(phase, unit)
                unit += rng.expovariate(1.0)
            left = unit - expected
        start += phase.duration


def _ramp_inverse(phase: Phase, count: float) -> float:
    """The time into ``phase`` by which ``count`` events are expected: solves
    ``rate * u + slope * u**2 / 2 = count`` for ``u`` (in the form that is stable
    for any slope, including 0)."""
    if count <= 0:
        return 0.0
    end = phase.rate if phase.ramp_to is None else phase.ramp_to
    slope = (end - phase.rate) / phase.duration
    root = math.sqrt(max(phase.rate * phase.rate + 2.0 * slope * count, 0.0))
    return min(2.0 * count / (phase.rate + root), phase.duration)


# -- the daily cycle ----------------------------------------------------------------------
class DailyCycle:
    """The rate ``mean + amplitude * cos(omega * (t - peak_at))`` and its integral."""

    def __init__(self, peak: float, trough: float, period: float, peak_at: float) -> None:
        self.mean = (peak + trough) / 2.0
        self.amplitude = (peak - trough) / 2.0
        self.period = period
        self.omega = 2.0 * math.pi / period
        self.peak_at = peak_at

    @classmethod
    def of(cls, spec: Arrivals) -> DailyCycle:
        """The cycle of a ``daily`` spec, its defaults applied."""
        assert spec.peak is not None
        assert spec.trough is not None
        period = DEFAULT_PERIOD if spec.period is None else spec.period
        peak_at = period / 2.0 if spec.peak_at is None else spec.peak_at
        return cls(spec.peak, spec.trough, period, peak_at)

    def rate(self, t: float) -> float:
        return self.mean + self.amplitude * math.cos(self.omega * (t - self.peak_at))

    def expected(self, t: float) -> float:
        """The expected count by time ``t`` (the integral of the rate from 0)."""
        wave = math.sin(self.omega * (t - self.peak_at)) + math.sin(self.omega * self.peak_at)
        return self.mean * t + self.amplitude / self.omega * wave

    def inverse(self, count: float, after: float) -> float:
        """The time by which ``count`` events are expected, searched from ``after``
        (a time whose expected count is at most ``count``)."""
        below = self.expected(after)
        if below >= count:
            return after
        # Each whole period adds mean * period: the bracket [lo, hi] holds the answer.
        periods = math.floor((count - below) / (self.mean * self.period)) + 1
        lo, hi = after, after + periods * self.period
        t = after + (count - below) / self.mean  # as if the rate were its mean: inside
        for _ in range(_NEWTON_STEPS):
            error = self.expected(t) - count
            if error == 0:
                return t
            if error > 0:
                hi = t
            else:
                lo = t
            rate = self.rate(t)
            guess = t - error / rate if rate > 0 else math.nan
            if not lo < guess < hi:
                guess = (lo + hi) / 2.0  # Newton left the bracket (or the rate is 0): bisect
            if abs(guess - t) <= 1e-12 * max(1.0, t):
                return guess
            t = guess
        return t


def daily_times(spec: Arrivals, rng: random.Random) -> Iterator[float]:
    """The Poisson arrivals of a daily cycle, without end (the caller caps them)."""
    cycle = DailyCycle.of(spec)
    unit = at = 0.0
    while True:
        unit += rng.expovariate(1.0)
        at = cycle.inverse(unit, at)
        yield at


# -- replay ------------------------------------------------------------------------------
def replay(path: str | Path, *, time_scale: float = 1.0) -> Generator[Record, None, None]:
    """The records of a replay file, read as they are taken.

    The format is chosen by the extension: ``.csv`` (a header row naming the
    columns: ``time``, and optionally ``partition_key`` and ``pool``; an empty
    cell is an absent value) or ``.jsonl`` / ``.ndjson`` (one JSON object per
    line, with those keys). Blank lines are skipped. Times are seconds from the
    start of the run: finite, not negative, and in order (non-decreasing). Each
    is multiplied by ``time_scale``. More than :data:`MAX_EVENTS` records is an
    error, as is anything else wrong; each names the file and the line.

    Raises:
        ReplayError: the file cannot be read, or a record is wrong.
    """
    name = str(path)
    suffix = Path(name).suffix.lower()
    if suffix not in (".csv", ".jsonl", ".ndjson"):
        raise ReplayError(name, 0, "must end in .csv, .jsonl or .ndjson")
    try:
        handle = open(name, encoding="utf-8-sig", newline="")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise ReplayError(name, 0, f"cannot be read: {exc.strerror or exc}") from None
    previous = 0.0
    try:
        rows = _csv_rows(name, handle) if suffix == ".csv" else _json_rows(name, handle)
        for number, (line, row) in enumerate(rows, 1):
            if number > MAX_EVENTS:
                raise ReplayError(name, line, f"is one record over the limit of {MAX_EVENTS:,}")
            record = _record(name, line, row)
            if record.time < previous:
                raise ReplayError(
                    name,
                    line,
                    f"time {record.time!r} is before the previous record's {previous!r} "
                    "(records must be in time order)",
                )
            previous = record.time
            if record.time * time_scale > MAX_TIME:
                raise ReplayError(
                    name,
                    line,
                    f"time {record.time!r} (x time_scale {time_scale!r}) is past "
                    f"{MAX_TIME:g} s, the latest a run may reach",
                )
            yield Record(record.time * time_scale, record.partition_key, record.pool)
    except UnicodeDecodeError as exc:
        raise ReplayError(name, 0, f"is not UTF-8 text ({exc.reason})") from None
    finally:
        handle.close()


def _csv_rows(name: str, handle: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = csv.reader(handle)
    header: list[str] | None = None
    for cells in reader:
        if not any(cell.strip() for cell in cells):
            continue  # a blank line
        if header is None:
            header = [cell.strip() for cell in cells]
            for column in header:
                _known(name, reader.line_num, column, "column")
            if "time" not in header:
                raise ReplayError(name, reader.line_num, "the header has no 'time' column")
            continue
        if len(cells) != len(header):
            raise ReplayError(
                name,
                reader.line_num,
                f"has {len(cells)} cells, the header {len(header)} ({', '.join(header)})",
            )
        yield (
            reader.line_num,
            {column: cell.strip() or None for column, cell in zip(header, cells, strict=True)},
        )
    if header is None:
        raise ReplayError(name, 0, "is empty: a CSV replay starts with a header row (time,...)")


def _json_rows(name: str, handle: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for line, text in enumerate(handle, 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ReplayError(
                name, line, f"is not valid JSON: {exc.msg} (column {exc.colno})"
            ) from None
        if not isinstance(row, dict):
            raise ReplayError(name, line, f"must be a JSON object, got {text.strip()[:40]!r}")
        for key in row:
            _known(name, line, key, "key")
        yield line, row


def _known(name: str, line: int, column: str, what: str) -> None:
    if column not in COLUMNS:
        close = difflib.get_close_matches(column, COLUMNS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        known = ", ".join(COLUMNS)
        raise ReplayError(name, line, f"has an unknown {what} {column!r}{hint}; known: {known}")


def _record(name: str, line: int, row: dict[str, Any]) -> Record:
    time = row.get("time")
    if time is None:
        raise ReplayError(name, line, "has no time")
    if isinstance(time, str):
        try:
            time = float(time)
        except ValueError:
            raise ReplayError(name, line, f"time must be a number, got {time!r}") from None
    if isinstance(time, bool) or not isinstance(time, int | float):
        raise ReplayError(name, line, f"time must be a number, got {time!r}")
    if not math.isfinite(time) or time < 0:
        raise ReplayError(name, line, f"time must be finite and >= 0, got {time!r}")
    key = row.get("partition_key")
    if key is not None:
        if not isinstance(key, str):
            raise ReplayError(name, line, f"partition_key must be a string, got {key!r}")
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            raise ReplayError(name, line, f"partition_key is not valid text: {key!r}") from None
        if size > MAX_PARTITION_KEY_BYTES:
            raise ReplayError(
                name, line, f"partition_key is {size:,} bytes, over {MAX_PARTITION_KEY_BYTES:,}"
            )
    pool = row.get("pool")
    if pool is not None:
        try:
            check_pool_name(pool)
        except ConfigurationError as exc:
            raise ReplayError(name, line, str(exc)) from None
    return Record(float(time), key, pool)
