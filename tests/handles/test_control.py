"""``dopool pause``, ``resume`` and ``drain``: live control of a store from another
process, against a running worker and with no owner."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dopool
from cli_support import assert_one_line_error, invoke
from dopool import Runtime
from worker_support import Evidence, Worker, starts


def _cli(*args: str) -> list[str]:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def _status(store: Path) -> dopool.PoolStatus:
    with dopool.connect(store) as connection:
        return connection.pool("jobs").status()


def _checked(store: Path) -> None:
    result = invoke("check", str(store))
    assert result.exit_code == 0, result.output


def _enqueue(store: Path, *events: dict[str, Any]) -> list[int]:
    with dopool.connect(store) as connection:
        jobs = connection.pool("jobs")
        return [jobs.enqueue(event, partition_key="one").sequence for event in events]


def test_a_paused_instance_starts_nothing_more_and_a_resume_starts_it_at_once(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    """The pause commits while a handler runs; its outcome starts nothing after it (a
    drain then finds the next event still pending). With no poll, only the resume's
    wake-up can start what was enqueued while paused."""
    owner = worker(store_path, evidence, "--poll-interval", "3600", concurrency=1).ready()
    _enqueue(store_path, {"p": "t", "k": 0, "gate": True}, {"p": "t", "k": 1})
    evidence.wait_for("the gated handler to start", e="start", k=0)
    assert _cli("pause", str(store_path), "--pool", "jobs") == ["paused jobs:0"]
    evidence.mark("paused")
    evidence.release()
    evidence.wait_for("the gated event's outcome", e="pool", kind="succeeded")
    # Committed after that outcome: had the outcome started event 1, it would be running
    # or done, and the drain would not remove it.
    assert _cli("drain", str(store_path), "--pool", "jobs") == ["drained 1 events from jobs:0"]
    _enqueue(store_path, {"p": "t", "k": 2})  # its wake-up meets a paused instance
    evidence.mark("resuming")
    assert _cli("resume", str(store_path), "--pool", "jobs") == ["resumed jobs:0"]
    evidence.wait_for("the event enqueued while paused to run", e="end", k=2)
    assert owner.stop() == 0
    lines = evidence.snapshot()
    marks = [line.get("what") for line in lines]
    paused, resuming = marks.index("paused"), marks.index("resuming")
    assert starts(lines[paused:resuming]) == []
    assert [line["k"] for line in starts(lines)] == [0, 2]  # event 1 never ran
    status = _status(store_path)
    counts = (status.enqueued, status.succeeded, status.drained, status.pending)
    assert counts == (3, 2, 1, 0)
    assert status.instance(0).state == "idle"
    _checked(store_path)


def test_a_drain_under_a_running_handler_keeps_its_event_and_the_counters_add_up(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    owner = worker(store_path, evidence, concurrency=1).ready()
    _enqueue(store_path, {"p": "t", "k": 0, "gate": True}, *[{"p": "t", "k": k} for k in (1, 2)])
    evidence.wait_for("the gated handler to start", e="start", k=0)
    assert _cli("drain", str(store_path), "--pool", "jobs", "--instance", "0") == [
        "drained 2 events from jobs:0, kept the event whose attempt is running"
    ]
    _checked(store_path)  # consistent while the attempt runs
    evidence.release()
    evidence.wait_for("the running event's success", e="pool", kind="succeeded")
    assert owner.stop() == 0
    assert [line["k"] for line in starts(evidence.snapshot())] == [0]
    status = _status(store_path)
    assert (status.enqueued, status.succeeded, status.drained, status.pending) == (3, 1, 2, 0)
    assert status.enqueued == status.succeeded + status.dead_lettered + status.drained
    _checked(store_path)


def _no_handler(_ctx: dopool.EventContext) -> None:
    raise AssertionError("nothing runs while no owner is up")


def test_control_with_no_owner_is_stored_and_the_next_owner_obeys_it(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    with Runtime(store_path) as runtime:
        runtime.define("jobs", execute=_no_handler, concurrency=2).pause()
    with dopool.connect(store_path) as connection:
        jobs = connection.pool("jobs")
        for k in range(6):
            jobs.enqueue({"p": "n", "k": k})  # round-robin: 3 each
    assert _cli("resume", str(store_path), "--pool", "jobs") == ["resumed jobs:0..1"]
    assert _cli("pause", str(store_path), "--pool", "jobs", "--instance", "1") == ["paused jobs:1"]
    assert _cli("pause", str(store_path), "--pool", "jobs") == [
        "paused jobs:0",
        "jobs:1: already paused, unchanged",
    ]
    assert _cli("drain", str(store_path), "--pool", "jobs", "--instance", "1") == [
        "drained 3 events from jobs:1"
    ]
    assert _cli("resume", str(store_path), "--pool", "jobs", "--instance", "0") == [
        "resumed jobs:0"
    ]
    _checked(store_path)
    owner = worker(store_path, evidence).ready()
    evidence.wait(lambda lines: len([x for x in lines if x["e"] == "end"]) == 3, "3 events")
    assert owner.stop() == 0
    assert {line["index"] for line in starts(evidence.snapshot())} == {0}
    status = _status(store_path)
    assert (status.succeeded, status.drained, status.pending) == (3, 3, 0)
    assert [s.state for s in status.instances] == ["idle", "paused"]
    _checked(store_path)


def test_control_errors_are_one_line(store_path: Path, tmp_path: Path) -> None:
    with Runtime(store_path) as runtime:
        runtime.define("jobs", execute=_no_handler, concurrency=2)
    result = invoke("pause", str(store_path), "--pool", "nope")
    assert_one_line_error(result, 1, "'nope'", "jobs")
    result = invoke("drain", str(store_path), "--pool", "jobs", "--instance", "2")
    assert_one_line_error(result, 1, "no instance 2", "concurrency 2")
    result = invoke("resume", str(tmp_path / "missing"), "--pool", "jobs")
    assert_one_line_error(result, 1, "missing")
    result = invoke("pause", str(store_path))
    assert_one_line_error(result, 2, "--pool")


@pytest.mark.parametrize("window", [0.0, 3600.0])
def test_a_drain_releases_dedup_keys_as_the_owners_window_says(
    store_path: Path, window: float
) -> None:
    """The window is not stored: the drained keys are stamped, not removed, so the owner's
    window (here the producer's, as the owner would pass it) decides whether a key is held."""
    with Runtime(store_path) as runtime:
        runtime.define("jobs", execute=_no_handler, concurrency=1, dedup_window=window).pause()
    with dopool.connect(store_path) as connection:
        jobs = connection.pool("jobs", dedup_window=window)
        jobs.enqueue({"k": 0}, dedup_key="a")
        assert jobs.enqueue({"k": 1}, dedup_key="a").duplicate
        assert _cli("drain", str(store_path), "--pool", "jobs") == ["drained 1 events from jobs:0"]
        again = jobs.enqueue({"k": 2}, dedup_key="a")
    assert again.duplicate is (window > 0)
    status = _status(store_path)
    assert (status.drained, status.pending) == (1, 0 if window else 1)
    _checked(store_path)
