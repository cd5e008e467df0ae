"""A runtime closing in two steps: it starts nothing more, then it stops.

``Runtime.close()`` takes both steps at once and waits as long as the running
handlers take; the interpreter's exit gives them ``EXIT_GRACE`` seconds; ``dopool
worker`` waits between the steps for its grace period or a second signal,
whichever comes first (docs/deployment.md, "Stopping a worker"). The first step
is the runtime's (every instance's mailbox closed: an instance finishes the
message in hand, and starts no attempt after it); this object is what the
caller holds between the two.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pykka

from dopool._clock.quiescence import Activity
from dopool._engine.mailbox import Mailbox
from dopool._errors import ConfigurationError

_FLOAT_MAX = sys.float_info.max

Stops = Sequence[tuple[Mailbox, "pykka.ActorRef[Any] | None"]]


class Closing:
    """A runtime that starts no attempt more, and whose running handlers may still finish.

    Args:
        stops: each instance's mailbox (closed) and the actor to stop.
        activity: the clock's count of the messages each actor has in hand.
        finish: the runtime's second step, ``finish(stops, deadline)``.
        done: set once that step returned (or raised), for a second ``close()`` to wait on.
    """

    def __init__(
        self,
        stops: Stops,
        activity: Activity,
        finish: Callable[[Stops, float | None], None],
        done: threading.Event,
    ) -> None:
        self.stops = stops
        self._activity = activity
        self._finish = finish
        self._done = done
        self._order = [mailbox.key for mailbox, _ in stops]  # the instances, in order
        self._keys = frozenset(self._order)

    def running(self) -> list[str]:
        """The instances (``pool:index``) still handling a message: a handler, say."""
        busy = self._activity.busy
        return [key for key in self._order if busy({key})]

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no instance handles a message; False if ``timeout`` (seconds) ran out."""
        activity = self._activity
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            generation = activity.generation
            if not activity.busy(self._keys):
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            activity.wait_change(generation, remaining)

    def finish(self, deadline: float | None) -> None:
        """Stop the actors and close the store (see ``Runtime._shut_down``): a handler still
        running at ``deadline`` (``time.monotonic()``; None: no limit) is abandoned."""
        try:
            self._finish(self.stops, deadline)
        finally:
            self._done.set()


def wait_until(done: threading.Event, deadline: float | None) -> bool:
    """Wait for ``done`` until ``deadline`` (``time.monotonic()``; None: no limit); whether
    it was set."""
    return done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))


def stopped(stop: pykka.Future[Any] | None, timeout: float) -> None:
    """Wait for a router actor's stop (it has nothing to finish), at most ``timeout`` seconds."""
    if stop is not None:
        stop.get(timeout=timeout)


def deadline_after(timeout: object) -> float | None:
    """The ``time.monotonic()`` deadline ``timeout`` seconds from now (None: no limit).

    Raises:
        ConfigurationError: ``timeout`` is not None or a finite number of seconds >= 0.
    """
    if timeout is None:
        return None
    seconds = math.nan
    if isinstance(timeout, int | float) and not isinstance(timeout, bool):
        seconds = float(timeout) if timeout < _FLOAT_MAX else math.inf  # an int past floats
    if not 0 <= seconds < math.inf:
        raise ConfigurationError(f"timeout must be None or finite seconds >= 0, got {timeout!r}")
    return time.monotonic() + seconds
