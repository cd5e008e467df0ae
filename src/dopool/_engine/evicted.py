"""One timer per runtime for the alarms of its evicted instances.

A running instance tells the clock of its own alarm slot. An evicted one has no actor to
do so: its alarm stays in the store (and in the store-wide alarm index, written in the
same transaction that set it). When an instance is evicted with its alarm set, its actor
tells :class:`EvictedAlarms` when that alarm is due; the runtime keeps one clock alarm at
the earliest of those, and when it fires, starts every evicted instance whose alarm is due
(its recovery re-arms that alarm, which fires at once), or puts it in line for a slot
(:mod:`dopool._engine.slots`). An instance started again before
then (a message for it) is forgotten here, so the clock is never driven to a time at
which nothing is due: a simulated run's virtual time moves as it would without evictions.

It keeps a few numbers per evicted instance with an alarm set (one that waits for a
delayed event or a retry), none per idle one. An alarm another process sets on an evicted
instance (a producer's delayed enqueue) is not told here: the producer's wake-up, or the
store's poll, starts the instance (:mod:`dopool._engine.wakeups`).
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable

from dopool._clock.clocks import Clock
from dopool._engine.cells import Cells

logger = logging.getLogger("dopool")

Where = tuple[str, int]  # a pool's name, an instance's index

#: Seconds of the runtime's clock after which a start that failed is tried again.
RETRY_START = 1.0


class EvictedAlarms:
    """The runtime's timer for its evicted instances' alarms (see the module docstring).

    Args:
        clock: the runtime's clock, which fires it.
        pools: a defined pool's instances by name (None for a pool not defined here).
    """

    order = ("", 0)  # fired before any instance's alarm due at the same time

    def __init__(self, clock: Clock, pools: Callable[[str], Cells | None]) -> None:
        self._clock = clock
        self._pools = pools
        self._lock = threading.Lock()
        # Held while the clock is told: the last to tell it tells it the latest. Re-entered
        # when a real clock fires at once, from inside ``set_alarm``.
        self._telling = threading.RLock()
        self._due: dict[Where, float] = {}  # each evicted instance with an alarm: when
        self._heap: list[tuple[float, str, int]] = []  # the same, earliest first (some stale)
        self._at: float | None = None  # when the clock fires this; None: not set
        self._closed = False

    def note(self, pool: str, index: int, due: float | None) -> None:
        """Instance ``index`` of ``pool``, not running, has its alarm due at ``due`` (evicted
        with it set, or set by a caller's call made in the store); None: no alarm, any
        noted before is forgotten."""
        with self._lock:
            if self._closed:
                return
            if due is None:
                if self._due.pop((pool, index), None) is None:
                    return
            else:
                self._due[pool, index] = due
                heapq.heappush(self._heap, (due, pool, index))
        self._tell()

    def started(self, pool: str, index: int) -> None:
        """Instance ``index`` of ``pool`` runs again: its own actor tells the clock now.

        Called with the pool's lock held (:meth:`Cells._activate`), so the timer is set
        for the next alarm without firing it here: a real clock fires an alarm already
        due in the calling thread, and that would start its instance
        (:meth:`Cells.ready`), which takes the lock this thread holds."""
        if (pool, index) not in self._due:  # (the common case, without the lock)
            return
        with self._lock:
            if self._due.pop((pool, index), None) is None:
                return
        self._tell()

    def fire_alarm(self) -> None:
        """Start the evicted instances whose alarm is due; set the timer for the next."""
        now = self._clock.now()
        due: list[Where] = []
        with self._lock:
            self._at = None  # fired
            heap = self._heap
            while heap and heap[0][0] <= now:
                at, pool, index = heapq.heappop(heap)
                if self._due.get((pool, index)) == at:
                    del self._due[pool, index]
                    due.append((pool, index))
        try:
            for pool, index in due:  # in due time order, then by pool and index
                cells = self._pools(pool)
                if cells is not None and cells.get(index) is None:
                    self._start(cells, index, now)
        finally:
            self._tell()  # whatever a start did, the timer is set for the next

    def _start(self, cells: Cells, index: int, now: float) -> None:
        """Start an evicted instance whose alarm is due: its recovery re-arms its alarm, due
        now. One that cannot start now (no thread left for it, say) is noted again for
        ``RETRY_START`` seconds later, and the others start meanwhile."""
        try:
            cells.ready(index)  # (in line, if the runtime's slots are all taken)
        except Exception:
            logger.exception(
                "could not start instance %s:%d for its alarm; trying again in %g s",
                cells.name,
                index,
                RETRY_START,
            )
            with self._lock:
                if not self._closed and (cells.name, index) not in self._due:
                    self._due[cells.name, index] = at = now + RETRY_START
                    heapq.heappush(self._heap, (at, cells.name, index))

    def close(self) -> None:
        """The runtime is closing: fire no more."""
        with self._lock:
            self._closed = True
            self._due.clear()
            self._heap.clear()
            self._at = None
        self._clock.set_alarm(self, None)

    def _next(self) -> float | None:
        """The earliest alarm still noted (stale heap entries dropped); with the lock."""
        heap, noted = self._heap, self._due
        while heap and noted.get((heap[0][1], heap[0][2])) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _tell(self) -> None:
        """Have the clock fire at the earliest alarm noted (not at all if none), unless it
        already does; never in this thread (``here=False``, :meth:`Clock.set_alarm`): a
        real clock would fire one already due here, whose start (:meth:`Cells.ready`) takes
        the pool's lock while this one holds ``_telling``, which a start under the pool's
        lock (:meth:`started`) waits for: two threads each holding what the other needs."""
        with self._telling:
            with self._lock:
                at = None if self._closed else self._next()
                if at == self._at:
                    return
                self._at = at
            self._clock.set_alarm(self, at, here=False)
