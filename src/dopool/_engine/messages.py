"""The messages actors exchange: one small frozen record per verb."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from dopool._clock.latch import Latch, closed_lock
from dopool._machine.types import Item, Request
from dopool._store.layout import OutboxRecord

_ANSWERING = threading.Lock()  # makes "answered yet?" and "now it is" one step


class Reply:
    """The answer to one call: given once by the instance, awaited by the caller.

    pykka's ``ThreadingFuture`` does this with a queue and three conditions; a
    call on the enqueue path needs at most one latch, made only when a caller
    must wait for an answer not given yet (most are answered before anyone
    asks), and released by the answer. ``waiter`` makes that latch: the clock
    backend's (:meth:`dopool._clock.threads.Backend.waiter`), so that under greenlets
    waiting for the answer runs the actors instead of blocking the thread; by
    default a held lock.
    """

    __slots__ = ("_answered", "_error", "_ready", "_value", "_waiter")

    def __init__(self, waiter: Callable[[], Latch] | None = None) -> None:
        self._waiter = waiter
        self._ready: Latch | None = None  # the latch a waiter waits on, once one must
        self._answered = False
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any = None) -> None:
        """Answer ``value``; a call is answered once (RuntimeError otherwise)."""
        if not self._answer(value, None):
            raise RuntimeError("this call was already answered")

    @property
    def answered(self) -> bool:
        """Whether the call was answered (its waiter may not have woken yet)."""
        return self._answered

    def fail(self, error: BaseException) -> bool:
        """Answer ``error`` unless the call was answered already; whether it was not."""
        return self._answer(None, error)

    def _answer(self, value: Any, error: BaseException | None) -> bool:
        with _ANSWERING:
            if self._answered:
                return False
            self._value, self._error = value, error
            self._answered = True
            ready = self._ready
        if ready is not None:
            ready.release()
        return True

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the answer and return it, or raise the error it is.

        Raises:
            TimeoutError: no answer within ``timeout`` seconds.
        """
        if not self._answered:
            with _ANSWERING:  # the answer comes before this, or finds the latch made
                ready = None if self._answered else self._ready or self._make_latch()
            if ready is not None:
                if not ready.acquire(timeout=-1 if timeout is None else timeout):
                    raise TimeoutError("the call has not been answered yet")
                ready.release()  # so that a later get() sees the answer at once
        if self._error is not None:
            raise self._error
        return self._value

    def _make_latch(self) -> Latch:
        waiter = self._waiter
        latch = closed_lock() if waiter is None else waiter()
        self._ready = latch
        return latch


class Message:
    """A message to an instance actor.

    ``retried_after_crash``: whether a crash that interrupts it hands it to the
    restarted instance again. The engine's own messages are (an alarm, a
    delivery or its acknowledgement must not be lost with the actor); a
    caller's is not: its caller gets ``InstanceCrashedError`` instead.
    """

    __slots__ = ()
    retried_after_crash: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class Enqueue(Message):
    """Append items atomically (all or none), answering a list of EnqueueResult.

    ``call``: a producer's call the owner takes (``_engine/owner_calls.py``): answered
    from its record if one was stored before, and recorded with its events otherwise
    (``_store/layout/calls.py``).
    """

    items: tuple[Item, ...]
    reply: Reply
    call: CallMark | None = None


class CallMark(NamedTuple):
    """Which producer's call an enqueue is, and the number below which the producer
    needs none of its records any more."""

    producer: bytes
    number: int
    done_below: int


@dataclass(frozen=True, slots=True)
class Recover(Message):
    """Sent first to a started instance: settle a crashed attempt, re-arm the alarm.

    ``restarts`` counts the supervisor restarts not yet recorded: more than one
    when an earlier recovery crashed before its write committed. ``start``: the first
    message of an instance started on demand (:meth:`Supervisor.activate`), which
    emits ``activated`` once it commits.
    """

    reply: Reply | None
    restarts: int = 0
    start: bool = False


@dataclass(frozen=True, slots=True)
class Kill(Message):
    """Crash now (``runtime.kill`` on an instance that is not inside its handler)."""


@dataclass(frozen=True, slots=True)
class HandedOff(Message):
    """A caller started an attempt on this idle instance: run it (see ``DirectEnqueue.enqueue``)."""


@dataclass(frozen=True, slots=True)
class Evict(Message):
    """The idle timer: stop the actor if the instance has had nothing to do for its pool's
    ``idle_timeout``. Not retried: a restarted instance arms a timer of its own."""


@dataclass(frozen=True, slots=True)
class Alarm(Message):
    """The clock says the alarm slot is due."""

    retried_after_crash: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class Deliver(Message):
    """Source instance → target: a follow-up from the source's outbox.

    The source is instance ``source`` of pool ``source_pool``: the target's own
    pool, or another (``record.pool`` names the target's).
    """

    retried_after_crash: ClassVar[bool] = True
    source_pool: str
    source: int
    oseq: int
    record: OutboxRecord


@dataclass(frozen=True, slots=True)
class Delivered(Message):
    """Target → source: the follow-up ``oseq`` is durable in the target's queue."""

    retried_after_crash: ClassVar[bool] = True
    oseq: int


@dataclass(frozen=True, slots=True)
class Resend(Message):
    """Pool ``pool`` is defined now: deliver the follow-ups held for it (see ``_directory``)."""

    retried_after_crash: ClassVar[bool] = True
    pool: str


@dataclass(frozen=True, slots=True)
class Redeliver(Message):
    """Target → source: a link arrived before the one the target expects (an earlier one
    went missing): deliver the outbox's follow-ups for instance ``target`` of ``pool``
    again, in link order."""

    retried_after_crash: ClassVar[bool] = True
    pool: str
    target: int


@dataclass(frozen=True, slots=True)
class Control(Message):
    """A caller's request, one transition of the queue machine, answered with its result.

    The actor runs every one the same way (one transaction, publish, answer):
    :meth:`QueueMachine.control <dopool._machine.machine.QueueMachine.control>`
    makes the transition ``request`` names.
    """

    request: Request
    reply: Reply
