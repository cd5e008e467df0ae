"""Supervision: one instance's incarnations, how a crashed one is restarted, and when
restarts back off.

An instance that crashes is restarted behind the same address (its
:class:`~dopool._engine.mailbox.Mailbox`), and its successor recovers from storage
before anything else (docs/guarantees.md, "Crashes and recovery"). Each
instance has a :class:`Supervisor`: it starts the actor, kills it on request,
restarts it when it dies (at once, or after a backoff once crashes come in a
row), and knows whether the current incarnation may be acted for by a caller.
The mailbox only addresses, sends and counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import pykka

from dopool._clock.clocks import Clock
from dopool._clock.threads import Inbox
from dopool._engine.mailbox import Mailbox
from dopool._engine.messages import Kill, Message, Recover, Reply
from dopool._errors import InstanceCrashedError, NotLeasedError, PoolClosedError

# Restarts with backoff (docs/guarantees.md, "Crashes and recovery"): the first
# RESTARTS_AT_ONCE crashes in a row restart at once; each further one waits
# RESTART_DELAY_FIRST seconds of clock time, doubling, at most RESTART_DELAY_MAX.
RESTARTS_AT_ONCE = 3
RESTART_DELAY_FIRST = 1.0
RESTART_DELAY_MAX = 60.0


def restart_delay(streak: int) -> float:
    """How long the restart after the ``streak``-th crash in a row waits (0: at once)."""
    if streak <= RESTARTS_AT_ONCE:
        return 0.0
    # min() first: a long crash loop must not overflow the float.
    doublings = min(streak - RESTARTS_AT_ONCE - 1, 64)
    return min(RESTART_DELAY_FIRST * 2.0**doublings, RESTART_DELAY_MAX)


class KillFlag:
    """Raised when an incarnation must crash at its next fault point; never lowered.

    A plain attribute rather than a ``threading.Event``: it is read at every fault
    point (several times per event), and nobody waits for it. Reads and writes of
    one attribute are atomic in CPython, so actor threads see it without a lock.
    """

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False

    def set(self) -> None:
        self.raised = True


class _WaitingRestart:
    """A restart waiting out its backoff: the clock fires it like an alarm."""

    __slots__ = ("at", "order", "supervisor")

    def __init__(self, supervisor: Supervisor, at: float) -> None:
        self.supervisor = supervisor
        self.order = supervisor.mailbox.order
        self.at = at

    def fire_alarm(self) -> None:
        self.supervisor._restart_now(self)


class Supervisor:
    """Starts, kills and restarts one instance's actor behind its mailbox.

    Each incarnation has a kill flag of its own: :meth:`kill` sets the current
    one's, and the actor crashes at its next fault point. When the actor dies it
    calls :meth:`crashed`, which puts a successor behind the mailbox with a
    fresh flag (or, after :data:`RESTARTS_AT_ONCE` crashes in a row, leaves the
    address without an actor until a backoff ends).

    Lock order: the supervisor's lock, then the mailbox's; the mailbox never
    calls back.
    """

    __slots__ = (
        "_clock",
        "_kill",
        "_lock",
        "_recovering",
        "_start",
        "_unrecorded",
        "_waiting",
        "crash_streak",
        "kill_reason",
        "mailbox",
    )

    def __init__(
        self,
        mailbox: Mailbox,
        clock: Clock,
        start: Callable[[KillFlag], pykka.ActorRef[Any]],
    ) -> None:
        """``start(kill_flag)`` starts an incarnation of the actor (not yet behind the mailbox)."""
        self.mailbox = mailbox
        self._clock = clock
        self._start = start
        self._lock = threading.Lock()
        self._kill = KillFlag()
        self.kill_reason: str | None = None  # why the current incarnation was killed
        self._recovering = False  # a successor's recovery has not committed yet
        self._unrecorded = 0  # restarts not yet committed to the instance's counters
        # Crashes (but those ``runtime.kill`` asked for) since the actor last handled
        # a message other than a recovery or a kill without crashing (see
        # ``handled``), or committed an attempt's outcome: it paces restarts.
        self.crash_streak = 0
        self._waiting: _WaitingRestart | None = None

    def dismantle(self) -> None:
        """Drop the start function (bound to the cell that holds this supervisor: a
        cycle), once the cell is dropped for good (its instance evicted); see
        :meth:`dopool._machine.machine.QueueMachine.dismantle`. Nothing may start an
        incarnation here after."""
        del self._start

    def activate(self, reply: Reply | None = None, restarts: int = 0) -> None:
        """Start the first incarnation, its recovery its first message (answering
        ``reply``, not waited for), which counts ``restarts`` (one for an instance a shared
        worker took over after its lease expired). Until that recovery commits, a caller
        sends the instance messages rather than act for it (:meth:`takes_direct_calls`)."""
        with self._lock:
            self._recovering = True
            self._unrecorded += restarts
        recover = Recover(reply, restarts=restarts, start=True)
        self.mailbox.attach(self._start(self._kill), recover)

    def vacate(self) -> None:
        """Leave the address without an actor, refusing callers: not served here."""
        with self._lock:
            self.mailbox.vacate()

    @property
    def kill_flag(self) -> KillFlag:
        """Set when the current incarnation must crash at its next fault point."""
        return self._kill

    @property
    def restart_at(self) -> float | None:
        """When a restart waiting out its backoff is due (clock time); None if none waits."""
        waiting = self._waiting
        return None if waiting is None else waiting.at

    def kill(self, reason: str | None = None) -> None:
        """Make the current incarnation crash at its next fault point (at once if idle).

        ``reason=None`` is ``runtime.kill``'s order; an engine failure gives its
        reason. While a restart waits out its backoff there is no incarnation:
        nothing to do.

        Raises:
            PoolClosedError: the runtime is closing.
            NotLeasedError: another worker process serves the instance (a shared runtime's).
        """
        with self._lock:
            if self.mailbox.closed:
                raise PoolClosedError(self.mailbox.pool)
            if self.mailbox.vacant:  # (not closed: no actor here) another worker serves it
                raise NotLeasedError(self.mailbox.key)
            if self._waiting is not None:
                return
            if reason is not None and not self._kill.raised:
                self.kill_reason = reason
            self._kill.set()
        self.mailbox.send(Kill())

    def takes_direct_calls(self) -> bool:
        """Whether a caller holding the turn may act for the instance (see ``DirectEnqueue``).

        Not while it is killed or recovering, so that a call made after ``kill``
        returned still comes after the crash and the recovery; nor once closed, or
        evicted (the next incarnation takes the call).
        """
        mailbox = self.mailbox
        return not (
            mailbox.closed
            or mailbox.vacant
            or mailbox.retired
            or self._recovering
            or self._kill.raised
        )

    def handled(self, message: Any) -> None:
        """The actor handled ``message`` without crashing (called with the turn held)."""
        if self.crash_streak and ends_crash_streak(message):
            self.crash_streak = 0

    def progressed(self) -> None:
        """An attempt's outcome committed (called with the turn held): the instance does
        its work, whatever crashes come between, so its streak ends. A busy instance
        runs event after event in one message, which a crash may end before it is done."""
        self.crash_streak = 0

    def recovered(self, restarts: int) -> None:
        """The current incarnation's recovery committed, ``restarts`` restarts with it."""
        with self._lock:
            self._recovering = False
            self._unrecorded -= restarts

    def crashed(self, dead: Inbox, in_hand: Any) -> float | None:
        """The actor died handling ``in_hand``; called by it, with the turn held.

        The successor's first message is its recovery. Then comes the message
        the crash interrupted, if the engine sent it and it is retried after a
        crash (an alarm, a delivery or its acknowledgement must not be lost with
        the actor; a caller's message is not retried: its caller gets
        :class:`InstanceCrashedError`), then every message still waiting in the
        ``dead`` inbox, in order.

        After :data:`RESTARTS_AT_ONCE` crashes in a row (not counting those
        ``runtime.kill`` asked for), the successor starts only after a backoff
        (see :func:`restart_delay`): this returns its delay, and the caller must
        :meth:`arm_restart` once it has said so. Returns None for a restart done
        at once, and once the runtime is closing (then nothing is restarted).
        """
        with self._lock:
            # A crash ``runtime.kill`` asked for (a kill without a reason) is an
            # order carried out, not a sign of a sick instance: it is not counted.
            ordered = self._kill.raised and self.kill_reason is None
            streak = self.crash_streak if ordered else self.crash_streak + 1
            delay = 0.0 if ordered else restart_delay(streak)
            kill = KillFlag()  # the successor's
            retried = isinstance(in_hand, Message) and in_hand.retried_after_crash
            first = [Recover(None, restarts=self._unrecorded + 1), *([in_hand] if retried else [])]
            successor = None if delay > 0 else partial(self._start, kill)
            if not self.mailbox.replace(dead, successor, first):
                return None
            self._kill = kill
            self.kill_reason = None
            self._recovering = True
            self._unrecorded += 1
            self.crash_streak = streak
            if successor is not None:
                return None
            self._waiting = _WaitingRestart(self, self._clock.now() + delay)
            return delay

    def arm_restart(self) -> None:
        """Have the clock start the successor when the backoff :meth:`crashed` chose ends."""
        waiting = self._waiting
        if waiting is None:
            return  # closed meanwhile
        self._clock.set_alarm(waiting, waiting.at)
        with self._lock:
            if self._waiting is not waiting:  # closed while it was being set
                self._clock.set_alarm(waiting, None)

    def _restart_now(self, waiting: _WaitingRestart) -> None:
        """The backoff is over: start the successor, its recovery first, then what was kept."""
        with self._lock:
            if self._waiting is not waiting:
                return  # closed meanwhile
            self._waiting = None
            self.mailbox.reattach(partial(self._start, self._kill))

    def close(self, *, vacant: bool = False) -> pykka.ActorRef[Any] | None:
        """Close the mailbox; returns the actor to stop. A waiting restart never happens.
        ``vacant``: another worker serves the instance now (see ``Mailbox.close``)."""
        with self._lock:
            ref = self.mailbox.close(vacant=True) if vacant else self.mailbox.close()
            waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self._clock.set_alarm(waiting, None)
        return ref


def ends_crash_streak(message: Any) -> bool:
    """Whether handling ``message`` without a crash shows the instance is healthy again.

    A recovery does not (a loop in which the recovery commits and the next
    message crashes is still a loop), nor a kill that found nothing to do.
    """
    return type(message) not in (Recover, Kill)


def send_recovery(supervisor: Supervisor, restarts: int = 0) -> Reply:
    """Send an instance its first recovery, ``restarts`` to count with it (an instance
    taken over from a worker whose lease expired counts one); its reply, for
    :func:`await_recovery`."""
    if restarts:
        with supervisor._lock:
            supervisor._unrecorded += restarts
    reply = supervisor.mailbox.reply()
    supervisor.mailbox.send(Recover(reply, restarts=restarts))
    return reply


def await_recovery(supervisor: Supervisor, reply: Reply) -> None:
    """Wait for an instance's first recovery (:func:`send_recovery`'s, or the one
    :meth:`Supervisor.activate` sent).

    If that recovery crashes, the supervisor restarts the instance and its
    successor recovers first thing; asking again waits for that (a recovery
    that finds nothing to settle changes nothing). Once the restarts wait out
    a backoff, the instance is left to its supervisor: under a simulated clock
    nobody would drive the clock to the restart.

    Raises:
        NotLeasedError, PoolClosedError: the instance stopped being served here meanwhile.
    """
    while True:
        try:
            reply.get()
        except InstanceCrashedError:
            if supervisor.restart_at is not None:
                return
            # A crashed recovery's successor counts the restarts (``crashed``).
            reply = supervisor.mailbox.reply()
            supervisor.mailbox.send(Recover(reply, restarts=0))
            continue
        return
