"""The queue machine on its own: each transition driven directly, on a store, no actors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dopool import PermanentError, RetryAfter, RetryPolicy
from dopool._errors import QueueFullError
from dopool._machine.alarm import ALARM_RETRY_MAX
from dopool._machine.dedup import Dedup
from dopool._machine.followups import FollowUp
from dopool._machine.types import Effects, Item, Purge, Redrive
from dopool._store.environment import Store
from dopool._store.layout import Meta, OutboxRecord, pack, seal_event
from dopool._store.txn import Txn
from dopool.chaos import FaultPlan
from machine_rig import Rig


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "store", durability="async")
    yield store
    store.close()


def kinds(fx: Effects) -> list[str]:
    return [event.kind for event in fx.events]


def test_accept_numbers_events_and_counts_positions_by_priority(store: Store) -> None:
    rig = Rig(store)
    first = rig.enqueue("a", "b")
    urgent = rig.enqueue("c", priority=5)
    late = rig.enqueue("d", priority=-1)
    assert [(r.sequence, r.position) for r in first] == [(0, 0), (1, 1)]
    assert [(r.sequence, r.position) for r in urgent + late] == [(2, 0), (3, 3)]
    assert rig.meta.priorities == {0: 2, 5: 1, -1: 1}
    assert rig.points == ["enqueue"] * 3  # a fault point after each batch
    assert rig.broken() == []


def test_a_batch_over_the_depth_limit_is_refused_whole(store: Store) -> None:
    rig = Rig(store, max_queue_depth=2)
    rig.enqueue("a")
    refused = rig.enqueue("b", "c")
    assert isinstance(refused, QueueFullError)
    assert (refused.depth, refused.incoming) == (1, 2)
    assert rig.meta.pending == 1
    assert rig.broken() == []


def test_an_alarm_starts_the_highest_priority_event_and_a_second_is_stale(store: Store) -> None:
    rig = Rig(store)
    rig.enqueue("low")
    rig.enqueue("high", priority=9)
    meta = rig.meta
    rig.machine.rearm(meta, 0.0)
    due = meta.alarm
    key, record, attempt, started_at = rig.start(now=1.0)
    assert (due, record.event, attempt, started_at) == (0.0, pack("high"), 1, 1.0)
    assert (meta.running, meta.current, meta.alarm) == (True, key, None)
    assert rig.start(now=1.0) is None  # nothing is due while an attempt runs


def test_a_paused_instance_starts_nothing_and_its_alarm_is_cleared(store: Store) -> None:
    rig = Rig(store)
    rig.enqueue("a")
    fx = Effects()
    assert rig.machine.set_paused(rig.meta, True, 0.0, fx)
    assert not rig.machine.set_paused(rig.meta, True, 0.0, fx)
    assert (kinds(fx), rig.meta.alarm) == (["paused"], None)
    assert rig.start(now=0.0) is None


def test_retries_follow_the_policy_then_the_event_is_dead_lettered(store: Store) -> None:
    rig = Rig(store, retry=RetryPolicy(max_attempts=3, initial_delay=2, jitter=0))
    rig.enqueue("flaky")
    rig.machine.rearm(rig.meta, 0.0)
    rig.start(now=0.0)
    assert kinds(rig.fail(ValueError("boom"), now=1.0)) == ["retry_scheduled"]
    assert (rig.meta.retry_at, rig.meta.alarm) == (3.0, 3.0)
    assert rig.start(now=2.9) is None  # never early
    rig.start(now=3.0)
    rig.fail(ValueError("boom"), now=3.0)
    assert rig.meta.retry_at == 7.0  # 2 * 2
    rig.start(now=7.0)
    fx = rig.fail(ValueError("boom"), now=7.0)
    assert (kinds(fx), fx.empty) == (["dead_lettered"], 1)  # emptied after its event
    [dead] = fx.dead
    assert (dead.event, dead.attempts, dead.error) == ("flaky", 3, "ValueError: boom")
    assert (rig.meta.pending, rig.meta.dead_lettered, rig.meta.current) == (0, 1, None)
    assert rig.broken() == []


def test_permanent_errors_and_retry_after(store: Store) -> None:
    rig = Rig(store, retry=RetryPolicy(max_attempts=5))
    rig.enqueue("a", "b")
    rig.machine.rearm(rig.meta, 0.0)
    rig.start(now=0.0)
    rig.fail(RetryAfter(4.5), now=1.0)
    assert rig.meta.retry_at == 5.5
    rig.start(now=5.5)
    fx = rig.fail(PermanentError("no"), now=6.0)
    assert [dead.attempts for dead in fx.dead] == [2]
    assert rig.broken() == []


def test_success_stores_follow_ups_here_or_in_the_outbox(store: Store) -> None:
    rig = Rig(store, route=lambda key: 0 if key is None else 3)
    rig.enqueue("parent")
    rig.machine.rearm(rig.meta, 0.0)
    rig.start(now=0.0)
    here, there = Item(pack("here"), None, 0), Item(pack("there"), "k", 2)
    fx = rig.succeed(now=1.0, follow_ups=[(here, None), (there, None)])
    assert kinds(fx) == ["succeeded", "enqueued"]
    [(oseq, record)] = fx.deliveries
    assert (oseq, record.pool, record.target, record.link) == (0, "p", 3, 0)
    assert record.event == pack("there")
    assert (rig.meta.pending, rig.meta.outbox, rig.meta.links) == (1, 1, {"p:3": 1})
    assert fx.empty is None
    assert rig.broken() == []


def test_an_outcome_that_empties_the_queue_says_where_before_what_it_then_accepts(
    store: Store,
) -> None:
    """As the actor's outcome transaction takes the enqueues sent during the handler:
    the queue emptied after the success, before they were stored, so ``empty`` goes
    between (it went after them, and a reader saw an empty queue holding an event)."""
    rig = Rig(store)
    rig.enqueue("a")
    rig.machine.rearm(rig.meta, 0.0)
    key = rig.start(now=0.0)[0]
    items = (Item(pack("b"), None, 0),)

    def done_then_accept(txn: Txn, meta: Meta, fx: Effects) -> None:
        rig.machine.finish_attempt(meta)
        rig.machine.succeed(txn, meta, key, meta.attempt, [], 1.0, fx)
        rig.machine.accept(txn, meta, [("t", items)], 1.0, fx)
        rig.machine.rearm(meta, 1.0)

    fx = rig.step(done_then_accept)[1]
    assert (kinds(fx), fx.empty) == (["succeeded", "enqueued"], 1)
    assert rig.meta.pending == 1
    assert rig.broken() == []


class OtherPool:
    """A follow-up's target pool, as the machine sees one (``_followups.Target``)."""

    def __init__(self, name: str, route: Callable[[str | None], int]) -> None:
        self.name = name
        self.route = route
        self.prepare: Any = None  # the context's, not the machine's


def test_a_follow_up_into_another_pool_is_routed_by_its_router_into_the_outbox(
    store: Store,
) -> None:
    """Even one whose index in the other pool is this instance's own goes to the outbox."""
    rig = Rig(store, route=lambda key: 0)
    rig.enqueue("parent")
    rig.machine.rearm(rig.meta, 0.0)
    rig.start(now=0.0)
    b, c = OtherPool("b", lambda key: 0 if key is None else 2), OtherPool("c", lambda key: 1)
    ups: list[FollowUp] = [
        (Item(pack(0), None, 0), b),
        (Item(pack(1), "k", 7), b),
        (Item(pack(2), None, 0), None),  # this pool, this instance
        (Item(pack(3), "k", -1), b),
        (Item(pack(4), None, 0), c),
    ]
    fx = rig.succeed(now=1.0, follow_ups=ups)
    parked = [(oseq, r.pool, r.target, r.link, r.priority) for oseq, r in fx.deliveries]
    assert parked == [(0, "b", 0, 0, 0), (1, "b", 2, 0, 7), (2, "b", 2, 1, -1), (3, "c", 1, 0, 0)]
    assert rig.meta.links == {"b:0": 1, "b:2": 2, "c:1": 1}
    assert (rig.meta.pending, rig.meta.outbox) == (1, 4)
    assert rig.broken() == []


def test_recovery_counts_the_interrupted_attempt_and_resends_the_outbox(store: Store) -> None:
    rig = Rig(store)  # no retry policy: the interrupted attempt dead-letters the event
    rig.enqueue("a")
    rig.machine.rearm(rig.meta, 0.0)
    rig.start(now=0.0)
    record = OutboxRecord("p", 1, 0, pack("x"), 0.0, None, 0)
    rig.step(lambda txn, meta, fx: rig.machine.namespace.put_outbox(txn, 4, record))
    _, fx = rig.step(lambda txn, meta, fx: rig.machine.recover(txn, meta, 1, 2.0, fx))
    assert kinds(fx) == ["dead_lettered"]
    assert fx.dead[0].error == "DopoolError: instance crashed during attempt 1"
    assert fx.deliveries == [(4, record)]
    assert (rig.meta.restarts, rig.meta.running) == (1, False)


def test_recovery_dead_letters_a_damaged_started_event_unread(store: Store) -> None:
    rig = Rig(store, retry=RetryPolicy(max_attempts=3))
    rig.enqueue("a")
    rig.machine.rearm(rig.meta, 0.0)
    key, *_ = rig.start(now=0.0)
    rig.step(lambda txn, meta, fx: txn.put(key, b"damaged bytes"))
    _, fx = rig.step(lambda txn, meta, fx: rig.machine.recover(txn, meta, 1, 2.0, fx))
    [dead] = fx.dead
    assert (dead.damaged, dead.event, dead.attempts) == (True, b"damaged bytes", 1)
    assert rig.broken() == []


def test_a_failing_alarm_backs_off_doubling_and_capped_and_is_never_dropped(
    store: Store,
) -> None:
    rig = Rig(store, plan=FaultPlan(alarm_error=1.0))
    rig.enqueue("a")
    rig.machine.rearm(rig.meta, 0.0)
    now, gaps = 0.0, []
    for _ in range(8):
        assert rig.start(now=now) is None
        assert rig.meta.alarm is not None
        gaps.append(rig.meta.alarm - now)
        now = rig.meta.alarm
    assert gaps == [2.0, 4.0, 8.0, 16.0, 32.0, ALARM_RETRY_MAX, ALARM_RETRY_MAX, ALARM_RETRY_MAX]
    rig.machine.rearm(rig.meta, now - 1)  # a rearm keeps the failing alarm's backoff
    assert rig.meta.alarm == now


def stalled_rig(store: Store, retries: int = 6, **options: Any) -> tuple[Rig, float]:
    """A rig whose one pending event's alarm failed ``retries + 1`` times: given up."""
    rig = Rig(store, plan=FaultPlan(alarm_error=1.0), alarm_retries=retries, **options)
    rig.enqueue("a")
    now, gaps = 0.0, []
    for _ in range(retries):
        assert rig.start(now=now) is None
        assert rig.meta.alarm is not None
        gaps.append(rig.meta.alarm - now)
        now = rig.meta.alarm
    assert gaps == [2.0 * 2**k for k in range(retries)]  # doubling, no 60 s cap
    started, fx = rig.step(lambda txn, meta, fx: rig.machine.take_alarm(txn, meta, now, fx))
    assert started is None
    assert (kinds(fx), rig.meta.alarm, rig.meta.alarm_failures) == (
        ["alarm_given_up"],
        None,
        retries + 1,
    )
    assert rig.broken() == []  # stalled: pending with no alarm is allowed, and only so
    return rig, now


def test_a_limited_alarm_doubles_uncapped_then_is_given_up(store: Store) -> None:
    rig, now = stalled_rig(store, 6)
    assert now == 126.0  # 2 + 4 + 8 + 16 + 32 + 64
    assert rig.start(now=now + 1000) is None  # no alarm: nothing is delivered
    rig.machine.rearm(rig.meta, now + 1000)  # a rearm is no write: still given up
    assert (rig.meta.alarm, rig.meta.alarm_failures) == (None, 7)
    rig.step(lambda txn, meta, fx: setattr(meta, "alarm_failures", 0))  # not marked given up
    assert rig.broken() == ["p:0: 1 pending events, no alarm set, and not stalled"]


def test_a_stall_survives_recovery_a_pause_and_a_refused_enqueue(store: Store) -> None:
    rig, now = stalled_rig(store, 2, max_queue_depth=1)
    rig.step(lambda txn, meta, fx: rig.machine.recover(txn, meta, 1, now, fx))
    assert (rig.meta.alarm, rig.meta.alarm_failures, rig.meta.restarts) == (None, 3, 1)
    assert isinstance(rig.enqueue("b", now=now), QueueFullError)  # nothing written
    assert (rig.meta.alarm, rig.meta.alarm_failures) == (None, 3)
    fx = Effects()
    assert rig.machine.set_paused(rig.meta, True, now, fx)
    assert (rig.meta.alarm, rig.meta.alarm_failures) == (None, 3)  # paused, and still stalled
    rig.step(lambda txn, meta, fx: rig.machine.control(txn, meta, Redrive(None), now, fx))  # none
    assert rig.meta.alarm_failures == 3
    assert rig.broken() == []
    assert rig.machine.set_paused(rig.meta, False, now + 5, fx)  # the resume wakes it
    assert (kinds(fx), rig.meta.alarm, rig.meta.alarm_failures) == (
        ["paused", "resumed"],
        now + 5,
        0,
    )


@pytest.mark.parametrize("write", ["enqueue", "deliver", "resume"])
def test_a_write_wakes_a_stalled_instance_with_a_fresh_budget(store: Store, write: str) -> None:
    rig, now = stalled_rig(store, 1)
    later = now + 10
    if write == "enqueue":
        rig.enqueue("b", now=later)
    elif write == "deliver":
        record = OutboxRecord("p", 0, 0, pack("b"), later, None, 0)

        def deliver(txn: Txn, meta: Meta, fx: Effects) -> None:
            rig.machine.deliver(txn, meta, "p", 1, record, later, fx)

        rig.step(deliver)
    else:
        fx = Effects()
        assert rig.machine.set_paused(rig.meta, False, later, fx)  # not paused: no event
        assert kinds(fx) == []
        rig.step(lambda txn, meta, fx: None)
    assert (rig.meta.alarm, rig.meta.alarm_failures) == (later, 0)
    assert rig.broken() == []
    assert rig.start(now=later) is None  # still failing: retried after 2 s again
    assert rig.meta.alarm == later + 2.0


def test_drain_ends_a_stall(store: Store) -> None:
    rig, now = stalled_rig(store, 0)
    count, _ = rig.step(lambda txn, meta, fx: rig.machine.drain(txn, meta, now, fx))
    assert (count, rig.meta.alarm, rig.meta.alarm_failures) == (1, None, 0)
    assert rig.broken() == []


def test_drain_redrive_and_purge(store: Store) -> None:
    rig = Rig(store)
    rig.enqueue("a", "b", "c")
    rig.machine.rearm(rig.meta, 0.0)
    rig.start(now=0.0)
    rig.fail(ValueError("x"), now=0.0)  # "a" dead-lettered
    count, fx = rig.step(lambda txn, meta, fx: rig.machine.drain(txn, meta, 1.0, fx))
    assert (count, kinds(fx), rig.meta.drained, rig.meta.alarm) == (2, ["drained"], 2, None)
    count, fx = rig.step(
        lambda txn, meta, fx: rig.machine.control(txn, meta, Redrive(None), 2.0, fx)
    )
    assert (count, rig.meta.pending, rig.meta.held_dead_letters, rig.meta.tail) == (1, 1, 0, 4)
    assert rig.broken() == []
    rig.start(now=2.0)
    rig.fail(ValueError("x"), now=2.0)
    purged, _ = rig.step(lambda txn, meta, fx: rig.machine.control(txn, meta, Purge(None), 0.0, fx))
    assert (purged, rig.meta.held_dead_letters, rig.meta.dead_lettered) == (1, 0, 2)


@pytest.mark.parametrize("outcome", ["succeed", "fail", "recover"])
def test_a_drain_under_a_running_attempt_keeps_its_event_for_the_outcome(
    store: Store, outcome: str
) -> None:
    """``dopool drain`` commits from another process while the owner runs a handler:
    the running event stays, and its outcome (or, the owner dead, recovery) settles it."""
    rig = Rig(store, retry=None)
    keyed = tuple(Item(pack(e), None, 3, None, f"key-{e}") for e in ("running", "b"))
    rig.step(lambda txn, meta, fx: rig.machine.accept(txn, meta, [("t", keyed)], 0.0, fx))
    rig.enqueue("c")
    rig.machine.rearm(rig.meta, 0.0)
    key, *_ = rig.start(now=0.0)
    count, fx = rig.step(lambda txn, meta, fx: rig.machine.drain(txn, meta, 1.0, fx))
    meta = rig.meta
    assert (count, kinds(fx), meta.drained, meta.pending) == (2, ["drained"], 2, 1)
    assert (meta.current, meta.running, meta.attempt, meta.priorities) == (key, True, 1, {3: 1})
    assert rig.broken() == []
    again = tuple(Item(pack(e), None, 3, None, f"key-{e}") for e in ("running", "b"))
    with store.read() as txn:  # the running event still holds its key; the drained, none
        assert list(Dedup("p", 0.0).resolve(txn, again, 1.0)) == [0]
    if outcome == "succeed":
        rig.succeed(now=2.0)
    elif outcome == "fail":
        rig.fail(ValueError("x"), now=2.0)  # no retry policy: dead-lettered
    else:
        rig.step(lambda txn, meta, fx: rig.machine.recover(txn, meta, 1, 2.0, fx))
    assert (meta.pending, meta.current, meta.succeeded + meta.dead_lettered) == (0, None, 1)
    assert meta.enqueued == meta.succeeded + meta.dead_lettered + meta.drained
    assert rig.broken() == []


def test_purge_deletes_only_the_wanted_sequences_still_stored(store: Store) -> None:
    rig = Rig(store)
    rig.enqueue("a", "b", "c")
    rig.machine.rearm(rig.meta, 0.0)
    for _ in range(3):
        rig.start(now=0.0)
        rig.fail(ValueError("x"), now=0.0)  # dead letters 0, 1, 2
    wanted = frozenset({0, 2, 7})  # 7 was never a dead letter
    purged, fx = rig.step(
        lambda txn, meta, fx: rig.machine.control(txn, meta, Purge(wanted), 0.0, fx)
    )
    assert (purged, rig.meta.held_dead_letters, rig.meta.dead_lettered) == (2, 1, 3)
    assert fx.events == []
    assert rig.broken() == []
    again, _ = rig.step(
        lambda txn, meta, fx: rig.machine.control(txn, meta, Purge(wanted), 0.0, fx)
    )
    assert (again, rig.meta.held_dead_letters) == (0, 1)


def test_deliveries_are_taken_once_in_link_order(store: Store) -> None:
    rig = Rig(store)

    def deliver(link: int, source_pool: str = "p") -> int:
        record = OutboxRecord("p", 0, link, pack(link), 0.0, None, 0)
        expected, _ = rig.step(
            lambda txn, meta, fx: rig.machine.deliver(txn, meta, source_pool, 7, record, 0.0, fx)
        )
        return int(expected)

    assert [deliver(0), deliver(0), deliver(2), deliver(1)] == [0, 1, 1, 1]
    assert rig.meta.pending == 2  # links 0 and 1; the duplicate and the early 2 are not stored
    # Instance 7 of another pool is another source: its links count from 0 of their own.
    assert [deliver(0, "other"), deliver(1, "other"), deliver(1, "other")] == [0, 1, 2]
    assert rig.meta.pending == 4
    assert rig.broken() == []


def test_the_first_damaged_event_is_set_aside_and_the_next_one_starts(store: Store) -> None:
    rig = Rig(store)
    rig.enqueue("a", "b")
    first = rig.machine.namespace.queue_key(0, 0, 0.0)
    rig.step(lambda txn, meta, fx: txn.put(first, seal_event(b"elsewhere", ("x", 0.0, None, 0))))
    rig.machine.rearm(rig.meta, 0.0)
    fx = Effects()
    with store.write() as txn:
        started = rig.machine.take_alarm(txn, rig.meta, 0.0, fx)
    assert started is not None
    assert started[1].event == pack("b")
    assert [(dead.sequence, dead.damaged) for dead in fx.dead] == [(0, True)]


def test_cancel_leaves_a_running_attempt_and_crashes_before_its_commit(store: Store) -> None:
    """A running event is not cancelled (its outcome settles it); a cancel's fault point
    comes after its writes, so a crash there rolls all of them back."""
    rig = Rig(store)
    rig.enqueue("running", "waiting")
    assert rig.start(0.0) is not None  # sequence 0 runs
    cancelled, fx = rig.step(lambda txn, meta, fx: rig.machine.cancel(txn, meta, 0, 0.0, fx))
    assert (cancelled, fx.events, rig.meta.running) == (False, [], True)
    rig.points.clear()
    cancelled, fx = rig.step(lambda txn, meta, fx: rig.machine.cancel(txn, meta, 1, 0.0, fx))
    assert cancelled
    assert [event.kind for event in fx.events] == ["cancelled"]
    assert rig.points == ["cancel"]  # after the writes, before the commit
    assert (rig.meta.pending, rig.meta.cancelled) == (1, 1)
