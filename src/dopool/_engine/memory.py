"""What one instance keeps in memory between messages, for whichever thread acts for it."""

from __future__ import annotations

from collections.abc import Callable

from dopool._clock.latch import Latch
from dopool._clock.turn import Turn
from dopool._machine.types import Started
from dopool._store.layout import Meta


class _Untold:
    """The clock's view of an alarm slot is unknown (after a restart): tell it again."""

    __slots__ = ()


UNTOLD = _Untold()


class InstanceMemory:
    """What one instance keeps in memory for whichever thread acts for it next.

    Its actor and the callers that enqueue directly (``DirectEnqueue``) share it.
    Only the holder of the :attr:`turn` touches the rest; none of it is needed
    for correctness, and a crash forgets it (:meth:`forget`).
    """

    __slots__ = (
        "handed_off",
        "last_active",
        "meta",
        "raw",
        "told_alarm",
        "told_recurring",
        "turn",
        "woken",
    )

    def __init__(self, waiter: Callable[[], Latch] | None = None) -> None:
        # The right to act on the namespace: one thing at a time. Its waiters wait on
        # latches from ``waiter`` (the clock backend's: see ``Backend.waiter``).
        self.turn = Turn(waiter)
        # The meta as the instance's last commit left it, if known (see
        # ``InstanceShell._load_meta``).
        self.meta: Meta | None = None
        # The meta record's stored bytes as the instance's last transaction left them
        # (read or written), None if unknown: a transaction uses ``meta`` only if the
        # store still holds these, as another process may have written it since
        # (``dopool.connect``); the runtime's watcher wakes an instance whose differ.
        self.raw: bytes | None = None
        # The runtime's watcher sent an alarm that the actor has not begun to handle: its
        # transaction will read whatever producers committed before it (``_engine/wakeups.py``).
        self.woken = False
        self.told_alarm: float | _Untold | None = None  # what the clock was last told
        self.told_recurring = False  # and whether it was only a schedule's next fire
        self.handed_off: Started | None = None  # an attempt a caller started, for the actor
        # The clock time the instance last handled something (a message, a direct call): its
        # idle timer evicts it ``idle_timeout`` after that.
        self.last_active = 0.0

    def forget(self) -> None:
        """The instance crashed: its successor starts from the store and settles the attempt."""
        self.meta = None
        self.raw = None
        self.woken = False  # the alarm it had in hand, if any, goes to the successor
        self.handed_off = None

    def take_handed_off(self) -> Started | None:
        """The attempt a caller started, if any."""
        started, self.handed_off = self.handed_off, None
        return started
