"""Healthy workers keep their leases while another process holds the store's writer lock.

A process frozen while it writes (SIGSTOP, a debugger, a cgroup freezer) stops every
writer, lease renewals included; leases expire by the host's lease clock, which does not
run while the lock is stalled (``dopool._store.leaseclock``), so when the lock comes free no
worker takes another's instances over. Two ``Runtime(path, shared=True)`` in this
process stand for two worker processes, as in ``tests/handles/test_shared_runtime.py``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from dopool import Runtime
from dopool._store.layout import LeaseRecord, Namespace, all_leases
from worker_support import WAIT, Ran, until
from writer_lock_support import frozen_writer, held

# Real processes and real time: run on CI's first Python only (.ci/run).
pytestmark = pytest.mark.slow

TTL = 0.6  # renewed every 0.2 s
STALL = 5 * TTL  # how long the writer lock is held elsewhere


HOLDERS: dict[str, Callable[[Path], AbstractContextManager[object]]] = {
    "another program's flock": held,
    "a frozen dopool writer": frozen_writer,
    "a frozen dopool writer, then killed": lambda store: frozen_writer(store, killed=True),
}


def _leases(runtime: Runtime) -> dict[int, LeaseRecord]:
    with runtime._store.read() as txn:
        return {index: record for _, index, record in all_leases(txn)}


@contextmanager
def two_workers(store: Path) -> Iterator[Runtime]:
    """Two shared workers on pool ``jobs`` of 4 instances, once each holds 2: the first."""
    ran = Ran()
    runtimes: list[Runtime] = []
    try:
        for who in ("a", "b"):
            runtime = Runtime(store, shared=True, lease_ttl=TTL, poll_interval=0.05)
            runtimes.append(runtime)
            runtime.define("jobs", execute=ran.handler(who), concurrency=4)
        first = runtimes[0]
        until(
            lambda: sorted(Counter(r.owner for r in _leases(first).values()).values()) == [2, 2],
            "a fair split",
        )
        yield first
    finally:
        for runtime in runtimes:
            runtime.close()


@pytest.mark.threaded
@pytest.mark.parametrize("holder", list(HOLDERS))
def test_workers_keep_their_leases_while_the_writer_lock_is_held_elsewhere(
    store_path: Path, holder: str, caplog: pytest.LogCaptureFixture
) -> None:
    with two_workers(store_path) as a:
        before = {index: (r.owner, r.epoch) for index, r in _leases(a).items()}
        with caplog.at_level(logging.WARNING, logger="dopool"), HOLDERS[holder](store_path):
            time.sleep(STALL)  # real-time: the writer lock is held elsewhere this long
        released = max(r.expires_at for r in _leases(a).values())
        # Two renewals of every lease after the lock came free, then nothing moved.
        until(
            lambda: min(r.expires_at for r in _leases(a).values()) > released + 2 * TTL / 3,
            "renewals after the stall",
        )
        after = {index: (r.owner, r.epoch) for index, r in _leases(a).items()}
        assert after == before
        with a._store.read() as txn:
            assert [Namespace("jobs", i).load_meta(txn).restarts for i in range(4)] == [0] * 4
        assert "taken over" not in caplog.text


@pytest.mark.threaded
def test_a_dead_workers_leases_still_expire_after_a_stall(store_path: Path) -> None:
    """The stall stops the clock only while the lock is held: a worker that stopped
    renewing loses its instances once ``ttl`` of free time has passed."""
    ran = Ran()
    a = Runtime(store_path, shared=True, lease_ttl=TTL, poll_interval=0.05)
    a.define("jobs", execute=ran.handler("a"), concurrency=4)
    keeper = a._keeper
    assert keeper is not None
    keeper._stop.set()  # a renews no more, as a hung worker would
    keeper._thread.join()
    b = Runtime(store_path, shared=True, lease_ttl=TTL, poll_interval=0.05)
    try:
        b.define("jobs", execute=ran.handler("b"), concurrency=4)
        with held(store_path):
            time.sleep(STALL)  # real-time: a stall first
        owner = b._keeper.book.worker.owner if b._keeper else ""
        until(lambda: {r.owner for r in _leases(b).values()} == {owner}, "b taking a's over")
        assert {r.epoch for r in _leases(b).values()} == {2}
    finally:
        b.close()
        a.close(timeout=WAIT)


@pytest.mark.threaded
def test_a_step_of_the_wall_clock_expires_no_lease(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NTP or an operator steps the wall clock an hour ahead: leases expire by the lease
    clock, which follows the monotonic clock, so no live worker's lease is taken over."""
    with two_workers(store_path) as a:
        before = {index: (r.owner, r.epoch) for index, r in _leases(a).items()}
        last = max(r.expires_at for r in _leases(a).values())
        wall = time.time
        with caplog.at_level(logging.WARNING, logger="dopool"):
            monkeypatch.setattr(time, "time", lambda: wall() + 3600.0)
            until(
                lambda: min(r.expires_at for r in _leases(a).values()) > last + TTL,
                "renewals after the step",
            )
        assert {index: (r.owner, r.epoch) for index, r in _leases(a).items()} == before
        monkeypatch.undo()  # before the runtimes close: their exit reads the wall clock
        assert "taken over" not in caplog.text
