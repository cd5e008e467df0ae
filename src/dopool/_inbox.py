"""An instance actor's inbox: pykka's FIFO of envelopes, plus what the engine needs of it.

Plugged into pykka through its extension point for an actor's inbox
(``_create_actor_inbox``). Besides ``put``, ``get`` and ``empty``, it can take
the enqueues waiting at its head in one step (so that they share one
transaction) and hand everything still waiting to a restarted actor. It is the
only module that reads pykka's envelopes. :class:`GreenInbox` is the greenlet
backend's (docs/design.md, "Actors as greenlets"), and :class:`Future` the
instance actors' pykka future, for both backends.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import pykka


class Inbox:
    """A first-in, first-out queue of pykka envelopes, for one actor."""

    __slots__ = ("_items", "_ready")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._ready = threading.Condition(threading.Lock())

    def put(self, envelope: Any, /) -> None:
        with self._ready:
            self._items.append(envelope)
            self._ready.notify_all()  # the actor, and anyone in wait_for

    def get(self) -> Any:
        """The next envelope, waiting for one if none is there."""
        with self._ready:
            while not self._items:
                self._ready.wait()
            return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def take_leading(self, kind: type) -> list[Any]:
        """Remove and return the messages of type ``kind`` at the head, in order.

        Only a run at the head is taken, so none overtakes a message of another
        kind sent before it. Meant for the actor itself, the only reader.
        """
        items = self._items
        # Others only append, so a head seen here stays the head: most calls find
        # none to take, and need no lock to say so.
        if not items or type(items[0].message) is not kind:
            return []
        taken = []
        with self._ready:
            while items and type(items[0].message) is kind:
                taken.append(items.popleft().message)
        return taken

    def drain(self) -> tuple[list[Any], list[pykka.Future[Any]]]:
        """Remove everything still waiting: the messages told, in order, and the futures
        of the requests asked (only ``close()`` asks: pykka's stop request)."""
        with self._ready:
            envelopes = list(self._items)
            self._items.clear()
        told = [envelope.message for envelope in envelopes if envelope.reply_to is None]
        asked = [envelope.reply_to for envelope in envelopes if envelope.reply_to is not None]
        return told, asked

    def wait_for(self, holds: Callable[[list[Any]], bool], timeout: float | None) -> bool:
        """Wait until ``holds(messages waiting)``; False on timeout (tests use it)."""
        with self._ready:
            return self._ready.wait_for(
                lambda: holds([envelope.message for envelope in self._items]), timeout
            )


class Tasks(Protocol):
    """What a :class:`GreenInbox` needs of its scheduler (:class:`dopool._green.Scheduler`)."""

    def current(self) -> object:
        """The running task (a greenlet)."""
        ...

    def park(self, what: object) -> None:
        """Switch away from the running task until it is woken; ``what`` it waits for."""
        ...

    def wake(self, task: object) -> None:
        """Make ``task`` runnable (never switches)."""
        ...

    def latch(self, what: object = "") -> Any:
        """A closed latch of the scheduler's (see :class:`dopool._backend.Latch`)."""
        ...

    #: A Ctrl-C waits for the driver, which raises it once the running task parks.
    interrupted: bool


class GreenInbox(Inbox):
    """An inbox whose reader is a greenlet: an empty inbox parks it instead of blocking.

    Every putter runs on the reader's thread, so nothing here needs a lock: a put
    appends, and wakes the reader if it waits (waking never switches). A future
    put with a request (pykka's ``ask``, which only ``close()`` uses: the stop
    request) is bound to the scheduler, so that waiting for it runs the actors.
    """

    __slots__ = ("_reader", "_tasks")

    def __init__(self, tasks: Tasks) -> None:
        super().__init__()
        self._tasks = tasks
        self._reader: object | None = None

    def put(self, envelope: Any, /) -> None:
        reply_to = envelope.reply_to
        if isinstance(reply_to, Future):
            reply_to.bind(self._tasks.latch(f"the stop of an actor ({reply_to!r})"))
        self._items.append(envelope)
        reader = self._reader
        if reader is not None:
            self._reader = None
            self._tasks.wake(reader)

    def get(self) -> Any:
        items = self._items
        while not items:
            self._reader = self._tasks.current()
            self._tasks.park("a message")
        return items.popleft()

    def empty(self) -> bool:
        """Also False while a Ctrl-C waits for the driver: an actor going on with its due
        work (which asks this) stops at the next outcome and parks, so the driver raises
        the KeyboardInterrupt at once, not after the whole queue."""
        return not self._items and not self._tasks.interrupted

    def take_leading(self, kind: type) -> list[Any]:
        items = self._items
        taken = []
        while items and type(items[0].message) is kind:
            taken.append(items.popleft().message)
        return taken

    def drain(self) -> tuple[list[Any], list[pykka.Future[Any]]]:
        envelopes = list(self._items)
        self._items.clear()
        told = [envelope.message for envelope in envelopes if envelope.reply_to is None]
        asked = [envelope.reply_to for envelope in envelopes if envelope.reply_to is not None]
        return told, asked

    def wait_for(self, holds: Callable[[list[Any]], bool], timeout: float | None) -> bool:
        """Whether ``holds(messages waiting)`` now: nothing else runs while the caller checks."""
        return holds([envelope.message for envelope in self._items])


class Future(pykka.Future[Any]):
    """An instance actor's future (pykka's extension point ``_create_future``), for both
    backends: it waits on a latch, an OS lock until a :class:`GreenInbox` binds it to
    its scheduler's. Only ``close()`` asks an instance actor anything (to stop).
    """

    def __init__(self) -> None:
        super().__init__()
        self._latch: Any = _closed_lock()
        self._done = False
        self._value: Any = None
        self._exc_info: Any = None

    def bind(self, latch: Any) -> None:
        """Wait on ``latch`` instead (before anyone waits or answers)."""
        if not self._done:
            self._latch = latch

    def get(self, *, timeout: float | None = None) -> Any:
        if self._get_hook is not None:
            return super().get(timeout=timeout)
        if not self._latch.acquire(timeout=-1 if timeout is None else timeout):
            raise pykka.Timeout(f"{timeout} seconds")
        self._latch.release()  # so that a later get() sees the answer at once
        if self._exc_info is not None:
            _, value, traceback = self._exc_info
            raise value.with_traceback(traceback)
        return self._value

    def set(self, value: Any = None) -> None:
        self._answer(value, None)

    def set_exception(self, exc_info: Any = None) -> None:
        self._answer(None, sys.exc_info() if exc_info is None else exc_info)

    def _answer(self, value: Any, exc_info: Any) -> None:
        if self._done or self._get_hook is not None:
            raise queue.Full  # as pykka's ThreadingFuture
        self._done = True
        self._value, self._exc_info = value, exc_info
        self._latch.release()


def _closed_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock
