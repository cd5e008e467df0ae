"""A first-come, first-served lock, for the places where waiting order matters."""

from __future__ import annotations

import threading

from dopool._clock.latch import Latch, Waiter


class Turn:
    """A first-come, first-served lock.

    An instance's turn is its right to act on its namespace: the actor holds it
    for each message, a caller for its enqueue (see ``DirectEnqueue``). The
    store's async writers take turns at LMDB's writer lock with one. Release
    hands it straight to the longest waiter, so no thread can take it twice
    while another waits. A waiter waits on a latch of its own, made by ``latch``
    (the clock backend's: see :meth:`dopool._clock.threads.Backend.latch`); by default
    a held lock, for OS threads.
    """

    __slots__ = ("_held", "_latch", "_lock", "_waiters")

    def __init__(self, latch: Waiter | None = None) -> None:
        self._lock = threading.Lock()
        self._held = False
        self._latch = latch
        # A list, not a deque: waiters are few, and an instance's turn, of which a run may
        # hold thousands, is mostly never waited for (an empty deque is 760 bytes).
        self._waiters: list[Latch] = []

    def acquire(self) -> None:
        with self._lock:
            if not self._held:
                self._held = True
                return
            if self._latch is None:
                handoff: Latch = threading.Lock()
                handoff.acquire()
            else:
                handoff = self._latch()
            self._waiters.append(handoff)
        handoff.acquire()  # released by the holder, which hands the turn over

    def try_acquire(self) -> bool:
        """Take the turn if nobody holds it; never waits."""
        with self._lock:
            if self._held:
                return False
            self._held = True
            return True

    def release(self) -> None:
        with self._lock:
            if self._waiters:
                self._waiters.pop(0).release()  # still held: now by the waiter
            else:
                self._held = False

    def contended(self) -> bool:
        """Whether someone waits for the turn."""
        return bool(self._waiters)

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.release()
