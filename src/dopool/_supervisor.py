"""Supervision: how a crashed instance is restarted, and when its restarts back off.

An instance that crashes is restarted behind the same address (its
``Mailbox``), and its successor recovers from storage before anything else
(docs/guarantees.md, "Crashes and recovery"). This module holds the policy:
which crashes count as "in a row", how long each restart waits, the timer a
waiting restart is, and an instance's first recovery when its pool is defined.
The mechanics of putting a successor behind the address are the mailbox's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pykka

from dopool._clock import Clock
from dopool._errors import InstanceCrashedError
from dopool._messages import Kill, Recover, Reply

if TYPE_CHECKING:
    from dopool._mailbox import Mailbox

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


class DelayedRestart:
    """A restart waiting out its backoff: the clock fires it like an alarm."""

    __slots__ = ("at", "clock", "envelopes", "held", "mailbox", "retried", "start")

    def __init__(
        self,
        mailbox: Mailbox,
        start: Callable[[threading.Event], pykka.ActorRef[Any]],
        clock: Clock,
        at: float,
    ) -> None:
        self.mailbox = mailbox
        self.start = start
        self.clock = clock
        self.at = at
        # For the successor, after its recovery, in this order (each counted as sent):
        self.retried: list[Any] = []  # the engine's message the crash interrupted
        self.envelopes: list[Any] = []  # what waited in the dead actor's inbox
        self.held: list[Any] = []  # the engine's messages sent since

    def count(self) -> int:
        """The messages counted for the successor, its recovery included."""
        return 1 + len(self.retried) + len(self.envelopes) + len(self.held)

    @property
    def order(self) -> tuple[str, int]:
        return self.mailbox.order

    def fire_alarm(self) -> None:
        self.mailbox.start_successor(self)


def ends_crash_streak(message: Any) -> bool:
    """Whether handling ``message`` without a crash shows the instance is healthy again.

    A recovery does not (a loop in which the recovery commits and the next
    message crashes is still a loop), nor a kill that found nothing to do.
    """
    return type(message) not in (Recover, Kill)


def recover_first(mailbox: Mailbox) -> None:
    """Run an instance's first recovery and wait for it.

    If that recovery crashes, the supervisor restarts the instance and its
    successor recovers first thing; asking again waits for that (a recovery
    that finds nothing to settle changes nothing). Once the restarts wait out
    a backoff, the instance is left to its supervisor: under a simulated clock
    nobody would drive the clock to the restart.
    """
    while True:
        reply = Reply()
        mailbox.send(Recover(reply))
        try:
            reply.get()
        except InstanceCrashedError:
            if mailbox.restart_at is not None:
                return
            continue
        return
