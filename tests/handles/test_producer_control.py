"""A producer's pause, resume, drain and cancel (``ProducerPool``) beside a live owner.

An exclusive runtime on the real clock owns the store, with a poll that never comes
(``poll_interval=3600``): only the producer's wake-ups make the owner act on its
changes. Nothing sleeps to wait: the tests wait on events, pool events and ``join``,
with timeouts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dopool
from cli_support import invoke
from dopool import (
    ConfigurationError,
    EventContext,
    EventIdError,
    PoolClosedError,
    PoolEvent,
    RetryPolicy,
    Runtime,
)

TIMEOUT = 60.0


class Handler:
    """Records the events run; an event with ``gate`` blocks until released, one with
    ``fail`` raises on its first attempt."""

    def __init__(self) -> None:
        self.ran: list[int] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self._cond = threading.Condition()

    def __call__(self, ctx: EventContext) -> None:
        event: dict[str, Any] = ctx.event
        if event.get("gate"):
            self.started.set()
            assert self.release.wait(TIMEOUT)
        if event.get("fail") and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        with self._cond:
            self.ran.append(event["n"])
            self._cond.notify_all()

    def wait_ran(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: n in self.ran, TIMEOUT), (n, self.ran)


class Seen:
    """The owner's pool events of one kind, waited on."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.events: list[PoolEvent] = []
        self._cond = threading.Condition()

    def __call__(self, event: PoolEvent) -> None:
        if event.kind == self.kind:
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()

    def wait(self, count: int = 1) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.events) >= count, TIMEOUT)


@pytest.fixture
def handler() -> Handler:
    return Handler()


@pytest.fixture
def runtime(store_path: Path) -> Iterator[Runtime]:
    with Runtime(store_path, poll_interval=3600) as owner:
        assert owner._watcher is not None
        assert owner._watcher.listening
        yield owner


@pytest.fixture
def connection(store_path: Path, runtime: Runtime) -> Iterator[dopool.Connection]:
    with dopool.connect(store_path) as opened:
        yield opened


def _checked(store: Path) -> None:
    result = invoke("check", str(store))
    assert result.exit_code == 0, result.output


def test_a_producer_pauses_drains_and_resumes_a_live_pool(
    store_path: Path, runtime: Runtime, connection: dopool.Connection, handler: Handler
) -> None:
    """Paused, nothing starts (the drain finds every event pending); the resume's
    wake-up alone starts what was enqueued after."""
    pool = runtime.define("jobs", execute=handler, concurrency=2)
    jobs = connection.pool("jobs")
    jobs.pause()  # the pool as a whole: its instances, never used, start paused
    status = pool.status()
    assert (status.paused, status.instances) == (True, [])
    assert [status.instance(i).state for i in range(2)] == ["paused", "paused"]
    jobs.enqueue_many([{"n": n} for n in range(4)])
    assert jobs.drain(1) == 2
    assert jobs.drain() == 2
    assert jobs.drain() == 0
    jobs.enqueue_many([{"n": n} for n in (4, 5)])
    jobs.resume(0)
    assert [i.state for i in jobs.status().instances][1] == "paused"
    jobs.resume()
    assert pool.join(TIMEOUT)
    assert sorted(handler.ran) == [4, 5]
    status = pool.status()
    counts = (status.enqueued, status.drained, status.succeeded, status.pending)
    assert counts == (6, 4, 2, 0)
    assert [i.state for i in status.instances] == ["idle", "idle"]


def test_a_producer_pause_stops_the_next_start_after_the_running_one(
    runtime: Runtime, connection: dopool.Connection, handler: Handler
) -> None:
    """The pause commits while a handler runs: its outcome starts nothing after it, and
    a drain keeps nothing running, so it finds the next one pending."""
    pool = runtime.define("jobs", execute=handler, concurrency=1)
    jobs = connection.pool("jobs")
    jobs.enqueue_many([{"n": 0, "gate": True}, {"n": 1}])
    assert handler.started.wait(TIMEOUT)
    jobs.pause()
    succeeded = Seen("succeeded")
    unsubscribe = runtime.subscribe(succeeded)
    handler.release.set()
    succeeded.wait()
    unsubscribe()
    assert jobs.drain() == 1
    jobs.resume()
    assert pool.join(TIMEOUT)
    assert handler.ran == [0]


def test_a_producer_control_call_checks_its_index_and_the_connection(
    store_path: Path, runtime: Runtime, handler: Handler
) -> None:
    runtime.define("jobs", execute=handler, concurrency=2)
    connection = dopool.connect(store_path)
    jobs = connection.pool("jobs")
    for bad in (2, -1, True, "0"):
        with pytest.raises(ConfigurationError, match="instance"):
            jobs.pause(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="instance"):
            jobs.drain(bad)  # type: ignore[arg-type]
    for bad_id in ("jobs:2:0", "other:0:0", "jobs:0", 7):
        with pytest.raises(EventIdError) as caught:
            jobs.cancel(bad_id)  # type: ignore[arg-type]
        assert caught.value.event_id == bad_id
    connection.close()
    for call in (jobs.pause, jobs.resume, jobs.drain):
        with pytest.raises(PoolClosedError):
            call()
    with pytest.raises(PoolClosedError):
        jobs.cancel("jobs:0:0")


def test_a_producer_cancels_pending_and_delayed_events_but_not_finished_ones(
    store_path: Path, runtime: Runtime, connection: dopool.Connection, handler: Handler
) -> None:
    """Counted in the owner's ``cancelled``; remembered for the owner's ``keep_finished``;
    the owner emits no ``cancelled`` event for them."""
    cancelled = Seen("cancelled")
    runtime.subscribe(cancelled)
    pool = runtime.define("jobs", execute=handler, concurrency=1, keep_finished=3600)
    jobs = connection.pool("jobs")
    jobs.pause()
    pending = jobs.enqueue({"n": 0})
    delayed = jobs.enqueue({"n": 1}, delay=3600)
    kept = jobs.enqueue({"n": 2})
    assert jobs.cancel(pending.event_id) is True
    assert jobs.cancel(pending.event_id) is False  # finished now
    assert jobs.cancel(delayed.event_id) is True
    assert jobs.cancel("jobs:0:99") is False  # never enqueued
    status = pool.status()
    assert (status.cancelled, status.pending, status.scheduled) == (2, 1, 0)
    for result in (pending, delayed):
        info = pool.event(result.event_id)
        assert info is not None
        assert info.state == "cancelled"
    jobs.resume()
    assert pool.join(TIMEOUT)
    assert handler.ran == [2]
    assert jobs.cancel(kept.event_id) is False
    assert pool.status().succeeded == 1
    assert cancelled.events == []  # made in the store, not by the owner's instance
    connection.close()
    runtime.close()
    _checked(store_path)


def test_a_cancel_forgotten_as_the_owner_keeps_nothing(
    runtime: Runtime, connection: dopool.Connection, handler: Handler
) -> None:
    pool = runtime.define("jobs", execute=handler, concurrency=1)  # keep_finished 0
    jobs = connection.pool("jobs")
    jobs.pause()
    result = jobs.enqueue({"n": 0})
    assert jobs.cancel(result.event_id)
    assert pool.event(result.event_id) is None
    assert pool.status().cancelled == 1


def test_a_producer_cancels_an_event_in_backoff_and_the_next_one_runs(
    store_path: Path, runtime: Runtime, connection: dopool.Connection, handler: Handler
) -> None:
    """Its backoff is an hour, the poll never comes: only the cancel's wake-up starts the
    event queued behind it."""
    retrying = Seen("retry_scheduled")
    runtime.subscribe(retrying)
    retry = RetryPolicy(max_attempts=3, initial_delay=3600, max_delay=3600, jitter=0)
    pool = runtime.define("jobs", execute=handler, concurrency=1, retry=retry)
    jobs = connection.pool("jobs")
    failing = jobs.enqueue({"n": 0, "fail": True})
    jobs.enqueue({"n": 1})
    retrying.wait()
    info = jobs.event(failing.event_id)
    assert info is not None
    assert info.state == "backoff"
    assert jobs.cancel(failing.event_id) is True
    handler.wait_ran(1)
    assert pool.join(TIMEOUT)
    assert handler.ran == [1]
    status = pool.status()
    assert (status.cancelled, status.succeeded, status.pending) == (1, 1, 0)
    connection.close()
    runtime.close()
    _checked(store_path)


def test_a_producer_cannot_cancel_a_running_event(
    runtime: Runtime, connection: dopool.Connection, handler: Handler
) -> None:
    pool = runtime.define("jobs", execute=handler, concurrency=1)
    jobs = connection.pool("jobs")
    running = jobs.enqueue({"n": 0, "gate": True})
    assert handler.started.wait(TIMEOUT)
    assert jobs.cancel(running.event_id) is False
    handler.release.set()
    assert pool.join(TIMEOUT)
    assert handler.ran == [0]
    assert (pool.status().cancelled, pool.status().succeeded) == (0, 1)


def test_a_cancelled_events_dedup_key_is_stamped_with_its_finish(
    runtime: Runtime, connection: dopool.Connection, handler: Handler
) -> None:
    """Released as the owner releases it: held for a window after the cancel (a handle
    given an hour's sees a duplicate), free again past it (the owner's window is 0)."""
    pool = runtime.define("jobs", execute=handler, concurrency=1)
    jobs = connection.pool("jobs")
    jobs.pause()
    first = jobs.enqueue({"n": 0}, dedup_key="k")
    assert jobs.enqueue({"n": 9}, dedup_key="k").duplicate
    assert jobs.cancel(first.event_id)
    # The handle's own window applies where the connection stores its call (an owner
    # taking it would apply its own): a connection that stores every call.
    with dopool.connect(connection.path, via_owner=False) as storing:
        held = storing.pool("jobs", dedup_window=3600).enqueue({"n": 9}, dedup_key="k")
    assert held.duplicate
    assert held.event_id == first.event_id
    again = pool.enqueue({"n": 1}, dedup_key="k")
    assert not again.duplicate
    jobs.resume()
    assert pool.join(TIMEOUT)
    assert handler.ran == [1]


def test_a_producer_cancelling_while_the_worker_runs_loses_and_doubles_nothing(
    store_path: Path, runtime: Runtime, connection: dopool.Connection, handler: Handler
) -> None:
    """Every event either ran or was cancelled, never both, and the counters agree."""
    pool = runtime.define("jobs", execute=handler, concurrency=2)
    jobs = connection.pool("jobs")
    results = jobs.enqueue_many([{"n": n} for n in range(60)])
    cancelled = {n for n, result in enumerate(results) if jobs.cancel(result.event_id)}
    assert pool.join(TIMEOUT)
    assert sorted(handler.ran) == sorted(set(range(60)) - cancelled)
    status = pool.status()
    assert (status.cancelled, status.succeeded, status.pending) == (
        len(cancelled),
        60 - len(cancelled),
        0,
    )
    connection.close()
    runtime.close()
    _checked(store_path)


def test_a_producer_cancel_sweeps_nothing_the_owner_remembers(
    runtime: Runtime, connection: dopool.Connection, handler: Handler
) -> None:
    """The owner's ``keep_finished`` is not stored: a cancel from here must not judge the
    age of the finished events the owner remembers (a window of 0 would drop them all)."""
    pool = runtime.define("jobs", execute=handler, concurrency=1, keep_finished=3600)
    jobs = connection.pool("jobs")
    done = jobs.enqueue({"n": 0})
    assert pool.join(TIMEOUT)
    jobs.pause()
    assert jobs.cancel(jobs.enqueue({"n": 1}).event_id)
    info = pool.event(done.event_id)
    assert info is not None
    assert info.state == "succeeded"


def test_a_producer_redrives_dead_letters_and_the_live_owner_runs_them(
    runtime: Runtime, connection: dopool.Connection
) -> None:
    """The producer's write alone (no poll comes) wakes the owner, which runs the
    redriven events at once: those chosen by filter, instance or record, and no other."""
    fixed = threading.Event()  # the handler's bug is fixed: nothing fails any more
    ran: list[Any] = []
    ran_cond = threading.Condition()

    def execute(ctx: EventContext) -> None:
        if not fixed.is_set():
            raise (KeyError if ctx.event["n"] % 2 else ValueError)(ctx.event["n"])
        with ran_cond:
            ran.append(ctx.event["n"])
            ran_cond.notify_all()

    pool = runtime.define("jobs", execute=execute, concurrency=2)
    jobs = connection.pool("jobs")
    jobs.enqueue_many([{"n": n} for n in range(6)])
    assert pool.join(TIMEOUT)
    assert jobs.status().dead_lettered == 6
    fixed.set()

    def ran_now(expected: set[int]) -> None:
        with ran_cond:
            assert ran_cond.wait_for(lambda: expected <= set(ran), TIMEOUT), ran

    assert jobs.redrive(error="KeyError") == 3  # n = 1, 3, 5
    ran_now({1, 3, 5})
    first, second, third = jobs.dead_letters()  # n = 0, 2, 4: all on one instance
    assert jobs.redrive([first]) == 1
    ran_now({1, 3, 5, first.event["n"]})
    other = 1 - first.instance_index  # (round-robin starts anywhere: either instance)
    assert jobs.purge_dead_letters(index=other) == 0
    assert jobs.purge_dead_letters(index=first.instance_index, error="ValueError: 4") == 1
    assert [letter.event["n"] for letter in jobs.dead_letters()] == [2]
    assert jobs.purge_dead_letters() == 1
    assert jobs.dead_letters() == []
    assert pool.join(TIMEOUT)
    assert sorted(ran) == [0, 1, 3, 5]  # nothing run twice, nothing purged run
    assert (second.event["n"], third.event["n"]) == (2, 4)
    status = pool.status()
    assert (status.succeeded, status.pending, status.dead_lettered) == (4, 0, 6)
    assert jobs.redrive() == jobs.purge_dead_letters() == 0
    with pytest.raises(ConfigurationError, match="no instance 2"):
        jobs.redrive(index=2)
