"""``dopool worker --metrics-port``: a real worker process answers GETs on ``/metrics`` with
the documented series, and their counts are the store's (docs/deployment.md, "Metrics")."""

from __future__ import annotations

import socket
import sys
import textwrap
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

import dopool
from cli_support import assert_one_line_error, invoke
from worker_support import WAIT, Evidence, Worker, until

# Five events the app stores itself (two fail once, one is dead-lettered); the test's
# producer adds two more, one failing once.
APP = """
from dopool import EventContext, PermanentError, RetryPolicy, Runtime


def handle(ctx: EventContext) -> None:
    if ctx.event.get("fail_once") and ctx.attempt == 1:
        raise ValueError("once")
    if ctx.event.get("poison"):
        raise PermanentError("never")


def app(runtime: Runtime) -> None:
    retry = RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.01, jitter=0)
    jobs = runtime.define("jobs", execute=handle, concurrency=2, retry=retry)
    if jobs.status().enqueued == 0:
        jobs.enqueue_many(
            [{"k": 0}, {"k": 1, "fail_once": True}, {"k": 2, "fail_once": True},
             {"k": 3, "poison": True}, {"k": 4}]
        )
"""
DOCUMENTED = {
    "dopool_events_enqueued": "counter",
    "dopool_attempts_started": "counter",
    "dopool_events_succeeded": "counter",
    "dopool_attempts_failed": "counter",
    "dopool_retries_scheduled": "counter",
    "dopool_events_dead_lettered": "counter",
    "dopool_queue_waits_dropped": "counter",
    "dopool_attempt_duration_seconds": "histogram",
    "dopool_queue_wait_seconds": "histogram",
    "dopool_events_pending": "gauge",
    "dopool_events_scheduled": "gauge",
    "dopool_dead_letters_held": "gauge",
    "dopool_queue_head_age_seconds": "gauge",
}


def _status(store: Path) -> dopool.PoolStatus:
    with dopool.connect(store) as connection:
        return connection.pool("jobs").status()


class Page(NamedTuple):
    """A GET of ``/metrics``, parsed by prometheus_client's own parser."""

    families: dict[str, Metric]
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples ``name`` whose labels include ``labels``."""
        return float(
            sum(
                value
                for (sample, sample_labels), value in self.samples.items()
                if sample == name and set(labels.items()) <= set(sample_labels)
            )
        )


def _get(url: str) -> Page:
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        assert response.status == 200
        text = response.read().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families.values()
        for sample in family.samples
    }
    return Page(families, samples)


def test_a_worker_serves_its_metrics_and_they_count_what_the_store_says(
    store_path: Path, tmp_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    app = tmp_path / "metrics_app.py"
    app.write_text(textwrap.dedent(APP))
    log = tmp_path / "worker.log"
    running = worker(
        store_path, evidence, "--metrics-port", "0", spec=f"{app}:app", log=log
    ).ready()
    url = running.line("dopool worker: metrics at ").rpartition(" ")[2]
    assert url.startswith("http://127.0.0.1:")  # loopback by default
    assert url.endswith("/metrics")
    with dopool.connect(store_path) as connection:  # a producer's: not seen as enqueued
        jobs = connection.pool("jobs")
        jobs.enqueue_many([{"k": 5}, {"k": 6, "fail_once": True}])
    until(lambda: _status(store_path).processed == 7, "every event to finish")
    status = _status(store_path)
    assert (status.succeeded, status.dead_lettered, status.enqueued) == (6, 1, 7)

    def counted() -> bool:  # a subscriber runs just after the commit that status reads
        page = _get(url)
        return (
            page.total("dopool_events_succeeded_total")
            + page.total("dopool_events_dead_lettered_total")
            == status.processed
            and page.total("dopool_attempt_duration_seconds_count") == 10
        )

    until(counted, "the metrics to count every outcome")
    page = _get(url)
    assert {name: page.families[name].type for name in DOCUMENTED} == DOCUMENTED
    assert page.total("dopool_events_enqueued_total") == status.enqueued - 2 == 5
    assert page.total("dopool_attempts_started_total") == 7 + 3  # three retries
    assert page.total("dopool_events_succeeded_total") == status.succeeded
    assert page.total("dopool_attempts_failed_total") == 4
    assert page.total("dopool_retries_scheduled_total") == 3
    assert page.total("dopool_events_dead_lettered_total") == status.dead_lettered
    assert page.total("dopool_queue_wait_seconds_count") == 5  # the app's own events
    assert page.total("dopool_queue_waits_dropped_total") == 0
    for index in range(2):
        instance, label = status.instance(index), {"pool": "jobs", "instance_index": str(index)}
        assert page.total("dopool_events_succeeded_total", **label) == instance.succeeded
        assert page.total("dopool_events_dead_lettered_total", **label) == instance.dead_lettered
        assert page.total("dopool_events_pending", **label) == instance.pending == 0
        held = instance.dead_letters_held
        assert page.total("dopool_dead_letters_held", **label) == held
        assert page.total("dopool_queue_head_age_seconds", **label) == 0.0  # nothing due
    assert running.stop() == 0
    assert "stopped (SIGTERM)" in running.out[-1]


def test_a_taken_port_is_one_line_and_nothing_runs(store_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = invoke(
            "worker", "_worker_app:app", "--store", str(store_path), "--metrics-port", port
        )
    assert_one_line_error(result, 1, f"--metrics-port {port}: cannot listen on 127.0.0.1")
    assert not store_path.exists()


def test_without_the_extra_the_flag_is_refused_naming_it(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    result = invoke("worker", "_worker_app:app", "--store", str(store_path), "--metrics-port", "0")
    assert_one_line_error(result, 2, "--metrics-port: ", "'metrics' extra", "'.[metrics]'")
    assert not store_path.exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--metrics-host", "0.0.0.0"], "--metrics-host: needs --metrics-port"),
        (["--metrics-port", "65536"], "--metrics-port"),
        (["--metrics-port", "-1"], "--metrics-port"),
    ],
)
def test_a_bad_metrics_flag_is_a_usage_error(store_path: Path, args: list[str], words: str) -> None:
    result = invoke("worker", "_worker_app:app", "--store", str(store_path), *args)
    assert_one_line_error(result, 2, words)
    assert not store_path.exists()
