"""A handler that raises, run by ``dopool worker``: its traceback is in the worker's log
(each failed attempt once, as JSON lines with ``--log-format json``) and in ``dopool
dead-letters``, which keeps it with the dead letter."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import dopool
from cli_support import invoke
from worker_support import Evidence, Worker, until

APP = textwrap.dedent(
    """
    from dopool import RetryPolicy

    def lookup(event):
        return event["b"]

    def build(runtime):
        def handle(ctx):
            lookup(ctx.event)

        retry = RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0.0)
        runtime.define("jobs", execute=handle, retry=retry)
    """
)


def test_a_handlers_traceback_is_in_the_workers_log_and_in_its_dead_letter(
    tmp_path: Path, store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    app, log = tmp_path / "failing_app.py", tmp_path / "worker.log"
    app.write_text(APP, encoding="utf-8")
    running = worker(
        store_path, evidence, "--log-format", "json", spec=f"{app}:build", log=log
    ).ready()
    with dopool.connect(store_path) as connection:
        jobs = connection.pool("jobs")
        jobs.enqueue({"a": 1})
        until(lambda: jobs.status().dead_lettered == 1, "the event to be dead-lettered")
    assert running.stop() == 0
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    failures = [line for line in lines if line["logger"].startswith("dopool.")]
    assert [(line["logger"], line["level"], line["attempt"]) for line in failures] == [
        ("dopool.attempts", "WARNING", 1),
        ("dopool.dead_letters", "ERROR", 2),
    ]
    for line in failures:
        assert line["event_id"] == "jobs:0:0"
        assert line["error"] == "KeyError: 'b'"
        assert f'File "{app}", line 5, in lookup' in line["traceback"]
        assert line["traceback"].endswith("KeyError: 'b'")

    listed = invoke("dead-letters", str(store_path))
    assert listed.exit_code == 0, listed.output
    assert "traceback:" in listed.output
    assert f'File "{app}", line 5, in lookup' in listed.output
    as_json = invoke("dead-letters", str(store_path), "--json")
    (letter,) = json.loads(as_json.output)["dead_letters"]
    assert letter["error"] == "KeyError: 'b'"
    assert letter["traceback"].startswith("Traceback (most recent call last):")
    assert f'File "{app}", line 9, in handle' in letter["traceback"]
