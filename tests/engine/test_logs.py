"""What an instance logs (docs/deployment.md, "Logs"): each failed attempt once, with its
traceback, at WARNING when it is retried and at ERROR when it dead-letters its event; a
crash at ERROR; a success at DEBUG only; each record's fields in ``record.dopool``."""

from __future__ import annotations

import json
import logging

import pytest

from cli_support import invoke
from dopool import EventContext, RetryPolicy, Runtime
from dopool._engine import logs
from dopool._ops.logs import JsonFormatter

TIMEOUT = 30.0
RETRY = RetryPolicy(max_attempts=3, initial_delay=0.5, jitter=0.0)


def lookup(event: dict[str, str]) -> str:
    return event["b"]  # a KeyError for an event without "b"


def handle(ctx: EventContext) -> None:
    lookup(ctx.event)


def engine_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("dopool.")]


def test_each_failed_attempt_is_logged_once_with_its_traceback(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="dopool")
    pool = sim.define("jobs", execute=handle, retry=RETRY)
    pool.enqueue({"a": "1"})
    assert pool.join(timeout=TIMEOUT)
    records = [r for r in engine_records(caplog) if r.name != "dopool.attempts" or r.exc_info]
    assert [(r.name, r.levelname) for r in records] == [
        ("dopool.attempts", "WARNING"),
        ("dopool.attempts", "WARNING"),
        ("dopool.dead_letters", "ERROR"),
    ]
    for attempt, record in enumerate(records, 1):
        assert record.dopool == {  # type: ignore[attr-defined]
            "event_id": "jobs:0:0",
            "pool": "jobs",
            "instance": 0,
            "sequence": 0,
            "attempt": attempt,
            "error": "KeyError: 'b'",
            **({"retry_at": record.dopool["retry_at"]} if attempt < 3 else {}),  # type: ignore[attr-defined]
        }
        assert record.exc_info is not None
        traceback = logging.Formatter().formatException(record.exc_info)
        assert f'{__file__}", line' in traceback  # the handler's own frames
        assert "in lookup" in traceback
        assert traceback.endswith("KeyError: 'b'")
    assert "event jobs:0:0 failed attempt 1, retried at" in records[0].getMessage()
    assert records[2].getMessage() == "event jobs:0:0 dead-lettered after attempt 3: KeyError: 'b'"


def test_a_success_is_logged_at_debug_only(sim: Runtime, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dopool")
    pool = sim.define("jobs", execute=lambda ctx: None)
    pool.enqueue_many(range(3))
    assert pool.join(timeout=TIMEOUT)
    assert engine_records(caplog) == []
    caplog.set_level(logging.DEBUG, logger="dopool")
    pool.enqueue(3)
    assert pool.join(timeout=TIMEOUT)
    (record,) = [r for r in engine_records(caplog) if r.name == "dopool.attempts"]
    assert record.levelname == "DEBUG"
    assert record.getMessage() == "event jobs:0:3 succeeded on attempt 1"


def test_a_crash_is_logged_at_error(sim: Runtime, caplog: pytest.LogCaptureFixture) -> None:
    pool = sim.define("jobs", execute=lambda ctx: None, concurrency=2)
    pool.enqueue("x")
    assert pool.join(timeout=TIMEOUT)
    caplog.set_level(logging.ERROR, logger="dopool")
    sim.kill("jobs", 1)
    pool.enqueue_many(range(4))
    assert pool.join(timeout=TIMEOUT)
    (record,) = [r for r in engine_records(caplog) if r.name == "dopool.instances"]
    assert record.levelname == "ERROR"
    assert record.getMessage().startswith("instance jobs:1 crashed: ")
    assert record.dopool["pool"] == "jobs"  # type: ignore[attr-defined]
    assert record.dopool["instance"] == 1  # type: ignore[attr-defined]


def test_a_chaos_run_leaves_out_its_planned_failures_and_crashes_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Modelled(Exception):
        pass

    def failing(ctx: EventContext) -> None:
        raise (Modelled if ctx.event == "modelled" else KeyError)("x")

    caplog.set_level(logging.WARNING, logger="dopool")
    with Runtime.simulated(seed=0) as runtime, logs.modelled((Modelled,)):
        pool = runtime.define("jobs", execute=failing)
        pool.enqueue_many(["modelled", "bug"])
        assert pool.join(timeout=TIMEOUT)
        runtime.kill("jobs", 0)
    kept = [(r.name, r.getMessage()) for r in engine_records(caplog)]
    assert kept == [
        ("dopool.dead_letters", "event jobs:0:1 dead-lettered after attempt 1: KeyError: 'x'")
    ]
    assert logs.ATTEMPTS.filters == logs.INSTANCES.filters == []  # taken off after


def test_a_simulation_logs_no_failure_it_runs(caplog: pytest.LogCaptureFixture) -> None:
    """Its report, trace and dead letters tell them: a design's failures are its own."""
    caplog.set_level(logging.DEBUG, logger="dopool")
    done = invoke("simulate", "--scenario", "crash-storm", "--events", "200", "-q")
    assert done.exit_code == 0, done.output
    assert "crashes" in done.output
    assert [r for r in engine_records(caplog) if r.levelno >= logging.WARNING] == []


def test_the_json_lines_hold_the_fields_and_the_traceback(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dopool")
    pool = sim.define("jobs", execute=handle)
    pool.enqueue({"a": "1"})
    assert pool.join(timeout=TIMEOUT)
    (record,) = engine_records(caplog)
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "ERROR"
    assert line["logger"] == "dopool.dead_letters"
    assert line["message"] == "event jobs:0:0 dead-lettered after attempt 1: KeyError: 'b'"
    assert (line["event_id"], line["pool"], line["instance"], line["attempt"]) == (
        "jobs:0:0",
        "jobs",
        0,
        1,
    )
    assert line["traceback"].startswith("Traceback (most recent call last):")
    assert "in lookup" in line["traceback"]
    assert line["time"].endswith("+00:00")


def test_a_failure_with_text_utf8_cannot_hold_is_logged_escaped(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A lone surrogate (``surrogateescape`` text) would make a strict handler drop the
    line: the message carries the kept traceback, escaped, instead of the exception."""

    def handler(ctx: EventContext) -> None:
        raise ValueError(b"name \xff".decode("utf-8", "surrogateescape"))

    caplog.set_level(logging.WARNING, logger="dopool")
    pool = sim.define("p", execute=handler)
    pool.enqueue("x")
    assert pool.join(timeout=TIMEOUT)
    (record,) = engine_records(caplog)
    assert record.exc_info is None
    message = record.getMessage()
    message.encode()  # (raises if it held the surrogate itself)
    assert message.startswith(
        "event p:0:0 dead-lettered after attempt 1: ValueError: name \\udcff\n"
    )
    assert "Traceback (most recent call last):" in message
    assert message.endswith("ValueError: name \\udcff")
