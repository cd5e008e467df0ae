"""A busy instance runs event after event, one commit each, whatever wakes it meanwhile.

An attempt's outcome commit starts the next due event when nothing else waits for the
instance. Alarms do not count as waiting: each only says "read the store and start what
is due", which that commit does, so the alarms that came during the attempt (producers'
wake-ups, one per enqueue they stored) are taken with it rather than each costing a
commit of its own (docs/design.md, "An instance's commits"). Since one message may then
run many events, a committed outcome ends the instance's crash streak: a crash between
two events is not a crash loop (docs/api.md, ``crash_streak``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dopool import EventContext, PoolEvent, RetryPolicy, Runtime
from dopool.chaos import FaultPlan

TIMEOUT = 10.0
EVENTS = 5
ALARMS = 10


@pytest.mark.threaded
@pytest.mark.parametrize("durability", ["sync", "async"])
def test_alarms_that_wait_behind_an_attempt_cost_no_commit(tmp_path: Path, durability: str) -> None:
    entered = threading.Event()
    release = threading.Event()

    def handler(ctx: EventContext) -> None:
        if ctx.event == 0:
            entered.set()
            assert release.wait(TIMEOUT)

    with Runtime(tmp_path / "s", durability=durability) as runtime:
        pool = runtime.define("p", execute=handler, concurrency=1)
        pool.pause(0)
        for number in range(EVENTS):
            pool.enqueue(number)
        pool.resume(0)
        assert entered.wait(TIMEOUT)
        mailbox = pool._instances.cells[0].mailbox
        for _ in range(ALARMS):  # as producers' wake-ups would, while event 0 runs
            assert mailbox.fire_alarm()
        before = runtime._store.commit_counts[0]
        release.set()
        assert pool.join(timeout=TIMEOUT)
        commits = runtime._store.commit_counts[0] - before
        assert pool.status().succeeded == EVENTS

    # Each outcome starts the next event: one commit an event. Were the alarms each a
    # message of their own, the first would start event 1 in a commit of its own, and
    # so on, and the rest would each find nothing due, in a commit too.
    assert commits == EVENTS


def test_an_outcome_committed_ends_the_crash_streak() -> None:
    """One instance, a burst of events, a crash after one attempt in five: with the
    events chained, the message that runs them ends in a crash nearly every time. Only
    a crash loop may delay restarts; committed outcomes show there is none."""
    seen: list[PoolEvent] = []
    faults = FaultPlan(seed=3, crash_after_execute=0.2)
    retry = RetryPolicy(max_attempts=100, initial_delay=0.0, jitter=0.0)
    with Runtime.simulated(None, seed=0, faults=faults) as runtime:
        runtime.subscribe(seen.append)
        pool = runtime.define("p", execute=lambda ctx: None, concurrency=1, retry=retry)
        for number in range(200):
            pool.enqueue(number)
        assert pool.join(timeout=TIMEOUT)
        status = pool.status()
    assert (status.succeeded, status.pending) == (200, 0)
    assert sum(event.kind == "crashed" for event in seen) >= 20  # the faults did, often
    delayed = [event for event in seen if event.kind == "restart_delayed"]
    # Four crashes in a row with no outcome between: a chance of 0.2**4 per attempt.
    assert len(delayed) <= 2, [event.error for event in delayed]
