"""``dopool.metrics.register(runtime)``: the series a runtime's pools expose, read back with
prometheus_client's own parser and checked against what the handlers did and
``pool.status()``, under virtual time (docs/deployment.md, "Metrics")."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import dopool.metrics
from dopool import (
    ConfigurationError,
    EventContext,
    PermanentError,
    PoolEvent,
    RetryPolicy,
    Runtime,
    SimulatedClock,
)

Labels = frozenset[tuple[str, str]]


class Scrape:
    """A registry's exposition text, parsed: each sample's value by name and labels."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.text = generate_latest(registry).decode()
        self.families = {f.name: f for f in text_string_to_metric_families(self.text)}
        self.samples: dict[tuple[str, Labels], float] = {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in self.families.values()
            for sample in family.samples
        }

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, frozenset(labels.items()))]

    def total(self, name: str, pool: str) -> float:
        """The sum over a pool's series (its instances', when it has the label)."""
        return sum(
            value
            for (sample, labels), value in self.samples.items()
            if sample == name and ("pool", pool) in labels
        )

    def label_sets(self, name: str, pool: str) -> set[Labels]:
        return {
            labels
            for (sample, labels), _ in self.samples.items()
            if sample == name and ("pool", pool) in labels
        }


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def other() -> Iterator[Runtime]:
    runtime = Runtime.simulated(seed=0)
    yield runtime
    runtime.close()


def _idle(ctx: EventContext) -> None:
    ctx.sleep(1)


def _clock(runtime: Runtime) -> SimulatedClock:
    clock = runtime.clock
    assert isinstance(clock, SimulatedClock)
    return clock


def test_counters_and_histograms_are_what_the_pool_did(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    """Five events: two fail once and then succeed, one is dead-lettered. Each count is
    the handler's own and the status's, instance by instance; each attempt takes 3
    virtual seconds, and each event waits from t=0 to its first start."""
    ran: list[tuple[object, int, int, float]] = []

    def handle(ctx: EventContext) -> None:
        ran.append((ctx.event, ctx.instance_index, ctx.attempt, sim.clock.now()))
        ctx.sleep(3)
        if ctx.event in ("b", "c") and ctx.attempt == 1:
            raise ValueError("once")
        if ctx.event == "d":
            raise PermanentError("never")

    dopool.metrics.register(sim, registry=registry)
    retry = RetryPolicy(max_attempts=3, initial_delay=1, jitter=0)
    jobs = sim.define("jobs", execute=handle, concurrency=2, retry=retry)
    jobs.enqueue_many(list("abcde"))
    assert jobs.join()
    status, scrape = jobs.status(), Scrape(registry)

    assert scrape.total("dopool_events_enqueued_total", "jobs") == status.enqueued == 5
    assert scrape.total("dopool_attempts_started_total", "jobs") == len(ran) == 7
    assert scrape.total("dopool_events_succeeded_total", "jobs") == status.succeeded == 4
    assert scrape.total("dopool_attempts_failed_total", "jobs") == 3  # b, c, d
    assert scrape.total("dopool_retries_scheduled_total", "jobs") == 2  # b, c
    assert scrape.total("dopool_events_dead_lettered_total", "jobs") == status.dead_lettered == 1
    started = Counter(index for _, index, _, _ in ran)
    for index in range(2):
        instance, label = status.instance(index), {"pool": "jobs", "instance_index": str(index)}
        assert scrape.value("dopool_events_enqueued_total", **label) == instance.enqueued
        assert scrape.value("dopool_attempts_started_total", **label) == started[index]
        assert scrape.value("dopool_events_succeeded_total", **label) == instance.succeeded
        assert scrape.value("dopool_events_dead_lettered_total", **label) == instance.dead_lettered
        assert scrape.value("dopool_events_pending", **label) == instance.pending == 0

    duration = "dopool_attempt_duration_seconds"
    assert scrape.value(f"{duration}_count", pool="jobs") == 7
    assert scrape.value(f"{duration}_sum", pool="jobs") == pytest.approx(21.0)
    assert scrape.value(f"{duration}_bucket", pool="jobs", le="2.5") == 0
    assert scrape.value(f"{duration}_bucket", pool="jobs", le="5.0") == 7
    first_starts = [at for _, _, attempt, at in ran if attempt == 1]
    wait = "dopool_queue_wait_seconds"
    assert scrape.value(f"{wait}_count", pool="jobs") == 5
    assert scrape.value(f"{wait}_sum", pool="jobs") == pytest.approx(sum(first_starts))
    assert scrape.value(f"{wait}_bucket", pool="jobs", le="+Inf") == 5
    assert scrape.value("dopool_queue_waits_dropped_total", pool="jobs") == 0


def test_only_a_small_pool_gets_the_instance_label(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    """At most ``instance_labels_up_to`` instances: a series per instance, each there at
    0 before it counts; more, or a per-key pool: one series for the pool. Histograms
    never have the label."""
    dopool.metrics.register(sim, registry=registry, instance_labels_up_to=3)
    small = sim.define("small", execute=_idle, concurrency=3)
    big = sim.define("big", execute=_idle, concurrency=4)
    keys = sim.define("keys", execute=_idle, concurrency="per-key")
    small.enqueue("x")
    big.enqueue_many(["x", "y"])
    keys.enqueue("x", partition_key="k1")
    keys.enqueue("y", partition_key="k2")
    _clock(sim).run_until_idle()
    scrape = Scrape(registry)

    for name in ("dopool_events_succeeded_total", "dopool_events_pending"):
        assert scrape.label_sets(name, "small") == {
            frozenset({("pool", "small"), ("instance_index", str(index))}) for index in range(3)
        }
        assert scrape.label_sets(name, "big") == {frozenset({("pool", "big")})}
        assert scrape.label_sets(name, "keys") == {frozenset({("pool", "keys")})}
    label = {"pool": "small", "instance_index": "0"}
    assert scrape.value("dopool_events_succeeded_total", **label) == 1
    assert scrape.value("dopool_events_succeeded_total", pool="small", instance_index="1") == 0
    assert scrape.value("dopool_events_succeeded_total", pool="big") == 2
    assert scrape.value("dopool_events_succeeded_total", pool="keys") == 2
    for pool in ("small", "big", "keys"):
        assert scrape.label_sets("dopool_attempt_duration_seconds_count", pool) == {
            frozenset({("pool", pool)})
        }
    assert "instance=" not in scrape.text  # Prometheus's own target label is left alone


def test_no_pool_gets_the_label_with_a_bound_of_zero(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    dopool.metrics.register(sim, registry=registry, instance_labels_up_to=0)
    sim.define("one", execute=_idle, concurrency=1).enqueue("x")
    _clock(sim).run_until_idle()
    scrape = Scrape(registry)
    assert scrape.value("dopool_events_succeeded_total", pool="one") == 1
    assert "instance_index" not in scrape.text


def test_the_gauges_are_the_status_read_at_the_scrape(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    dopool.metrics.register(sim, registry=registry, instance_labels_up_to=2)
    small = sim.define("small", execute=_idle, concurrency=2)
    big = sim.define("big", execute=_idle, concurrency=3)
    for pool in (small, big):
        pool.pause()
        pool.enqueue_many(["a", "b", "c"])
        pool.enqueue("later", delay=100)
    scrape = Scrape(registry)
    status = small.status()
    for index in range(2):
        label = {"pool": "small", "instance_index": str(index)}
        assert scrape.value("dopool_events_pending", **label) == status.instance(index).pending
        assert scrape.value("dopool_events_scheduled", **label) == status.instance(index).scheduled
    assert scrape.total("dopool_events_pending", "small") == 4
    assert scrape.value("dopool_events_pending", pool="big") == big.status().pending == 4
    assert scrape.value("dopool_events_scheduled", pool="big") == big.status().scheduled == 1
    for pool in (small, big):
        pool.resume()
        assert pool.join()
    scrape = Scrape(registry)
    assert scrape.total("dopool_events_pending", "small") == 0
    assert scrape.value("dopool_events_scheduled", pool="big") == 0


def test_dead_letters_held_and_the_age_of_a_queues_head(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    """The head of a paused queue has waited since it fell due; a purged dead letter is
    no longer held (though still counted as dead-lettered)."""

    def fails(ctx: EventContext) -> None:
        raise ValueError(ctx.event)

    dopool.metrics.register(sim, registry=registry, instance_labels_up_to=2)
    clock = _clock(sim)
    dead = sim.define("dead", execute=fails, concurrency=3)  # unlabelled: one series
    dead.enqueue_many(["x", "y"])
    assert dead.join()
    waiting = sim.define("waiting", execute=_idle, concurrency=2)
    waiting.pause(1)
    waiting.enqueue("first", partition_key=None)  # round-robin: instance 0, then 1
    clock.advance(10.0)
    waiting.enqueue("second")  # instance 1, paused: due since 10 s ago
    clock.advance(5.0)
    scrape = Scrape(registry)
    assert scrape.value("dopool_dead_letters_held", pool="dead") == 2
    assert scrape.value("dopool_queue_head_age_seconds", pool="dead") == 0.0
    one = {"pool": "waiting", "instance_index": "1"}
    assert scrape.value("dopool_queue_head_age_seconds", **one) == 5.0
    assert scrape.value("dopool_queue_head_age_seconds", pool="waiting", instance_index="0") == 0
    assert waiting.status().head_due_at == waiting.status().instance(1).head_due_at
    assert dead.purge_dead_letters() == 2
    scrape = Scrape(registry)
    assert scrape.value("dopool_dead_letters_held", pool="dead") == 0
    assert dead.status().dead_lettered == 2


def test_an_attempt_a_crash_cut_short_fails_and_has_no_duration(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    def handle(ctx: EventContext) -> None:
        ctx.sleep(2)
        if ctx.attempt == 1:
            sim.kill("jobs", ctx.instance_index)  # crashes as the handler returns

    dopool.metrics.register(sim, registry=registry)
    jobs = sim.define("jobs", execute=handle, retry=RetryPolicy(initial_delay=1, jitter=0))
    jobs.enqueue("a")
    assert jobs.join()
    scrape = Scrape(registry)
    assert scrape.total("dopool_attempts_started_total", "jobs") == 2
    assert scrape.total("dopool_attempts_failed_total", "jobs") == 1
    assert scrape.total("dopool_retries_scheduled_total", "jobs") == 1
    assert scrape.total("dopool_events_succeeded_total", "jobs") == jobs.status().succeeded == 1
    assert scrape.value("dopool_attempt_duration_seconds_count", pool="jobs") == 1
    assert scrape.value("dopool_attempt_duration_seconds_sum", pool="jobs") == pytest.approx(2)


def test_an_expired_event_is_a_dead_letter_but_no_failed_attempt(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    dopool.metrics.register(sim, registry=registry)
    jobs = sim.define("jobs", execute=_idle)
    jobs.pause()
    jobs.enqueue("late", ttl=5)
    _clock(sim).advance(10)
    jobs.resume()
    assert jobs.join()
    scrape = Scrape(registry)
    assert jobs.status().expired == 1
    assert scrape.total("dopool_events_dead_lettered_total", "jobs") == 1
    assert scrape.total("dopool_attempts_failed_total", "jobs") == 0
    assert scrape.total("dopool_attempts_started_total", "jobs") == 0
    assert scrape.value("dopool_queue_wait_seconds_count", pool="jobs") == 0


def test_a_delayed_event_waits_from_its_due_time(sim: Runtime, registry: CollectorRegistry) -> None:
    dopool.metrics.register(sim, registry=registry)
    jobs = sim.define("jobs", execute=_idle)
    jobs.enqueue("first")  # runs 0..1
    jobs.enqueue("due at 0.5", delay=0.5)  # waits for the first: 0.5 s
    jobs.enqueue("due at 60", delay=60)  # starts when due: no wait
    assert jobs.join()
    scrape = Scrape(registry)
    assert scrape.value("dopool_queue_wait_seconds_count", pool="jobs") == 3
    assert scrape.value("dopool_queue_wait_seconds_sum", pool="jobs") == pytest.approx(0.5)


def test_the_enqueue_times_held_are_bounded_and_those_dropped_counted(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    dopool.metrics.register(sim, registry=registry, max_tracked=3)
    jobs = sim.define("jobs", execute=_idle)
    jobs.pause()
    jobs.enqueue_many(["a", "b", "c", "d", "e"])  # a and b are forgotten
    jobs.resume()
    assert jobs.join()
    scrape = Scrape(registry)
    assert scrape.value("dopool_queue_waits_dropped_total", pool="jobs") == 2
    assert scrape.value("dopool_queue_wait_seconds_count", pool="jobs") == 3
    assert scrape.total("dopool_attempts_started_total", "jobs") == 5
    # the three held waited 2, 3 and 4 s behind a and b (1 s each)
    assert scrape.value("dopool_queue_wait_seconds_sum", pool="jobs") == pytest.approx(9)


def test_a_drain_or_a_cancel_lets_go_of_the_enqueue_times(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    dopool.metrics.register(sim, registry=registry, max_tracked=3)
    jobs = sim.define("jobs", execute=_idle)
    jobs.pause()
    jobs.enqueue_many(["a", "b"])
    assert jobs.drain() == 2
    cancelled = jobs.enqueue("c")
    assert jobs.cancel(cancelled.event_id)
    jobs.enqueue_many(["d", "e", "f"])  # none dropped: a, b and c are let go
    jobs.resume()
    assert jobs.join()
    scrape = Scrape(registry)
    assert scrape.value("dopool_queue_waits_dropped_total", pool="jobs") == 0
    assert scrape.value("dopool_queue_wait_seconds_count", pool="jobs") == 3


def test_what_a_pool_counted_before_its_define_returned_lands_in_its_series(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    """A define's own recovery may start work before ``runtime.pools`` names the pool: its
    counts keep their index until the pool is known, then go to the pool's series."""
    metrics = dopool.metrics.register(sim, registry=registry, instance_labels_up_to=2)
    for pool in ("small", "big"):
        metrics._on_event(PoolEvent("enqueued", pool, 1, 0, time=0.0))
    sim.define("small", execute=_idle, concurrency=2)
    sim.define("big", execute=_idle, concurrency=10)
    scrape = Scrape(registry)
    assert scrape.value("dopool_events_enqueued_total", pool="small", instance_index="1") == 1
    assert scrape.value("dopool_events_enqueued_total", pool="big") == 1
    assert scrape.label_sets("dopool_events_enqueued_total", "big") == {
        frozenset({("pool", "big")})
    }


def test_registering_again_returns_the_same_collector(
    sim: Runtime, registry: CollectorRegistry
) -> None:
    metrics = dopool.metrics.register(sim, registry=registry)
    assert dopool.metrics.register(sim, registry=registry) is metrics
    with pytest.raises(ConfigurationError, match="registered already, with"):
        dopool.metrics.register(sim, registry=registry, instance_labels_up_to=2)
    sim.define("jobs", execute=_idle).enqueue("x")
    assert sim.pools["jobs"].join()
    assert Scrape(registry).total("dopool_events_succeeded_total", "jobs") == 1  # counted once


def test_one_registry_takes_one_open_runtimes_metrics(
    sim: Runtime, other: Runtime, registry: CollectorRegistry
) -> None:
    first = dopool.metrics.register(sim, registry=registry)
    with pytest.raises(ConfigurationError, match="CollectorRegistry of its own"):
        dopool.metrics.register(other, registry=registry)
    dopool.metrics.register(other, registry=CollectorRegistry())  # one of its own
    first.close()
    assert first.closed
    second = dopool.metrics.register(other, registry=registry)
    assert second is not first


def test_closing_the_runtime_or_the_collector_unregisters_it(
    other: Runtime, registry: CollectorRegistry
) -> None:
    metrics = dopool.metrics.register(other, registry=registry)
    other.define("jobs", execute=_idle)
    assert "dopool_events_pending" in Scrape(registry).families
    other.close()
    assert Scrape(registry).text == ""  # its scrape found it closed, and left
    assert metrics.closed
    metrics.close()  # again: nothing more
    with pytest.raises(ConfigurationError, match="it is closed"):
        dopool.metrics.register(other, registry=registry)


def test_a_closed_runtimes_collector_makes_way_for_the_next(
    store_path: object, registry: CollectorRegistry
) -> None:
    """The same store opened again (a process that reopens its runtime): the new runtime's
    metrics replace those of the closed one, which nobody scraped since."""
    first = Runtime.simulated(seed=0)
    stale = dopool.metrics.register(first, registry=registry)
    first.close()
    with Runtime.simulated(seed=0) as second:
        fresh = dopool.metrics.register(second, registry=registry)
        assert stale.closed
        assert not fresh.closed
    assert Scrape(registry).text == ""


def test_by_default_the_process_registry_is_used(sim: Runtime) -> None:
    metrics = dopool.metrics.register(sim)
    try:
        assert metrics.registry is prometheus_client.REGISTRY
        sim.define("jobs", execute=_idle)
        assert "dopool_events_pending" in Scrape(prometheus_client.REGISTRY).families
    finally:
        metrics.close()
    assert "dopool_events_pending" not in Scrape(prometheus_client.REGISTRY).families


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("instance_labels_up_to", -1),
        ("instance_labels_up_to", True),
        ("instance_labels_up_to", "3"),
        ("max_tracked", 0),
        ("max_tracked", 1.5),
    ],
)
def test_a_bad_option_is_refused(
    sim: Runtime, registry: CollectorRegistry, option: str, value: object
) -> None:
    with pytest.raises(ConfigurationError, match=option):
        dopool.metrics.register(sim, registry=registry, **{option: value})  # type: ignore[arg-type]


def test_without_prometheus_client_the_error_names_the_extra(
    sim: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    with pytest.raises(dopool.metrics.MetricsUnavailableError) as caught:
        dopool.metrics.register(sim)
    assert isinstance(caught.value, ConfigurationError)
    assert "pip install '.[metrics]' in dopool's source tree" in str(caught.value)
