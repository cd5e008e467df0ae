"""At most ``max_active`` instance actors at once in a runtime; the rest wait their turn.

Each actor of an instance started on demand holds one of the runtime's slots, from its
start until, evicted, its thread has stopped (a crash and its restart keep it). An instance that has
something to do while every slot is taken waits in one FIFO, in the order it became
ready, as ``(pool, index)``: nothing else of it is kept in memory, since the store holds
what it has to do (an enqueue for it is stored from the caller's thread,
:mod:`dopool._engine.stored`). When an actor is evicted its slot goes to the first in
line, whose actor starts and recovers from its namespace as after any eviction.

While any wait, the slots are *crowded*: an idle actor is evicted at once rather than
after its pool's ``idle_timeout`` (those idle when the crowding begins are asked to), and
a busy one yields its slot after each message, going to the back of the line if it still
has work (``InstanceActor._yield_slot``). So the line moves however long the instances
ahead of it stay busy, and no instance waits for a slot held by one that waits for it
(a follow-up to a waiting instance is kept for it; its sender may yield meanwhile).

``limit=None`` keeps no count and no line: every instance starts when first needed (a
simulated clock's default, where an actor is a greenlet).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from dopool._clock.clocks import Clock
from dopool._errors import ConfigurationError, shown

logger = logging.getLogger("dopool")

Where = tuple[str, int]  # a pool's name, an instance's index

#: The default ``max_active`` under a real clock: see docs/api.md, "Runtime".
DEFAULT_MAX_ACTIVE = 1024
#: Seconds of the runtime's clock after which a start that failed is tried again.
RETRY_START = 1.0


def check_max_active(value: object) -> None:
    """Refuse a ``max_active`` that is not None or an int of at least 1."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"max_active must be an int of at least 1 or None, got {shown(value)}"
        )


class Idle(Protocol):
    """An actor idle in its slot, which can be asked to give it up."""

    def fire_alarm(self) -> None: ...


class Slots:
    """A runtime's slots for instance actors, and the line of instances waiting for one.

    Args:
        limit: the most actors at once; None for no bound (then nothing waits).
        clock: the runtime's clock, which retries a start that failed.
        start: ``start(pool, index)`` starts a waiting instance in the slot it was given
            (``Cells.grant``); it returns False if it did not need the slot after all.
    """

    order = ("", 1)  # its retry fires after the evicted instances' timer, before any alarm

    def __init__(self, limit: int | None, clock: Clock, start: Callable[[str, int], bool]) -> None:
        self.limit = limit
        self._clock = clock
        self._start = start
        self._lock = threading.Lock()
        self._active = 0
        self._line: dict[Where, None] = {}  # the instances waiting, first in line first
        self._per_pool: Counter[str] = Counter()  # how many of each pool wait
        # Actors idle in their slots, by instance: asked to go when the crowding begins.
        # (Set and removed by each actor without the lock: one dict operation each.)
        self.idle: dict[Where, Idle] = {}
        self._retrying = False  # a failed start's retry is set on the clock
        self._closed = False

    @property
    def crowded(self) -> bool:
        """Whether an instance waits for a slot (read without the lock: a hint)."""
        return bool(self._line)

    @property
    def free(self) -> bool:
        """Whether an instance starting now would get a slot (read without the lock)."""
        limit = self.limit
        return limit is None or (not self._line and self._active < limit)

    def waiting(self, pool: str | None = None) -> int:
        """How many instances wait for a slot (of ``pool``, if given)."""
        with self._lock:
            return len(self._line) if pool is None else self._per_pool[pool]

    def take(self) -> bool:
        """Take a free slot for an instance starting now, unless others wait for one (they
        go first) or none is free."""
        if self.limit is None:
            return True
        with self._lock:
            if self._line or self._active >= self.limit or self._closed:
                return False
            self._active += 1
            return True

    def wait(self, pool: str, index: int) -> None:
        """Put instance ``index`` of ``pool`` in line for a slot (if it is not already).
        The first to wait asks every idle actor to give its slot up."""
        with self._lock:
            if self._closed or (pool, index) in self._line:
                return
            first = not self._line
            self._line[pool, index] = None
            self._per_pool[pool] += 1
            # A slot freed between the caller's ``take`` and now: nobody else will hand it on.
            free = self.limit is not None and self._active < self.limit
        if free:
            self._hand_on()
        elif first:
            for actor in list(self.idle.values()):  # (each checks again, and may stay)
                actor.fire_alarm()

    def give_back(self) -> None:
        """An evicted actor stopped (or one never started): its slot goes to the first in
        line."""
        if self.limit is None:
            return
        with self._lock:
            self._active -= 1
        self._hand_on()

    def _hand_on(self) -> None:
        """Start instances from the front of the line while slots are free. A start that
        fails (no thread left, say) puts its instance back at the front, and the clock
        tries again ``RETRY_START`` seconds later."""
        while True:
            with self._lock:
                if self._closed or not self._line or self._active >= (self.limit or 0):
                    return
                pool, index = where = next(iter(self._line))
                del self._line[where]
                self._per_pool[pool] -= 1
                self._active += 1
            try:
                needed = self._start(pool, index)
            except Exception:
                logger.exception(
                    "could not start instance %s:%d; trying again in %g s", pool, index, RETRY_START
                )
                self._failed(where)
                return
            if not needed:
                with self._lock:
                    self._active -= 1

    def _failed(self, where: Where) -> None:
        with self._lock:
            self._active -= 1
            if self._closed:
                return
            self._line = {where: None, **self._line}  # back at the front
            self._per_pool[where[0]] += 1
            retry, self._retrying = not self._retrying, True
        if retry:
            self._clock.set_alarm(self, self._clock.now() + RETRY_START)

    def fire_alarm(self) -> None:
        """A failed start's retry."""
        with self._lock:
            self._retrying = False
        self._hand_on()

    def close(self) -> None:
        """The runtime is closing: nobody waits any more, and nothing starts."""
        with self._lock:
            self._closed = True
            self._line.clear()
            self._per_pool.clear()
            self.idle.clear()
            retrying, self._retrying = self._retrying, False
        if retrying:
            self._clock.set_alarm(self, None)
