"""A stable address for an actor, which the clock and other actors send to."""

from __future__ import annotations

import threading
from typing import Any

import pykka

from dopool._clock import Activity
from dopool._errors import PoolClosedError
from dopool._messages import Alarm


class Mailbox:
    """Sends to one actor, counting each message for quiescence; refuses once closed.

    A refused message with a reply future gets :class:`PoolClosedError`, so a
    caller never waits on an actor that will not answer.
    """

    __slots__ = ("_activity", "_closed", "_lock", "_ref", "key", "order", "pool")

    def __init__(self, pool: str, index: int, key: str, activity: Activity) -> None:
        self.pool = pool
        self.key = key
        self.order = (pool, index)
        self._activity = activity
        self._ref: pykka.ActorRef[Any] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def attach(self, ref: pykka.ActorRef[Any]) -> None:
        with self._lock:
            self._ref = ref

    def send(self, message: Any) -> bool:
        """Queue ``message`` for the actor; False (and the reply failed) if it cannot take it."""
        with self._lock:
            ref = self._ref
            if not self._closed and ref is not None:
                self._activity.sent(self.key)
                try:
                    ref.tell(message)
                except pykka.ActorDeadError:
                    self._activity.done(self.key)
                else:
                    return True
        reply = getattr(message, "reply", None)
        if reply is not None:
            reply.set_exception(exc_info=(PoolClosedError, PoolClosedError(self.pool), None))
        return False

    def finished(self) -> None:
        """Called by the actor when it has handled one message."""
        self._activity.done(self.key)

    def fire_alarm(self) -> None:
        self.send(Alarm())

    def close(self) -> pykka.ActorRef[Any] | None:
        """Refuse every later message; returns the actor to stop."""
        with self._lock:
            self._closed = True
            return self._ref
