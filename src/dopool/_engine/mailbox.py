"""A stable address for an actor, which callers, the clock and other actors send to."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pykka

from dopool._clock.latch import Latch
from dopool._clock.quiescence import Activity
from dopool._clock.threads import Inbox
from dopool._engine.messages import Alarm, Reply
from dopool._errors import DopoolError, InstanceCrashedError, NotLeasedError, PoolClosedError


class Mailbox:
    """Sends to one actor, counting each message for quiescence; refuses once closed.

    It outlives the actor: when an instance crashes, its supervisor puts the
    successor behind the same address (:meth:`replace`), so senders never see
    the gap. While a restart waits out a backoff there is no actor behind it:
    the engine's messages are kept for the successor, and a caller's fails at
    once. A refused message with a reply future gets an error, so no caller
    waits forever. An instance waiting for a slot (:mod:`dopool._engine.slots`) has no
    actor yet either: its mailbox is *held*, and keeps every message, a caller's too,
    for the actor the slot starts.
    """

    __slots__ = (
        "_activity",
        "_answer",
        "_closed",
        "_held",
        "_kept",
        "_latch",
        "_lock",
        "_ref",
        "_successor",
        "_vacant",
        "key",
        "order",
        "pool",
    )

    def __init__(
        self,
        pool: str,
        index: int,
        key: str,
        activity: Activity,
        latch: Callable[[object], Latch] | None = None,
    ) -> None:
        """``latch``: the clock backend's (:meth:`dopool._clock.threads.Backend.latch`), which
        a reply to this actor waits on; None: a held lock, for OS threads."""
        self.pool = pool
        self.key = key
        self.order = (pool, index)
        self._answer = f"the answer of {key}"  # what a reply's waiter waits for
        self._activity = activity
        self._latch = latch
        self._lock = threading.Lock()
        self._ref: pykka.ActorRef[Any] | None = None
        self._closed = False
        # While no actor is behind the address: the messages for the next one, in
        # order, each counted as sent.
        self._kept: list[Any] | None = None
        # Waiting for a slot (``hold``): a caller's message is kept too, not failed.
        self._held = False
        # No actor here because another worker serves the instance (``vacate``).
        self._vacant = False
        # Once the instance is evicted (``retire``): the address of its next incarnation,
        # started by asking, where every later message goes.
        self._successor: Callable[[], Mailbox] | None = None

    def reply(self) -> Reply:
        """A reply for a call to this actor, to send with the call and wait on."""
        latch = self._latch
        return Reply(None if latch is None else partial(latch, self._answer))

    @property
    def closed(self) -> bool:
        """Whether the runtime is closing: the actor should start no further work."""
        return self._closed

    def attach(self, ref: pykka.ActorRef[Any], first: Any = None) -> None:
        """Put the first actor behind the address; ``first``, if given, is its first
        message (sent before any other sender can reach it), then what a held address
        kept, in order."""
        with self._lock:
            self._ref = ref
            self._vacant = False
            if first is not None:
                self._activity.sent(self.key)
                ref.tell(first)
            if self._held:
                kept, self._kept, self._held = self._kept or [], None, False
                self._activity.sleep_end(self.key)
                for message in kept:  # each counted when kept
                    ref.tell(message)

    @property
    def held(self) -> bool:
        """Whether the instance waits for a slot, its messages kept (see :meth:`hold`)."""
        return self._held

    def hold(self) -> None:
        """No actor here until :meth:`attach`, which the instance's slot brings: every
        message is kept for it meanwhile. Counted asleep, like a restart waiting out its
        backoff: a simulated clock may move on while the instances in their slots sleep."""
        with self._lock:
            self._held = True
            self._kept = []
            self._activity.sleep_begin(self.key)

    @property
    def vacant(self) -> bool:
        """Whether no actor is here because another worker serves the instance."""
        return self._vacant

    def vacate(self) -> None:
        """No actor here until :meth:`attach`: a caller's message fails with
        :class:`NotLeasedError`, the engine's are dropped (the store holds what they
        stand for, and the worker serving the instance reads it)."""
        with self._lock:
            self._closed = False
            self._ref = None
            self._vacant = True

    @property
    def retired(self) -> bool:
        """Whether the instance was evicted from this address (see :meth:`retire`)."""
        return self._successor is not None

    def retire(self, successor: Callable[[], Mailbox]) -> bool:
        """Evict the instance from this address, if no message waits for its actor (called
        by the actor, with the instance's turn held): every later message goes to
        ``successor()``, the address of its next incarnation (started by that call).
        False, changing nothing, if a message waits or the address is closed or vacant."""
        with self._lock:
            ref = self._ref
            if self._closed or ref is None or not ref.actor_inbox.empty():
                return False
            self._successor = successor
            return True

    def send(self, message: Any) -> bool:
        """Queue ``message`` for the actor (or keep it for the next); False (and the reply
        failed) if it cannot take it."""
        with self._lock:
            successor = self._successor
            if successor is None:
                ref = self._ref
                if not self._closed and ref is not None:
                    self._activity.sent(self.key)
                    try:
                        ref.tell(message)
                    except pykka.ActorDeadError:
                        self._activity.done(self.key)
                    else:
                        return True
                elif not self._closed and self._kept is not None:
                    return self._keep(self._kept, message)
                vacant = self._vacant
        if successor is not None:  # evicted: to the next incarnation (outside the lock,
            return successor().send(message)  # which starting it may take in another order)
        fail_reply(message, NotLeasedError(self.key) if vacant else PoolClosedError(self.pool))
        return False

    def _keep(self, kept: list[Any], message: Any) -> bool:
        """No actor is behind the address: keep an engine message, and a caller's if the
        address is held (its slot will come), else fail it.

        A caller is not kept waiting for a restart's backoff (up to a minute, or
        for ever under a simulated clock nobody drives): it gets
        :class:`InstanceCrashedError` at once, as if the instance had crashed
        under its call. Called with the lock.
        """
        if not self._held and getattr(message, "reply", None) is not None:
            fail_reply(message, InstanceCrashedError(self.key))
            return False
        self._activity.sent(self.key)
        kept.append(message)
        return True

    def idle(self) -> bool:
        """Whether no message waits for the actor (read with the instance's turn held)."""
        ref = self._ref
        return ref is not None and self._successor is None and ref.actor_inbox.empty()

    def finished(self, count: int = 1) -> None:
        """Called by the actor when it has handled ``count`` messages."""
        self._activity.done(self.key, count)

    def fire_alarm(self) -> bool:
        """Send the actor an alarm; False if no actor here can take it (see :meth:`send`)."""
        return self.send(Alarm())

    def replace(
        self,
        dead: Inbox,
        successor: Callable[[], pykka.ActorRef[Any]] | None,
        first: Sequence[Any],
    ) -> bool:
        """Move what waits in a dead actor's inbox to its successor; called by the dying actor.

        The successor (started by ``successor()``) gets ``first``, then every
        message that waited in ``dead``, in order. With ``successor=None`` the
        address is left without an actor until :meth:`reattach`: what the next
        one is to get is kept (see :meth:`_keep`), and the address counts as
        busy but, like a handler in ``ctx.sleep``, not active, so a simulated
        clock can be driven to the restart. Returns False, starting nothing, once
        the mailbox is closed: what waited is answered as refused.
        """
        with self._lock:  # no sender can reach the dead inbox once it is drained
            waiting, stops = dead.drain()
            if self._closed:
                for stop in stops:  # close() asking the actor to stop: it is stopping
                    stop.set(None)
                for message in waiting:
                    self._activity.done(self.key)
                    fail_reply(message, self._refusal())
                return False
            for stop in stops:  # none: only close() asks an actor to stop
                stop.set(None)
            for _ in first:
                self._activity.sent(self.key)
            if successor is not None:
                ref = self._ref = successor()
                for message in (*first, *waiting):  # each counted as sent
                    ref.tell(message)
                return True
            self._ref = None
            kept = self._kept = list(first)
            for message in waiting:  # counted when they were sent
                if getattr(message, "reply", None) is None:
                    kept.append(message)
                else:  # a caller's: see _keep
                    self._activity.done(self.key)
                    fail_reply(message, InstanceCrashedError(self.key))
            self._activity.sleep_begin(self.key)
            return True

    def reattach(self, successor: Callable[[], pykka.ActorRef[Any]]) -> bool:
        """Start the successor behind an address left without an actor; give it what was kept.

        Returns False, starting nothing, if the mailbox was closed meanwhile.
        """
        with self._lock:
            kept, self._kept = self._kept, None
            if kept is None:
                return False
            ref = self._ref = successor()
            self._activity.sleep_end(self.key)
            for message in kept:  # each counted when kept
                ref.tell(message)
            return True

    def close(self, *, vacant: bool = False) -> pykka.ActorRef[Any] | None:
        """Refuse every later message; returns the actor to stop. ``vacant``: because
        another worker serves the instance now (a caller is told so).

        Messages kept for a successor are dropped: storage holds what they
        stand for. A caller's kept by a held address is answered as refused.
        """
        with self._lock:
            self._closed = True
            self._vacant = self._vacant or vacant
            kept, self._kept = self._kept, None
            self._held = False
            if kept is not None:
                self._activity.done(self.key, len(kept))
                self._activity.sleep_end(self.key)
                for message in kept:
                    fail_reply(message, self._refusal())
            return self._ref

    def _refusal(self) -> DopoolError:
        """What a caller's message that a closed address never delivered is answered with:
        vacant, the instance is another worker's now (the caller stores its enqueue as a
        producer's); else the runtime is closing."""
        return NotLeasedError(self.key) if self._vacant else PoolClosedError(self.pool)


def fail_reply(message: Any, error: DopoolError) -> None:
    """Answer a message's reply future (if it has one that is still open) with ``error``."""
    reply = getattr(message, "reply", None)
    if reply is None:
        return
    reply.fail(error)  # unless it was answered already
