"""The messages actors exchange: one small frozen record per verb."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

from dopool._layout import OutboxRecord

_ANSWERING = threading.Lock()  # makes "answered yet?" and "now it is" one step


class Reply:
    """The answer to one call: given once by the instance, awaited by the caller.

    pykka's ``ThreadingFuture`` does this with a queue and three conditions; a
    call on the enqueue path needs only one lock, taken at creation and
    released by the answer.
    """

    __slots__ = ("_answered", "_error", "_ready", "_value")

    def __init__(self) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()
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
            self._answered = True
        self._value, self._error = value, error
        self._ready.release()
        return True

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the answer and return it, or raise the error it is.

        Raises:
            TimeoutError: no answer within ``timeout`` seconds.
        """
        if not self._ready.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError("the call has not been answered yet")
        self._ready.release()  # so that a later get() sees the answer at once
        if self._error is not None:
            raise self._error
        return self._value


class Item(NamedTuple):
    """A validated event on its way to an instance."""

    event: bytes  # msgpack-encoded, size-checked
    partition_key: str | None
    priority: int


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Append items atomically (all or none), answering a list of EnqueueResult."""

    items: tuple[Item, ...]
    reply: Reply


@dataclass(frozen=True, slots=True)
class Recover:
    """Sent first to a started instance: settle a crashed attempt, re-arm the alarm.

    ``restarts`` counts the supervisor restarts not yet recorded: more than one
    when an earlier recovery crashed before its write committed.
    """

    reply: Reply | None
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class Kill:
    """Crash now (``runtime.kill`` on an instance that is not inside its handler)."""


@dataclass(frozen=True, slots=True)
class Run:
    """A caller started an attempt on this idle instance: run it (see ``Mailbox.start_run``)."""


@dataclass(frozen=True, slots=True)
class Alarm:
    """The clock says the alarm slot is due."""


@dataclass(frozen=True, slots=True)
class Pause:
    reply: Reply


@dataclass(frozen=True, slots=True)
class Resume:
    reply: Reply


@dataclass(frozen=True, slots=True)
class Drain:
    reply: Reply


@dataclass(frozen=True, slots=True)
class Redrive:
    """Re-enqueue the given dead letters (by sequence), or all when None."""

    sequences: frozenset[int] | None
    reply: Reply


@dataclass(frozen=True, slots=True)
class Purge:
    reply: Reply


@dataclass(frozen=True, slots=True)
class Deliver:
    """Source instance → target: a follow-up from the source's outbox."""

    source: int
    oseq: int
    record: OutboxRecord


@dataclass(frozen=True, slots=True)
class Delivered:
    """Target → source: the follow-up ``oseq`` is durable in the target's queue."""

    oseq: int
