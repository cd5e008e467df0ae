"""Prometheus metrics for a runtime's pools: ``register(runtime)`` makes them scrapeable.

prometheus_client is dopool's optional ``metrics`` extra (``pip install '.[metrics]'`` in
dopool's source tree). It is imported when :func:`register` is first called, never when
this module is, so that ``import dopool.metrics`` costs nothing without it and a missing
install is one clear error (:class:`MetricsUnavailableError`).

:func:`register` adds a :class:`RuntimeMetrics` to a registry (the process default one
unless told otherwise). It is a prometheus_client collector of three kinds of series,
documented with their names in docs/deployment.md, "Metrics":

- **counters**, counted from the runtime's pool events (``runtime.subscribe``): what
  this runtime did since the metrics were registered, as Prometheus counters are;
- **histograms** of an attempt's duration (``started`` to its outcome) and of an event's
  wait (``enqueued``, or its due time, to its first ``started``): an event's enqueue time
  is held only until it starts, and at most ``max_tracked`` of them (the oldest forgotten,
  and counted);
- **gauges** read from ``pool.status()`` when scraped: the pending and scheduled events
  the store holds, whichever process stored them, the dead letters held, and how long
  a queue's head has been due (``head_due_at``).

Cardinality stays bounded: counters and gauges carry an ``instance_index`` label only
for a pool of at most ``instance_labels_up_to`` instances (a per-key pool never), and
histograms carry only ``pool``. The label is not ``instance``: Prometheus sets that one
on every scraped series (the target), and would rename ours ``exported_instance``.
"""

from __future__ import annotations

import importlib
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from dopool._errors import ConfigurationError, DopoolError
from dopool._handles.runtime import Runtime
from dopool._store.layout.limits import PER_KEY
from dopool._types import PoolEvent, PoolStatus

if TYPE_CHECKING:  # an optional extra: imported at run time by register() only
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "BUCKETS",
    "DEFAULT_INSTANCE_LABELS_UP_TO",
    "DEFAULT_MAX_TRACKED",
    "MetricsUnavailableError",
    "RuntimeMetrics",
    "check_available",
    "register",
]

#: A pool of at most this many instances gets an ``instance_index`` label.
DEFAULT_INSTANCE_LABELS_UP_TO = 64
#: The most enqueue times held for events not started yet (about 150 bytes each).
DEFAULT_MAX_TRACKED = 100_000
#: The histograms' upper bounds, in seconds: from 5 ms to an hour (handlers that call
#: the network, queues that back up), and ``+Inf``.
BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip

# The counters, by the key the event handler counts under: (name, help). Names follow
# Prometheus's conventions: the unit (none: a count) and ``_total`` for a counter.
_COUNTERS: dict[str, tuple[str, str]] = {
    "enqueued": (
        "dopool_events_enqueued",
        "Events this runtime stored (enqueues, follow-ups, redrives); a producer's "
        "enqueue in another process is not seen here.",
    ),
    "started": ("dopool_attempts_started", "Attempts started."),
    "succeeded": ("dopool_events_succeeded", "Events whose attempt succeeded."),
    "failed": (
        "dopool_attempts_failed",
        "Attempts that failed (raised, or were cut short by a crash), retried or dead-lettered.",
    ),
    "retried": (
        "dopool_retries_scheduled",
        "Failed attempts after which the event waits for a retry.",
    ),
    "dead_lettered": (
        "dopool_events_dead_lettered",
        "Events dead-lettered: a last failed attempt, an expired ttl or a damaged record.",
    ),
}
_DROPPED = (
    "dopool_queue_waits_dropped",
    "Events whose enqueue time was forgotten (more than max_tracked waiting): their "
    "first start observes no queue wait.",
)
_DURATION = (
    "dopool_attempt_duration_seconds",
    "From an attempt's start to its outcome (success, retry or dead letter); an attempt "
    "a crash cut short is not observed.",
)
_WAIT = (
    "dopool_queue_wait_seconds",
    "From an event's enqueue (or, enqueued with a delay, its due time) to its first "
    "start, for the events this runtime stored.",
)
# Read from pool.status() at each scrape: (name, help, the PoolStatus field).
_GAUGES = (
    (
        "dopool_events_pending",
        "Events stored and not finished: due, scheduled, or running.",
        "pending",
    ),
    ("dopool_events_scheduled", "Of the pending events, those not due yet.", "scheduled"),
    (
        "dopool_dead_letters_held",
        "Dead letters held: dead-lettered, and neither redriven nor purged since.",
        "dead_letters_held",
    ),
)
_HEAD_AGE = (
    "dopool_queue_head_age_seconds",
    "How long the event at the head of a queue (running, in backoff, or next to start) "
    "has been due: the pool's most delayed queue, or one instance's where labelled; 0 "
    "with nothing due.",
)
# The pool events the counters and histograms read; the others cost one lookup.
_WATCHED = frozenset(
    {"enqueued", "started", "succeeded", "retry_scheduled", "dead_lettered"}
    | {"crashed", "cancelled", "drained"}  # what lets go of an attempt or an enqueue time
)

_registered: list[RuntimeMetrics] = []  # open, in every registry
_registering = threading.RLock()  # (a scrape that finds its runtime closed closes itself)


class MetricsUnavailableError(ConfigurationError):
    """prometheus_client, dopool's ``metrics`` extra, is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "dopool.metrics needs prometheus_client, dopool's 'metrics' extra "
            "(pip install '.[metrics]' in dopool's source tree)"
        )


def check_available() -> None:
    """Raise :class:`MetricsUnavailableError` now if prometheus_client is missing."""
    _client()


def register(
    runtime: Runtime,
    *,
    registry: CollectorRegistry | None = None,
    instance_labels_up_to: int = DEFAULT_INSTANCE_LABELS_UP_TO,
    max_tracked: int = DEFAULT_MAX_TRACKED,
) -> RuntimeMetrics:
    """Make ``runtime``'s pools scrapeable from ``registry``, and return its collector.

    Args:
        runtime: the runtime whose pools are measured: those it has defined and those
            it will (its events are counted from now on).
        registry: where the series go: prometheus_client's process default registry
            (``REGISTRY``, what ``start_http_server`` serves) when None.
        instance_labels_up_to: a pool of at most this many instances gets an
            ``instance_index`` label on its counters and gauges (0: none does); a per-key
            pool never does.
        max_tracked: the most enqueue times held for events not started yet.

    Registering a runtime again on the same registry returns the collector registered
    first (with other options it raises). One registry takes one runtime's metrics at a
    time, as their names are the same: a second open runtime's raises, one closed is
    unregistered first. The collector unregisters itself once its runtime is closed, at
    the next scrape, or at once with :meth:`RuntimeMetrics.close`.

    Raises:
        MetricsUnavailableError: prometheus_client is not installed.
        ConfigurationError: a bad option; the runtime is closed; the registry holds
            another open runtime's metrics.
    """
    client = _client()
    _check_count("instance_labels_up_to", instance_labels_up_to, 0)
    _check_count("max_tracked", max_tracked, 1)
    target: CollectorRegistry = client.REGISTRY if registry is None else registry
    options = _Options(instance_labels_up_to, max_tracked)
    with _registering:
        for held in list(_registered):
            if held.registry is not target:
                continue
            if held.runtime is runtime and not runtime.closed:
                if held._options != options:
                    raise ConfigurationError(
                        f"the metrics of {runtime!r} are registered already, with "
                        f"{held._options.text()}; close them (metrics.close()) to change that"
                    )
                return held
            if held.runtime.closed:
                held.close()
        if runtime.closed:
            raise ConfigurationError(f"cannot register the metrics of {runtime!r}: it is closed")
        metrics = RuntimeMetrics(runtime, target, options)
        try:
            target.register(metrics)
        except ValueError as exc:  # prometheus_client's DuplicateTimeseries
            other = next((m.runtime for m in _registered if m.registry is target), None)
            whose = "another collector's" if other is None else f"those of {other!r}"
            raise ConfigurationError(
                f"cannot register the metrics of {runtime!r}: the registry holds series of "
                f"the same names ({whose}); register it on a CollectorRegistry of its own, "
                "or close the other's first"
            ) from exc
        metrics._unsubscribe = runtime.subscribe(metrics._on_event)
        _registered.append(metrics)
    return metrics


@dataclass(frozen=True, slots=True)
class _Options:
    instance_labels_up_to: int
    max_tracked: int

    def text(self) -> str:
        return f"instance_labels_up_to={self.instance_labels_up_to}, max_tracked={self.max_tracked}"


class RuntimeMetrics:
    """One runtime's series, collected from its pool events and its pools' status.

    A prometheus_client collector (``collect``, ``describe``), made by :func:`register`
    and registered there; ``close()`` unsubscribes it and unregisters it.

    Attributes:
        runtime: the runtime measured.
        registry: the registry it is registered in.
    """

    def __init__(self, runtime: Runtime, registry: CollectorRegistry, options: _Options) -> None:
        self.runtime = runtime
        self.registry = registry
        self._options = options
        self._lock = threading.Lock()  # the instances' threads count, a scrape reads
        # (counter key, pool, instance index or None): its count. An index is kept for
        # a pool that gets the label, and for one not defined yet (its define's own
        # recovery), folded away once it is known not to get it.
        self._counts: dict[tuple[str, str, int | None], int] = {}
        self._labelled: dict[str, bool] = {}  # by pool, once it is defined here
        self._dropped: dict[str, int] = {}
        self._durations: dict[str, _Histogram] = {}
        self._waits: dict[str, _Histogram] = {}
        # (pool, index, sequence): when an event stored here became due, until it starts.
        self._enqueued: dict[tuple[str, int, int], float] = {}
        # (pool, index): the attempt running there, (sequence, attempt, started at).
        self._running: dict[tuple[str, int], tuple[int, int, float]] = {}
        self._unsubscribe: Callable[[], None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "registered"
        return f"<RuntimeMetrics of {self.runtime!r}, {state}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop counting and leave the registry (its series go with it). Idempotent."""
        with _registering:
            if self._closed:
                return
            self._closed = True
            if self._unsubscribe is not None:
                self._unsubscribe()
            with suppress(KeyError):  # unregistered by hand already
                self.registry.unregister(self)
            _registered.remove(self)

    # -- counting, in the instances' threads ----------------------------------------------
    def _on_event(self, event: PoolEvent) -> None:
        kind = event.kind
        if kind not in _WATCHED:
            return
        pool, index, sequence = event.pool, event.instance_index, event.sequence
        with self._lock:
            if kind == "enqueued":
                self._count("enqueued", pool, index)
                if sequence is not None:
                    self._hold_enqueue((pool, index, sequence), event)
            elif kind == "started":
                self._count("started", pool, index)
                self._start(event)
            elif kind == "crashed":  # the recovery's outcome is no attempt's duration
                self._running.pop((pool, index), None)
            elif kind == "cancelled":
                if sequence is not None:
                    self._enqueued.pop((pool, index, sequence), None)
            elif kind == "drained":  # every pending event of the instance went
                for key in [k for k in self._enqueued if k[0] == pool and k[1] == index]:
                    del self._enqueued[key]
            else:  # an attempt's outcome (or a dead letter that no attempt ended)
                if kind == "succeeded":
                    self._count("succeeded", pool, index)
                elif kind == "retry_scheduled":
                    self._count("failed", pool, index)
                    self._count("retried", pool, index)
                else:
                    self._count("dead_lettered", pool, index)
                    if event.attempt:  # it had started: its last attempt failed
                        self._count("failed", pool, index)
                    if sequence is not None:  # an expired event never started
                        self._enqueued.pop((pool, index, sequence), None)
                self._end(event)

    def _count(self, counter: str, pool: str, index: int) -> None:
        labelled = self._labelled.get(pool)
        if labelled is None:
            labelled = self._learn(pool)
        key = (counter, pool, index if labelled is not False else None)
        self._counts[key] = self._counts.get(key, 0) + 1

    def _learn(self, pool: str) -> bool | None:
        """Whether ``pool`` gets the instance label, once it is defined (None before:
        counts keep their index until then)."""
        defined = self.runtime.pools.get(pool)
        if defined is None:
            return None
        labelled = self._labels(defined.concurrency)
        self._labelled[pool] = labelled
        if not labelled:  # what its define's recovery counted, by index: one series
            for key in [k for k in self._counts if k[1] == pool and k[2] is not None]:
                folded = (key[0], pool, None)
                self._counts[folded] = self._counts.get(folded, 0) + self._counts.pop(key)
        return labelled

    def _labels(self, concurrency: int) -> bool:
        return concurrency != PER_KEY and concurrency <= self._options.instance_labels_up_to

    def _hold_enqueue(self, key: tuple[str, int, int], event: PoolEvent) -> None:
        held = self._enqueued
        if len(held) >= self._options.max_tracked:
            oldest = next(iter(held))
            del held[oldest]
            self._dropped[oldest[0]] = self._dropped.get(oldest[0], 0) + 1
        held[key] = event.time if event.due is None else event.due

    def _start(self, event: PoolEvent) -> None:
        pool, index, sequence, attempt = (
            event.pool,
            event.instance_index,
            event.sequence,
            event.attempt,
        )
        if sequence is None or attempt is None:
            return
        since = self._enqueued.pop((pool, index, sequence), None)
        if since is not None and attempt == 1:
            self._histogram(self._waits, pool).observe(event.time - since)
        running = self._running
        if len(running) >= self._options.max_tracked and (pool, index) not in running:
            del running[next(iter(running))]
        running[(pool, index)] = (sequence, attempt, event.time)

    def _end(self, event: PoolEvent) -> None:
        started = self._running.pop((event.pool, event.instance_index), None)
        if started is not None and started[:2] == (event.sequence, event.attempt):
            self._histogram(self._durations, event.pool).observe(event.time - started[2])

    @staticmethod
    def _histogram(histograms: dict[str, _Histogram], pool: str) -> _Histogram:
        found = histograms.get(pool)
        if found is None:
            found = histograms[pool] = _Histogram()
        return found

    # -- a scrape -------------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        """The families :meth:`collect` yields, without samples (what a registry checks
        for names another collector has)."""
        core = _core()
        names = [
            *((name, "counter") for name, _ in _COUNTERS.values()),
            (_DROPPED[0], "counter"),
            (_DURATION[0], "histogram"),
            (_WAIT[0], "histogram"),
            *((name, "gauge") for name, _, _ in _GAUGES),
            (_HEAD_AGE[0], "gauge"),
        ]
        return [core.Metric(name, "", typ) for name, typ in names]

    def collect(self) -> Iterator[Metric]:
        """The series as they stand: each defined pool's counts, then its status read."""
        if self.runtime.closed:
            self.close()
            return
        core = _core()
        pools = dict(self.runtime.pools)
        with self._lock:
            labelled = {name: self._labelled.get(name) for name in pools}
            for name, known in labelled.items():
                if known is None:
                    labelled[name] = self._learn(name)
            counts = dict(self._counts)
            dropped = dict(self._dropped)
            durations = {name: h.copy() for name, h in self._durations.items()}
            waits = {name: h.copy() for name, h in self._waits.items()}
        # Every series of a defined pool is there from its first scrape, at 0: a series
        # that appears only when it first counts hides that first increase from rate().
        rows = [
            (name, index)
            for name, handle in pools.items()
            for index in (range(handle.concurrency) if labelled[name] else (None,))
        ]
        for key, (name, help_text) in _COUNTERS.items():
            metric: Metric = core.Metric(name, help_text, "counter")
            for pool, index in rows:
                value = counts.get((key, pool, index), 0)
                metric.add_sample(f"{name}_total", _label_set(pool, index), value)
            yield metric
        metric = core.Metric(_DROPPED[0], _DROPPED[1], "counter")
        for pool in pools:
            metric.add_sample(f"{_DROPPED[0]}_total", {"pool": pool}, dropped.get(pool, 0))
        yield metric
        for (name, help_text), histograms in ((_DURATION, durations), (_WAIT, waits)):
            metric = core.Metric(name, help_text, "histogram")
            for pool in pools:
                histograms.get(pool, _Histogram()).samples(metric, name, pool)
            yield metric
        statuses: dict[str, PoolStatus] = {}
        for name, handle in pools.items():
            try:  # (limit=0: the sums alone, however many instances were used)
                statuses[name] = handle.status() if labelled[name] else handle.status(limit=0)
            except DopoolError:  # closed meanwhile, say: its gauges are left out
                continue
        for name, help_text, field in _GAUGES:
            metric = core.Metric(name, help_text, "gauge")
            for pool, status in statuses.items():
                if labelled[pool]:
                    for index in range(status.concurrency):
                        value = getattr(status.instance(index), field)
                        metric.add_sample(name, _label_set(pool, index), value)
                else:
                    metric.add_sample(name, {"pool": pool}, getattr(status, field))
            yield metric
        now = self.runtime.clock.now()
        metric = core.Metric(*_HEAD_AGE, "gauge")
        for pool, status in statuses.items():
            if labelled[pool]:
                for index in range(status.concurrency):
                    due = status.instance(index).head_due_at
                    age = 0.0 if due is None else max(now - due, 0.0)
                    metric.add_sample(_HEAD_AGE[0], _label_set(pool, index), age)
            else:
                due = status.head_due_at
                age = 0.0 if due is None else max(now - due, 0.0)
                metric.add_sample(_HEAD_AGE[0], {"pool": pool}, age)
        yield metric


class _Histogram:
    """Counts by bucket (not cumulative), the sum and the count of observed seconds."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)  # the last: above every bound
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)  # a wall clock stepped back
        self.buckets[bisect_left(BUCKETS, seconds)] += 1
        self.count += 1
        self.total += seconds

    def copy(self) -> _Histogram:
        copied = _Histogram()
        copied.buckets, copied.count, copied.total = list(self.buckets), self.count, self.total
        return copied

    def samples(self, metric: Metric, name: str, pool: str) -> None:
        cumulative = 0
        for bound, count in zip((*BUCKETS, float("inf")), self.buckets, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound)  # as prometheus_client writes it
            metric.add_sample(f"{name}_bucket", {"pool": pool, "le": le}, cumulative)
        metric.add_sample(f"{name}_count", {"pool": pool}, self.count)
        metric.add_sample(f"{name}_sum", {"pool": pool}, self.total)


def _label_set(pool: str, index: int | None) -> dict[str, str]:
    return {"pool": pool} if index is None else {"pool": pool, "instance_index": str(index)}


def _check_count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigurationError(f"{name} must be an int >= {least}, got {value!r}")


def _client() -> ModuleType:
    try:
        return importlib.import_module("prometheus_client")
    except ImportError:
        raise MetricsUnavailableError from None


def _core() -> ModuleType:
    return importlib.import_module("prometheus_client.metrics_core")
