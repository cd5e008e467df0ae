"""What a simulated design would cost on Cloudflare: the ``[cost]`` price table, what a
run used in Cloudflare's meters, and the bill of the run and of a month at its load.

docs/simulate.md ("What a design costs") gives the prices with their source and date,
and how dopool's events map to Cloudflare's meters:

- **requests**: each event stored (an enqueue, a follow-up, an app's own event) is a call
  to its object, and each attempt that waited for its due time or a retry's backoff ran
  from an alarm, which is an invocation too;
- **duration**: 128 MB for each second an object is billed, either while it runs an
  attempt (``duration = "busy"``: an object that can hibernate between requests) or from
  its activation to its eviction (``"resident"``: one that cannot);
- **rows read and written**: those the handlers' ``ctx.storage`` calls made, as the
  engine counted them (``PoolEvent.rows_read``, ``rows_written``), and a row written for
  each alarm set;
- **stored data**: the keys and values left in the instances' storage at the end, held
  for the month.

A month at the run's load scales each count by the month's seconds over the load's (from
the run's start to its last arrival: the work that load caused, timers and queues
draining after it, is in the counts), takes off what the plan includes, and adds the
plan's own price.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from dopool._errors import ScenarioError
from dopool._sim.checks import Section, assign, choice, number

DURATIONS = ("busy", "resident")
MILLION = 1_000_000
GB = 1_000_000_000  # bytes in a GB of stored data
MB_PER_GB = 1024  # an object's memory, 128 MB, is billed as 0.125 GB
LINES = ("requests", "duration", "rows_read", "rows_written", "stored", "plan")


@dataclass(frozen=True, kw_only=True)
class Prices(Section):
    """The ``[cost]`` table: Cloudflare's prices for Durable Objects (the Workers Paid
    plan, SQLite storage), each overridable. Dollars; ``*_price`` per million of the
    meter (GB-month for stored data) past what the plan includes each month."""

    section: ClassVar[str] = "cost"

    duration: str = "busy"  # or "resident": when an object's 128 MB are billed
    plan: float = 5.0  # USD a month: the Workers Paid plan, which Durable Objects need
    requests_included: int = 1_000_000
    request_price: float = 0.15
    gb_s_included: int = 400_000
    gb_s_price: float = 12.5
    memory_mb: int = 128
    rows_read_included: int = 25_000_000_000
    rows_read_price: float = 0.001
    rows_written_included: int = 50_000_000
    rows_written_price: float = 1.0
    stored_gb_included: float = 5.0
    stored_gb_price: float = 0.2
    month: float = 2_592_000.0  # seconds in the month the bill projects to (30 days)

    def _check(self) -> None:
        assign(self, "duration", choice("duration", self.duration, DURATIONS))
        for spec in fields(self):
            if spec.name == "duration":
                continue
            integer = spec.type == "int"
            value = getattr(self, spec.name)
            checked = number(spec.name, value, integer=integer, minimum=0.0, maximum=1e15)
            assign(self, spec.name, checked if integer else float(checked))
        if self.memory_mb == 0 or self.month == 0:
            name = "memory_mb" if self.memory_mb == 0 else "month"
            raise ScenarioError(name, "must be above 0")


@dataclass(frozen=True, slots=True)
class Usage:
    """What a run used, in Cloudflare's meters (see the module docstring)."""

    seconds: float = 0.0  # the load's: the run's start to its last arrival (none: its end)
    enqueues: int = 0  # events stored: calls to an object
    alarms: int = 0  # attempts run from an alarm: a due time or a retry's backoff
    busy: float = 0.0  # object-seconds running an attempt
    resident: float = 0.0  # object-seconds from activation to eviction
    rows_read: int = 0
    storage_rows_written: int = 0  # by ctx.storage; each alarm set writes a row too
    stored_bytes: int = 0  # keys and values stored at the end

    @property
    def requests(self) -> int:
        return self.enqueues + self.alarms

    @property
    def rows_written(self) -> int:
        return self.storage_rows_written + self.alarms


@dataclass(frozen=True, slots=True)
class Bill:
    """The bill of a run's :class:`Usage` at :class:`Prices`: the run's own, metered
    without allowances or the plan, and a month's at the run's load."""

    prices: Prices
    usage: Usage

    @property
    def gb_s(self) -> float:
        """GB-seconds the run is billed for."""
        seconds = self.usage.busy if self.prices.duration == "busy" else self.usage.resident
        return seconds * self.prices.memory_mb / MB_PER_GB

    @property
    def scale(self) -> float:
        """How many runs a month holds (0 for a run that took no time)."""
        seconds = self.usage.seconds
        return self.prices.month / seconds if seconds > 0 else 0.0

    def counts(self, scale: float = 1.0) -> dict[str, float]:
        """Each metered line's count (stored data in GB, held, not scaled)."""
        usage = self.usage
        return {
            "requests": usage.requests * scale,
            "duration": self.gb_s * scale,
            "rows_read": usage.rows_read * scale,
            "rows_written": usage.rows_written * scale,
            "stored": usage.stored_bytes / GB,
        }

    def run(self) -> dict[str, float]:
        """The run's own dollars by line: its counts at the prices, nothing included;
        stored data for the load's share of a month."""
        p, counts = self.prices, self.counts()
        share = self.usage.seconds / p.month
        return {
            "requests": counts["requests"] / MILLION * p.request_price,
            "duration": counts["duration"] / MILLION * p.gb_s_price,
            "rows_read": counts["rows_read"] / MILLION * p.rows_read_price,
            "rows_written": counts["rows_written"] / MILLION * p.rows_written_price,
            "stored": counts["stored"] * p.stored_gb_price * share,
        }

    def month(self) -> dict[str, float]:
        """A month's dollars by line at the run's load, past what the plan includes, and
        the plan."""
        p, counts = self.prices, self.counts(self.scale)
        return {
            "requests": _past(counts["requests"], p.requests_included, p.request_price),
            "duration": _past(counts["duration"], p.gb_s_included, p.gb_s_price),
            "rows_read": _past(counts["rows_read"], p.rows_read_included, p.rows_read_price),
            "rows_written": _past(
                counts["rows_written"], p.rows_written_included, p.rows_written_price
            ),
            "stored": max(counts["stored"] - p.stored_gb_included, 0.0) * p.stored_gb_price,
            "plan": p.plan,
        }

    def figures(self) -> dict[str, float]:
        """The gates' and sweeps' figures: ``cost.month``, ``cost.run`` and each line's
        dollars a month (``cost.requests``, ...)."""
        month = self.month()
        return {
            "cost.month": sum(month.values()),
            "cost.run": sum(self.run().values()),
            **{f"cost.{line}": dollars for line, dollars in month.items() if line != "plan"},
        }

    def to_json_dict(self) -> dict[str, Any]:
        usage = self.usage
        month, run = self.month(), self.run()
        return {
            "duration_billed": self.prices.duration,
            "usage": {
                "load_seconds": round(usage.seconds, 6),
                "requests": usage.requests,
                "enqueues": usage.enqueues,
                "alarms": usage.alarms,
                "busy_seconds": round(usage.busy, 6),
                "resident_seconds": round(usage.resident, 6),
                "gb_s": round(self.gb_s, 6),
                "rows_read": usage.rows_read,
                "rows_written": usage.rows_written,
                "storage_rows_written": usage.storage_rows_written,
                "stored_bytes": usage.stored_bytes,
            },
            "run": {
                **{line: _cents(dollars) for line, dollars in run.items()},
                "total": _cents(sum(run.values())),
            },
            "month": {
                "runs": round(self.scale, 6),
                **{line: _cents(month[line]) for line in LINES},
                "total": _cents(sum(month.values())),
            },
        }


def _past(count: float, included: float, price: float) -> float:
    """Dollars for ``count`` past ``included``, at ``price`` a million."""
    return max(count - included, 0.0) / MILLION * price


def _cents(dollars: float) -> float:
    """Dollars as the JSON gives them: to a hundredth of a cent."""
    return round(dollars, 4)
