"""Quiescence: how many messages each actor has in hand, and who is asleep.

A simulated clock fires its next item only when the system is quiescent; ``join``
waits for actors to go idle. Under the threads backend both wait on a condition;
under a backend that runs the actors itself (greenlets), they run the actors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Set

from dopool._clock.threads import Backend, Runner


def activity_for(backend: Backend) -> Activity:
    """The activity count a clock with ``backend`` keeps: locked for threads, plain for
    a backend that runs every actor on one thread (nothing there can race)."""
    runner = backend.runner
    return Activity() if runner is None else DrivenActivity(runner)


class Activity:
    """Counts the messages each actor has been sent and not finished handling.

    An actor is *active* while it has such messages and is not asleep in
    ``ctx.sleep``; the system is quiescent when no actor is active. Each actor
    that finishes its last message or falls asleep bumps ``generation`` and
    wakes the waiters. Nothing they wait for changes otherwise: waking them for
    every message would have ``join`` read the store once per message, only to
    find the actor still busy.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[Hashable, int] = {}
        self._sleeping: set[Hashable] = set()
        self._active = 0
        self.generation = 0
        # A backend that runs the actors itself is driven instead of waited for.
        self._runner: Runner | None = None

    def sent(self, key: Hashable) -> None:
        with self._cond:
            count = self._pending.get(key, 0)
            self._pending[key] = count + 1
            if count == 0 and key not in self._sleeping:
                self._active += 1

    def done(self, key: Hashable, count: int = 1) -> None:
        """``key`` finished ``count`` of its messages."""
        with self._cond:
            remaining = self._pending[key] - count
            if remaining:
                self._pending[key] = remaining
                return
            del self._pending[key]
            if key not in self._sleeping:
                self._active -= 1
            self.generation += 1
            self._cond.notify_all()

    def sleep_begin(self, key: Hashable) -> None:
        with self._cond:
            self._sleeping.add(key)
            if self._pending.get(key, 0):
                self._active -= 1
            self.generation += 1
            self._cond.notify_all()

    def sleep_end(self, key: Hashable) -> None:
        with self._cond:
            self._sleeping.discard(key)
            if self._pending.get(key, 0):
                self._active += 1

    def busy(self, keys: Set[Hashable]) -> bool:
        """Whether any of ``keys`` has unfinished messages (sleeping counts as busy).

        It looks at the fewer of the two: ``keys``, or the actors with messages in hand
        (a pool of thousands of instances, a few of them busy, costs a few lookups).
        """
        with self._cond:
            pending = self._pending
            if len(keys) <= len(pending):
                return any(key in pending for key in keys)
            return any(key in keys for key in pending)

    def wait_quiet(self, timeout: float | None = None) -> bool:
        """Block until no actor is active; False if ``timeout`` (wall seconds) ran out.

        A backend that runs the actors itself runs them instead, until none can
        run: its quiescence. An actor may still be active then, waiting for an
        answer that virtual time must bring (from an instance asleep in
        ``ctx.sleep``), or for ever (a deadlock: see :meth:`stalled`).
        """
        runner = self._runner
        if runner is not None:
            try:
                runner.drive(None, "quiescence", _deadline(timeout))
            except TimeoutError:
                return False
            return True
        with self._cond:
            return self._cond.wait_for(self.quiet, timeout)

    def quiet(self) -> bool:
        """Whether no actor is active."""
        return self._active == 0

    def stalled(self, timeout: float | None) -> None:
        """Under a backend that runs the actors, with none able to run and nothing
        scheduled: raise if some are still active, for they wait for each other.

        Raises:
            TimeoutError: so, and a ``timeout`` was given (no wall time can help).
            SimulationStalledError: so, and none was.
        """
        runner = self._runner
        if runner is None or self._active == 0:
            return
        if timeout is not None:
            raise TimeoutError("the instances wait for each other, and nothing is scheduled")
        raise runner.stalled("nothing is scheduled, yet instances wait: a deadlock")

    def asleep(self) -> list[Hashable]:
        """The actors asleep in virtual time (or waiting for a restart), in a stable order."""
        with self._cond:
            return sorted(self._sleeping, key=str)

    def wake(self) -> None:
        """Wake every waiter as if an actor had gone idle: the runtime closed, and a
        ``join`` waiting for its actors must see that rather than wait for ever."""
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait_change(self, generation: int, timeout: float | None) -> bool:
        """Block until an actor goes idle or asleep after ``generation`` was read."""
        runner = self._runner
        if runner is not None:
            try:
                return runner.drive(
                    lambda: self.generation != generation, "an actor to go idle", _deadline(timeout)
                )
            except TimeoutError:
                return False
        with self._cond:
            return self._cond.wait_for(lambda: self.generation != generation, timeout)


class DrivenActivity(Activity):
    """The activity count under a backend that runs every actor on the driving thread.

    The same counts, kept without the condition: every actor and caller runs on
    one thread and nobody blocks on it (waiting runs the actors instead), and
    this is touched several times per event.
    """

    def __init__(self, runner: Runner) -> None:
        super().__init__()
        self._runner = runner

    def sent(self, key: Hashable) -> None:
        pending = self._pending
        count = pending.get(key, 0)
        pending[key] = count + 1
        if count == 0 and key not in self._sleeping:
            self._active += 1

    def done(self, key: Hashable, count: int = 1) -> None:
        pending = self._pending
        remaining = pending[key] - count
        if remaining:
            pending[key] = remaining
            return
        del pending[key]
        if key not in self._sleeping:
            self._active -= 1
        self.generation += 1

    def sleep_begin(self, key: Hashable) -> None:
        self._sleeping.add(key)
        if key in self._pending:
            self._active -= 1
        self.generation += 1

    def sleep_end(self, key: Hashable) -> None:
        self._sleeping.discard(key)
        if key in self._pending:
            self._active += 1


def _deadline(timeout: float | None) -> float | None:
    """A wait of ``timeout`` seconds from now as a ``time.monotonic()`` deadline."""
    return None if timeout is None else time.monotonic() + timeout
