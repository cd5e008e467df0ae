"""What a run ignores of its scenario: the fields that change nothing in it, and why.

A sweep refuses to vary such a field (:func:`dopool._sim.sweep.run_sweep`): its rows
would differ in a value no run reads, and in nothing else. Fields are named by their
dotted paths, as ``--sweep`` and ``--set`` name them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

from dopool._sim.pools import POOL_FIELDS, POOL_SECTIONS, Pool, PoolTable
from dopool._sim.scenario import Scenario
from dopool._sim.sections import Partitions, Retry, Service

#: The arrival fields that only some processes read.
BY_PROCESS = {
    "rate": ("steady", "poisson"),
    "burst_size": ("bursts",),
    "burst_interval": ("bursts",),
    **dict.fromkeys(("peak", "trough", "period", "peak_at"), ("daily",)),
    **dict.fromkeys(("file", "time_scale"), ("replay",)),
}
#: What an app's own function sets instead: its pools, their handlers and settings.
APP_DEFINES = (
    *("instances", "max_queue_depth", "failure_probability", "alarm_retries"),
    *("dedup_window", "idle_timeout", "rate_limit", "preset"),
    *(f"service.{spec.name}" for spec in fields(Service)),
    *(f"retry.{spec.name}" for spec in fields(Retry)),
)
OWN = "a [[pools]] table sets its own"
APP_WHY = (
    "the app's function defines the pools and their settings (a parameter of the app, "
    "app.NAME, may be swept)"
)
#: Every setting of a pool, by its path under the top level or ``pools.NAME``.
POOL_PATHS = (
    *POOL_FIELDS,
    *(f"{section}.{spec.name}" for section, kind in POOL_SECTIONS.items() for spec in fields(kind)),
)


def ignored(scenario: Scenario) -> dict[str, str]:
    """Every field of ``scenario`` that changes nothing in its run, with why."""
    found: dict[str, str] = {}
    streams = scenario.arrivals
    for position, stream in enumerate(streams):
        where = ("arrivals", "arrivals[0]") if len(streams) == 1 else (f"arrivals[{position}]",)
        for name, processes in BY_PROCESS.items():
            if stream.process not in processes:
                why = f"process '{stream.process}' does not read it ({' and '.join(processes)} do)"
                found.update({f"{path}.{name}": why for path in where})
    if scenario.app is not None:
        found.update(dict.fromkeys(APP_DEFINES, APP_WHY))
        if all(stream.payload is not None for stream in streams):
            why = "the app's payload functions make every arriving event"
            found.update(dict.fromkeys(("payload_bytes", "poison_share"), why))
    unused = {pool.name: _unused(pool) for pool in scenario.resolved_pools}
    tables = {table.name: table for table in scenario.pools}
    for path in POOL_PATHS:
        unread = _unread(path, unused, tables)
        if unread is not None:
            found.setdefault(path, unread)
    for name, settings in unused.items() if tables else ():
        found.update({f"pools.{name}.{path}": why for path, why in settings.items()})
    return found


def _unread(
    path: str, unused: Mapping[str, Mapping[str, str]], tables: Mapping[str, PoolTable]
) -> str | None:
    """Why no pool reads the top-level setting ``path`` (``unused``: what each pool
    ignores), or None if one does."""
    reasons: list[str] = []
    for name, settings in unused.items():
        table = tables.get(name)
        why = OWN if table is not None and _sets(table, path) else settings.get(path)
        if why is None:
            return None
        reasons.append(why)
    if set(reasons) == {OWN}:
        return "every [[pools]] table sets its own"
    return "; ".join(dict.fromkeys(reasons))


def _sets(table: PoolTable, path: str) -> bool:
    section, _, name = path.rpartition(".")
    settings = table.settings.get(section, {}) if section else table.settings
    return isinstance(settings, Mapping) and name in settings


def _unused(pool: Pool) -> dict[str, str]:
    """The settings of ``pool`` that its own other settings make it ignore, with why."""
    found: dict[str, str] = {}
    if pool.routing != "partition":
        why = f"keys are drawn only with routing = 'partition', not '{pool.routing}'"
        found.update({f"partitions.{spec.name}": why for spec in fields(Partitions)})
    elif pool.partitions.names is not None or pool.partitions.file is not None:
        source = "names" if pool.partitions.file is None else "file"
        found["partitions.keys"] = f"partitions.{source} gives the keys"
    if pool.service.distribution != "lognormal":
        found["service.sigma"] = (
            f"it shapes a lognormal service time, and the distribution is "
            f"'{pool.service.distribution}'"
        )
    if pool.delayed_share == 0:
        found["delay"] = "no arrival is delayed (delayed_share is 0)"
    if pool.duplicate_share == 0:
        found["dedup_window"] = "no arrival carries a dedup key (duplicate_share is 0)"
    return found
