"""``empty`` is said once for every finish that leaves an instance with nothing pending,
and in its place: before anything enqueued into the instance after it.

Checked on a simulated run's trace, where outcomes and enqueues often share a transaction
(group commit): the trace's own order of ``enqueued`` and ``succeeded`` gives each
instance's pending count, and each time a finish brings it to 0 one ``empty`` of that
instance follows, before the enqueues its transaction took after the finish.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from dopool import PoolEvent, Runtime, SimulatedClock
from dopool._sim import loading
from dopool._sim.driver import run
from dopool.chaos import FaultPlan


@pytest.mark.parametrize("name", ["steady", "burst"])
def test_every_finish_that_empties_an_instance_says_empty_once(name: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    scenario = dataclasses.replace(loading.builtin(name), seed=3)
    run(scenario, trace=trace)
    pending: Counter[tuple[str, int]] = Counter()
    owed: set[tuple[str, int]] = set()  # instances whose last finish left nothing pending
    transitions = empties = 0
    for line in trace.read_text().splitlines():
        event = json.loads(line)
        kind, where = event["kind"], (event["pool"], event["instance_index"])
        if kind == "arrived":
            continue
        if kind == "empty":
            assert where in owed, f"an empty with no finish that emptied {where}: {event}"
            owed.discard(where)
            empties += 1
            continue
        if kind == "enqueued":
            pending[where] += 1
        elif kind in ("succeeded", "dead_lettered"):
            pending[where] -= 1
            if pending[where] == 0:
                assert where not in owed, f"{where} emptied twice without an empty: {event}"
                owed.add(where)
                transitions += 1
    assert not owed
    assert transitions > 10  # the run empties its instances often
    assert empties == transitions


#: The pool events that change an instance's depth, by how much (a drain, which says
#: nothing of how many it removed, is in none of the scenarios below).
DEPTH_CHANGE = {"enqueued": 1, "succeeded": -1, "dead_lettered": -1, "cancelled": -1}


@pytest.mark.parametrize("name", ["steady", "poison", "crash-storm", "maintenance"])
def test_no_empty_is_said_while_the_trace_holds_an_event_of_its_instance(
    name: str, tmp_path: Path
) -> None:
    """An outcome group-committed with enqueues sent during its handler said ``empty``
    after their ``enqueued`` lines (396 of steady's 1,854 at seed 1): a reader replaying
    the trace saw an empty instance holding an event."""
    trace = tmp_path / "trace.jsonl"
    run(dataclasses.replace(loading.builtin(name), seed=1), trace=trace)
    depth: Counter[tuple[str, int]] = Counter()
    empties = 0
    for number, line in enumerate(trace.read_text().splitlines(), 1):
        event = json.loads(line)
        kind, where = event["kind"], (event["pool"], event["instance_index"])
        assert kind != "drained"
        if kind == "empty":
            assert depth[where] == 0, f"line {number}: {where} empty with {depth[where]} held"
            empties += 1
        elif kind != "arrived":
            depth[where] += DEPTH_CHANGE.get(kind, 0)
    assert empties > 100  # the run empties its instances often
    assert set(depth.values()) == {0}  # and ends with nothing held


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
def test_a_recovery_that_dead_letters_the_last_event_says_empty_after_it(
    tmp_path: Path, backend: str
) -> None:
    """The recovery after a crash in the only event's handler dead-letters it (no retry),
    emptying the queue; its ``recovered``, said first, must not move the ``empty`` ahead
    of the ``dead_lettered`` (it did once the empty's place was kept: caught by chaos)."""
    plan = FaultPlan(crash_after_execute=1.0)
    clock = SimulatedClock(backend=backend)
    with Runtime(tmp_path / "store", clock=clock, seed=0, faults=plan) as runtime:
        seen: list[PoolEvent] = []
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=lambda ctx: None, retry=None)
        pool.enqueue("x")
        clock.run_until_idle()
        kinds = [event.kind for event in seen]
    assert kinds == [
        "activated",
        "enqueued",
        "started",
        "crashed",
        "recovered",
        "dead_lettered",
        "empty",
    ]
