"""How the runner drives its SimulatedClock: settling sleeping handlers, bounded advances."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from dopool._clock.clocks import SimulatedClock

# Clock steps (alarms, wake-ups, deliveries) one advance or settle may take before the
# run is declared a livelock: a healthy scenario needs a few hundred at most.
STEP_BUDGET = 50_000


class _Stop(Exception):
    """The run cannot go on (the reason is a violation)."""


class ClockDriver:
    """Drives the run's clock so that no call waits on a sleeping handler; stops a livelock.

    Under a SimulatedClock a call such as ``enqueue`` or ``pause`` completes at once,
    except when its instance is inside a handler: a handler asleep in ``ctx.sleep``
    wakes only when the clock is driven, and the runner is the only thread that
    drives it. So after an ``advance`` (which may leave handlers asleep, their wake-up
    beyond the advance) the runner *settles* before any call that talks to an
    instance: it steps the clock, one scheduled item at a time, until no handler is
    asleep (the handler counts itself in and out of ``ctx.sleep`` with
    :meth:`asleep`). Sleeps are finite, so this ends.

    Under the threads backend the actors run on their own threads while the runner
    is between two steps: a handler woken by the last step finishes and its
    instance may start the next event, which falls asleep again, after the count
    read zero. There a settle also waits for every actor to go quiet before it reads
    the count, and again before each call of a step that makes several
    (:meth:`between_calls`): the enqueue before may have started a handler that
    sleeps. Under greenlets nothing runs while the runner does not wait, so neither
    wait is made there (and the seeds' traces stay as they were).

    A livelock (an engine that keeps firing alarms without virtual time moving on)
    must not hang the run: :meth:`advance` and :meth:`settle` step the clock
    themselves and give up after :data:`STEP_BUDGET` steps (the runner's ``join``
    has a wall-clock timeout).
    """

    def __init__(self, clock: SimulatedClock) -> None:
        self.clock = clock
        self._asleep = 0
        self._asleep_lock = threading.Lock()
        # Whether the actors run by themselves (threads), not only when the runner waits.
        self._concurrent = clock.backend.runner is None

    @contextmanager
    def asleep(self) -> Iterator[None]:
        """Count a handler in while it sleeps in ``ctx.sleep``, and out after."""
        with self._asleep_lock:
            self._asleep += 1
        try:
            yield
        finally:
            with self._asleep_lock:
                self._asleep -= 1

    def settle(self) -> None:
        """Step the clock until no handler is asleep, so calls cannot wait on one."""
        steps = 0
        while self._quiet_asleep():
            if not self.clock.step():
                raise _Stop(f"{self._asleep} handler(s) asleep, but nothing is scheduled")
            steps += 1
            if steps > STEP_BUDGET:
                raise _Stop(f"livelock: {steps} clock steps and a handler still asleep")

    def between_calls(self) -> None:
        """Before a step's next call: under threads, settle (see the class docstring)."""
        if self._concurrent:
            self.settle()

    def _quiet_asleep(self) -> int:
        """How many handlers are asleep, once no actor runs (under threads)."""
        if self._concurrent:
            self.clock.activity.wait_quiet()
        return self._asleep

    def advance(self, seconds: float) -> None:
        """``clock.advance(seconds)``, one bounded step at a time, so a livelock is reported."""
        until = self.clock.now() + seconds
        steps = 0
        while self.clock.step(until):
            steps += 1
            if steps > STEP_BUDGET:
                raise _Stop(
                    f"livelock: {steps} clock steps without reaching t={until} "
                    f"(stuck at t={self.clock.now()})"
                )
        self.clock.run_until(until)  # nothing left to fire: this only moves the time

    def after_crash(self) -> None:
        """Wait for the recovery a crashed call caused, before the next call.

        The successor is in place when the caller hears of the crash, but its
        recovery may still be running: a call to another instance would race with
        it, and the trace would depend on thread timing. ``runtime.kill`` waits
        the same way. (``enqueue_many`` itself does not, between the parts of one
        batch: see the module docstring of ``chaos.test_chaos`` (in the repository).)
        """
        self.clock.activity.wait_quiet()
