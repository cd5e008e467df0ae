"""The runtime's timer of evicted instances' alarms (``_engine/evicted.py``) under the real
clock: an instance started again with the pool's lock held never has the timer fire in
its own thread, which would start the next due instance and take that lock again."""

from __future__ import annotations

import threading
import time

from dopool._clock.clocks import RealClock
from dopool._engine.evicted import EvictedAlarms

TIMEOUT = 10.0


class _Pool:
    """A pool's cells as the timer sees them: ``ready`` takes the pool's lock, as
    ``Cells.ready`` does."""

    name = "p"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[tuple[int, bool, str]] = []
        self.done = threading.Event()

    def get(self, index: int) -> None:
        return None

    def ready(self, index: int) -> None:
        got = self.lock.acquire(timeout=1.0)  # the starting thread's own lock: never
        if got:
            self.lock.release()
        self.started.append((index, got, threading.current_thread().name))
        self.done.set()


def test_a_start_under_the_pools_lock_leaves_the_due_alarm_to_the_clocks_thread() -> None:
    clock = RealClock()
    pool = _Pool()
    alarms = EvictedAlarms(clock, lambda name: pool)  # type: ignore[arg-type,return-value]
    past = time.time() - 1.0
    # Instance 0 and 1 evicted with alarms due; the timer is set for 0's, the earlier.
    alarms._due = {("p", 0): past, ("p", 1): past + 0.5}
    alarms._heap = [(past, "p", 0), (past + 0.5, "p", 1)]
    alarms._at = past
    try:
        with pool.lock:  # Cells._activate: starting instance 0, the pool's lock held
            alarms.started("p", 0)
        assert pool.done.wait(TIMEOUT)
        assert pool.started == [(1, True, "dopool-clock")]
    finally:
        alarms.close()
        clock.close()


def test_an_alarm_noted_due_is_left_to_the_clocks_thread_so_no_start_waits_on_another() -> None:
    """An instance evicted with its alarm due (``note``) while another thread starts an
    instance under the pool's lock (``started``, which takes the timer's telling lock):
    fired in the noting thread, the due alarm's start would wait for the pool's lock
    while holding the telling lock the other waits for (found by the multi-process chaos
    mode's seed 17, every actor of a worker stuck)."""
    clock = RealClock()
    pool = _Pool()
    alarms = EvictedAlarms(clock, lambda name: pool)  # type: ignore[arg-type,return-value]
    past = time.time() - 1.0
    alarms._due = {("p", 0): past}  # instance 0, starting in the other thread
    noted = threading.Event()

    def evict() -> None:  # an actor of instance 1, evicted with its alarm due
        alarms.note("p", 1, past)
        noted.set()

    try:
        with pool.lock:
            evicting = threading.Thread(target=evict)
            evicting.start()
            assert noted.wait(TIMEOUT)  # not stuck starting 1 in this thread
            alarms.started("p", 0)
        evicting.join(TIMEOUT)
        assert pool.done.wait(TIMEOUT)
        assert pool.started == [(1, True, "dopool-clock")]
    finally:
        alarms.close()
        clock.close()
