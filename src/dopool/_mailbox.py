"""A stable address for an actor, which callers, the clock and other actors send to."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pykka

from dopool._clock import Activity, Clock
from dopool._errors import DopoolError, InstanceCrashedError, PoolClosedError
from dopool._inbox import Inbox
from dopool._layout import Meta
from dopool._messages import Alarm, HandedOff, Kill, Message, Recover
from dopool._supervisor import DelayedRestart, ends_crash_streak, restart_delay
from dopool._turn import Turn


class _Untold:
    """The clock's view of an alarm slot is unknown (after a restart): tell it again."""

    __slots__ = ()


UNTOLD = _Untold()


class Mailbox:
    """Sends to one actor, counting each message for quiescence; refuses once closed.

    It outlives the actor: when an instance crashes, :meth:`replace` starts its
    successor behind the same address, so senders never see the gap.
    A refused message with a reply future gets an error, so no caller waits forever.
    """

    __slots__ = (
        "_activity",
        "_closed",
        "_delayed",
        "_handed_off",
        "_kill",
        "_lock",
        "_recovering",
        "_ref",
        "_unrecorded_restarts",
        "crash_streak",
        "key",
        "kill_reason",
        "meta",
        "order",
        "pool",
        "told_alarm",
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
        self.told_alarm: float | _Untold | None = None  # what the clock was last told
        self.kill_reason: str | None = None  # why the current incarnation was killed
        self._recovering = False  # a successor's recovery has not committed yet
        self._handed_off: Any = None  # an attempt a caller started, for the actor to run
        # The instance's meta as its last commit left it, if known (see
        # ``InstanceShell._load_meta``): only the holder of the turn touches it.
        self.meta: Meta | None = None
        # Crashes (but those ``runtime.kill`` asked for) since the actor last handled
        # a message other than a recovery or a kill without crashing (see
        # ``handled``): it paces restarts.
        self.crash_streak = 0
        self._delayed: DelayedRestart | None = None  # a restart waiting out its backoff

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
            elif not self._closed and self._delayed is not None:
                return self._hold(self._delayed, message)
        fail_reply(message, PoolClosedError(self.pool))
        return False

    def _hold(self, delayed: DelayedRestart, message: Any) -> bool:
        """While a restart waits: keep an engine message for the successor, fail a caller's.

        A caller is not kept waiting for a backoff (up to a minute, or for ever
        under a simulated clock nobody drives): it gets :class:`InstanceCrashedError`
        at once, as if the instance had crashed under its call. Called with the lock.
        """
        if getattr(message, "reply", None) is not None:
            fail_reply(message, InstanceCrashedError(self.key))
            return False
        self._activity.sent(self.key)
        delayed.held.append(message)
        return True

    @property
    def restart_at(self) -> float | None:
        """When a restart waiting out its backoff is due (clock time); None if none waits."""
        delayed = self._delayed
        return None if delayed is None else delayed.at

    def handled(self, message: Any) -> None:
        """The actor handled ``message`` without crashing (called with the turn held).

        That ends a crash streak, unless it was a recovery (a loop in which the
        recovery commits and the next message crashes is still a loop) or a kill
        that found nothing to do.
        """
        if self.crash_streak and ends_crash_streak(message):
            self.crash_streak = 0

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

    def hand_off(self, started: Any) -> None:
        """Hand the actor an attempt whose start a caller committed; it runs it next."""
        self._handed_off = started
        self.send(HandedOff())  # if refused (closing), the actor's on_stop runs it

    def take_handed_off(self) -> Any:
        """The attempt a caller started, if any (called with the turn held)."""
        started, self._handed_off = self._handed_off, None
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
        """Make the current incarnation crash at its next fault point (at once if idle).

        While a restart waits out its backoff there is none: nothing to do.
        """
        with self._lock:
            if self._closed:
                raise PoolClosedError(self.pool)
            if self._delayed is not None:
                return
            if reason is not None and not self._kill.is_set():
                self.kill_reason = reason
            self._kill.set()
        self.send(Kill())

    def replace(
        self,
        start: Callable[[threading.Event], pykka.ActorRef[Any]],
        inbox: Inbox,
        in_hand: Any,
        clock: Clock,
    ) -> float | None:
        """Put a restarted actor behind this address; called by the dying actor.

        The successor's first message is its recovery. Then comes the message
        the crash interrupted, if the engine sent it (an alarm, a delivery or its
        acknowledgement must not be lost with the actor; a caller's message is
        not retried: its caller gets :class:`InstanceCrashedError`), then every
        message still waiting in the dead actor's ``inbox``, in order.

        After :data:`RESTARTS_AT_ONCE` crashes in a row (not counting those
        ``runtime.kill`` asked for), the successor starts only
        after a backoff (see :func:`restart_delay`): this returns its delay, and
        the caller must :meth:`arm_restart`. Meanwhile the engine's messages are
        held for the successor and callers' messages fail (see ``_hold``). Returns
        None for a restart done at once, and once the mailbox is closed (then
        nothing is restarted).
        """
        with self._lock:  # no sender can reach the dead actor's inbox once it is drained
            waiting = inbox.drain()  # envelopes: a pykka stop request carries its reply in one
            if self._closed:
                for envelope in waiting:
                    if envelope.reply_to is not None:  # close() asking the actor to stop
                        envelope.reply_to.set(None)  # it is stopping: the answer close waits for
                        continue
                    self._activity.done(self.key)
                    fail_reply(envelope.message, PoolClosedError(self.pool))
                return None
            # A crash ``runtime.kill`` asked for (a kill without a reason) is an
            # order carried out, not a sign of a sick instance: it is not counted.
            ordered = self._kill.is_set() and self.kill_reason is None
            self._kill = threading.Event()
            self.kill_reason = None
            self._recovering = True
            self._handed_off = None  # the recovery settles that attempt
            self.meta = None  # the successor starts from the store
            self._unrecorded_restarts += 1
            if not ordered:
                self.crash_streak += 1
            retried = (
                [in_hand] if isinstance(in_hand, Message) and in_hand.retried_after_crash else []
            )
            delay = 0.0 if ordered else restart_delay(self.crash_streak)
            if delay > 0:
                self._delay_restart(start, clock, delay, retried, waiting)
                return delay
            ref = self._ref = start(self._kill)
            for message in (Recover(None, restarts=self._unrecorded_restarts), *retried):
                self._activity.sent(self.key)
                ref.tell(message)
            for envelope in waiting:
                ref.actor_inbox.put(envelope)  # as sent (and already counted), reply and all
            return None

    def _delay_restart(
        self,
        start: Callable[[threading.Event], pykka.ActorRef[Any]],
        clock: Clock,
        delay: float,
        retried: list[Any],
        waiting: list[Any],
    ) -> None:
        """Leave the address without an actor until ``delay`` passes (called with the lock).

        The recovery to come is counted now: the instance stays busy for ``join``
        but, like a handler in ``ctx.sleep``, not active, so a simulated clock can
        be driven to the restart.
        """
        delayed = self._delayed = DelayedRestart(self, start, clock, clock.now() + delay)
        self._ref = None
        self._activity.sent(self.key)  # the successor's Recover
        for message in retried:
            self._activity.sent(self.key)
            delayed.retried.append(message)
        for envelope in waiting:  # counted when they were sent
            if getattr(envelope.message, "reply", None) is None:
                delayed.envelopes.append(envelope)
            else:  # a caller's: see ``_hold``
                self._activity.done(self.key)
                fail_reply(envelope.message, InstanceCrashedError(self.key))
        self._activity.sleep_begin(self.key)

    def arm_restart(self) -> None:
        """Have the clock start the successor when the backoff :meth:`replace` chose ends."""
        delayed = self._delayed
        if delayed is None:
            return  # closed meanwhile
        delayed.clock.set_alarm(delayed, delayed.at)
        with self._lock:
            if self._delayed is not delayed:  # closed while it was being set
                delayed.clock.set_alarm(delayed, None)

    def start_successor(self, delayed: DelayedRestart) -> None:
        """The backoff is over: start the successor, its recovery first, then what was held."""
        with self._lock:
            if self._delayed is not delayed:
                return  # closed meanwhile
            self._delayed = None
            ref = self._ref = delayed.start(self._kill)
            self._activity.sleep_end(self.key)
            # Each was counted when it was sent, or held.
            for message in (Recover(None, restarts=self._unrecorded_restarts), *delayed.retried):
                ref.tell(message)
            for envelope in delayed.envelopes:
                ref.actor_inbox.put(envelope)
            for message in delayed.held:
                ref.tell(message)

    def restarts_recorded(self, count: int) -> None:
        """A recovery committed ``count`` restarts to the instance's counters."""
        with self._lock:
            self._unrecorded_restarts -= count

    def close(self) -> pykka.ActorRef[Any] | None:
        """Refuse every later message; returns the actor to stop.

        A restart waiting out its backoff never happens, and the engine's
        messages held for it are dropped: storage holds what they stand for.
        """
        with self._lock:
            self._closed = True
            delayed, self._delayed = self._delayed, None
            if delayed is not None:
                self._activity.done(self.key, delayed.count())
                self._activity.sleep_end(self.key)
            ref = self._ref
        if delayed is not None:
            delayed.clock.set_alarm(delayed, None)
        return ref


def fail_reply(message: Any, error: DopoolError) -> None:
    """Answer a message's reply future (if it has one that is still open) with ``error``."""
    reply = getattr(message, "reply", None)
    if reply is None:
        return
    reply.fail(error)  # unless it was answered already
