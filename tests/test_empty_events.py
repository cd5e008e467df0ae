"""``empty`` is said once for every finish that leaves an instance with nothing pending.

Checked on a simulated run's trace, where outcomes and enqueues often share a transaction
(group commit): the trace's own order of ``enqueued`` and ``succeeded`` gives each
instance's pending count, and each time a finish brings it to 0 one ``empty`` of that
instance follows (after the rest of its transaction's events).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from dopool._sim import loading
from dopool._sim.driver import run


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
