"""A stable address for an actor, which callers, the clock and other actors send to."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import pykka

from dopool._clock import Activity
from dopool._errors import DopoolError, PoolClosedError
from dopool._messages import Alarm, Deliver, Delivered, Kill, Recover, Run
from dopool._records import Meta
from dopool._turn import Turn

# Messages the engine sends itself: one a crash interrupts goes to the restarted
# instance again. A caller's message that a crash interrupts fails instead.
_INTERNAL = (Alarm, Deliver, Delivered)

UNKNOWN = float("nan")  # an alarm time equal to none: the clock must be told again


class Mailbox:
    """Sends to one actor, counting each message for quiescence; refuses once closed.

    It outlives the actor: when an instance crashes, :meth:`replace` starts its
    successor behind the same address, so senders never see the gap.
    A refused message with a reply future gets an error, so no caller waits forever.
    """

    __slots__ = (
        "_activity",
        "_closed",
        "_kill",
        "_lock",
        "_recovering",
        "_ref",
        "_run",
        "_unrecorded_restarts",
        "armed",
        "key",
        "kill_reason",
        "meta",
        "order",
        "pool",
        "turn",
    )

    def __init__(self, pool: str, index: int, key: str, activity: Activity) -> None:
        self.pool = pool
        self.key = key
        self.order = (pool, index)
        self._activity = activity
        self._ref: pykka.ActorRef[Any] | None = None
        self._kill = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._unrecorded_restarts = 0
        self.turn = Turn()
        self.armed: float | None = None  # what the clock was last told, to skip repeats
        self.kill_reason: str | None = None  # why the current incarnation was killed
        self._recovering = False  # a successor's recovery has not committed yet
        self._run: Any = None  # an attempt a caller started, for the actor to run
        # The instance's meta as its last commit left it, if known (see
        # ``_Instance._load_meta``): only the holder of the turn touches it.
        self.meta: Meta | None = None

    @property
    def closed(self) -> bool:
        """Whether the runtime is closing: the actor should start no further work."""
        return self._closed

    @property
    def kill_flag(self) -> threading.Event:
        """Set when the current incarnation must crash at its next fault point."""
        return self._kill

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
        fail_reply(message, PoolClosedError(self.pool))
        return False

    def takes_direct_calls(self) -> bool:
        """Whether a caller holding the turn may act for the instance (see ``DirectEnqueue``).

        Not while it is killed or recovering, so that a call made after ``kill``
        returned still comes after the crash and the recovery; nor once closed.
        """
        return not (self._closed or self._recovering or self._kill.is_set())

    def idle(self) -> bool:
        """Whether no message waits for the actor (read with the turn held)."""
        ref = self._ref
        return ref is not None and ref.actor_inbox.empty()

    def start_run(self, started: Any) -> None:
        """Hand the actor an attempt whose start a caller committed; it runs it next."""
        self._run = started
        self.send(Run())  # if refused (closing), the actor's on_stop runs it

    def take_run(self) -> Any:
        """The attempt a caller started, if any (called with the turn held)."""
        started, self._run = self._run, None
        return started

    def recovered(self) -> None:
        """The current incarnation's recovery committed: direct calls may go on."""
        self._recovering = False

    def finished(self, count: int = 1) -> None:
        """Called by the actor when it has handled ``count`` messages."""
        self._activity.done(self.key, count)

    def fire_alarm(self) -> None:
        self.send(Alarm())

    def kill(self, reason: str | None = None) -> None:
        """Make the current incarnation crash at its next fault point (at once if idle)."""
        with self._lock:
            if self._closed:
                raise PoolClosedError(self.pool)
            if reason is not None and not self._kill.is_set():
                self.kill_reason = reason
            self._kill.set()
        self.send(Kill())

    def replace(
        self,
        start: Callable[[threading.Event], pykka.ActorRef[Any]],
        inbox: queue.Queue[Any],
        in_hand: Any,
    ) -> bool:
        """Put a restarted actor behind this address; called by the dying actor.

        The successor's first message is its recovery. Then comes the message
        the crash interrupted, if the engine sent it (an alarm, a delivery or its
        acknowledgement must not be lost with the actor; a caller's message is
        not retried: its caller gets :class:`InstanceCrashedError`), then every
        message still waiting in the dead actor's ``inbox``, in order.
        Returns False (and restarts nothing) once the mailbox is closed.
        """
        with self._lock:
            waiting = []  # envelopes: a pykka stop request carries its reply in one
            while True:
                try:
                    waiting.append(inbox.get_nowait())
                except queue.Empty:
                    break
            if self._closed:
                for envelope in waiting:
                    if envelope.reply_to is not None:  # close() asking the actor to stop
                        envelope.reply_to.set(None)  # it is stopping: the answer close waits for
                        continue
                    self._activity.done(self.key)
                    fail_reply(envelope.message, PoolClosedError(self.pool))
                return False
            self._kill = threading.Event()
            self.kill_reason = None
            self._recovering = True
            self._run = None  # the recovery settles that attempt
            self.meta = None  # the successor starts from the store
            ref = self._ref = start(self._kill)
            self._unrecorded_restarts += 1
            retried = [in_hand] if isinstance(in_hand, _INTERNAL) else []
            for message in (Recover(None, restarts=self._unrecorded_restarts), *retried):
                self._activity.sent(self.key)
                ref.tell(message)
            for envelope in waiting:
                ref.actor_inbox.put(envelope)  # as sent (and already counted), reply and all
            return True

    def restarts_recorded(self, count: int) -> None:
        """A recovery committed ``count`` restarts to the instance's counters."""
        with self._lock:
            self._unrecorded_restarts -= count

    def close(self) -> pykka.ActorRef[Any] | None:
        """Refuse every later message; returns the actor to stop."""
        with self._lock:
            self._closed = True
            return self._ref


def fail_reply(message: Any, error: DopoolError) -> None:
    """Answer a message's reply future (if it has one that is still open) with ``error``."""
    reply = getattr(message, "reply", None)
    if reply is None:
        return
    reply.fail(error)  # unless it was answered already
