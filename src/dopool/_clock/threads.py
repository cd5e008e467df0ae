"""How the engine's actors run and wait: what a backend provides, and the threads backend.

A clock carries a backend (``clock.backend``). Under the real clock, and by
default under a simulated one, every instance actor runs on an OS thread of its
own (pykka's ``ThreadingActor``) and waits by blocking that thread. The
greenlet backend (:mod:`dopool._clock.greenlets`) runs every actor of a simulated runtime
as a greenlet on the one thread that drives the clock. Everything that waits
asks the backend for its primitives, so the same code runs on both:

- :meth:`Backend.latch`: a one-shot gate, made closed and opened once by
  ``release()``; ``acquire()`` waits for it. Replies, a turn's hand-over and a
  handler's sleep in virtual time wait on one.
- :meth:`Backend.inbox`: an instance actor's inbox (:class:`Inbox`, pykka's extension
  point for an actor's inbox): the only place, with the greenlet backend's, that reads
  pykka's envelopes.
- :attr:`Backend.runner`: what runs the actor loops, if the backend does
  (else pykka starts a thread for each).
- :meth:`Backend.local`: what each actor (thread or greenlet) sees of its own,
  such as the instance it acts for (its ``instance``; :meth:`Backend.acting` asks).
  Under threads it is kept per context (:class:`ContextLocal`), so an async handler's
  task, which runs on the clock's loop thread in a copy of its instance's context, acts
  for that instance as a plain handler's thread does.
"""

from __future__ import annotations

import contextvars
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import pykka

from dopool._clock.latch import Latch, closed_lock


class Local(Protocol):
    """Attributes of the running actor's own (a ``threading.local`` for threads)."""

    def __getattribute__(self, name: str, /) -> Any: ...

    def __setattr__(self, name: str, value: Any, /) -> None: ...


class ContextLocal:
    """Attributes kept in the current context: a ``threading.local`` for threads (each
    starts with a context of its own), which a task or ``asyncio.to_thread`` call inherits
    from where it was made. Set one on a copy of the values, so a context copied earlier
    keeps what it saw."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        values: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("dopool_local")
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        values = self._values.get(None)
        if values is None or name not in values:
            raise AttributeError(name)
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        self._values.set({**self._values.get({}), name: value})


class Runner(Protocol):
    """What a backend that runs the actors itself does for the engine."""

    def spawn(self, run: Callable[[], object], name: str) -> None:
        """Run ``run`` (an actor's loop) as the actor ``name``."""

    def drive(
        self, until: Callable[[], bool] | None, what: object, deadline: float | None = None
    ) -> bool:
        """Run actors until ``until()``, or until none can run (``until=None``); whether
        it holds. TimeoutError once ``deadline`` (``time.monotonic()``) passes."""

    def stalled(self, cause: str) -> Exception:
        """The error for a wait that :meth:`drive` found no actor able to end."""

    def abandon(self, name: str) -> None:
        """Never run the actor ``name`` again (a closing runtime gave up waiting for it)."""


class Backend:
    """One OS thread per actor (pykka's ``ThreadingActor``), blocking while it waits.

    The default everywhere. Its primitives are the threading module's.
    """

    name = "threads"
    #: What runs the actor loops, if the backend does (:class:`Runner`); None: pykka
    #: starts a thread for each, and a wait blocks its thread.
    runner: Runner | None = None

    def __init__(self) -> None:
        # Every local made here: one per runtime on the clock, kept (a few, and cheap to
        # read: the clock asks at each drive).
        self._locals: tuple[Local, ...] = ()

    def latch(self, what: object = "") -> Latch:
        """A closed latch; ``str(what)`` names what waiting on it waits for (in error
        reports: an object that formats itself only then costs nothing per wait)."""
        return closed_lock()

    def waiter(self, what: str) -> Callable[[], Latch] | None:
        """What makes the latches a ``Turn`` or the store's waiting writers wait on, or
        None: their own default, a held lock (this backend's latch, without a call)."""
        return None

    def inbox(self) -> Inbox:
        return Inbox()

    def local(self) -> Local:
        return self._made(ContextLocal())

    def _made(self, local: Local) -> Local:
        self._locals = (*self._locals, local)
        return local

    def acting(self) -> bool:
        """Whether the caller acts for an instance now: a handler, a hook or a subscriber
        (a :meth:`local` of this backend has its ``instance`` set), of any runtime."""
        return any(getattr(local, "instance", None) is not None for local in self._locals)

    def checkpoint(self) -> None:
        """Where an actor goes on without waiting (event after event in one message): a
        backend that runs the actors itself may take the thread back here (see
        :meth:`dopool._clock.greenlets.Scheduler.checkpoint`). A thread of its own: nothing."""

    def checkpoint_due(self) -> bool:
        """Whether :meth:`checkpoint` would take the thread back now (for a caller that must
        prepare for it: an async handler's event loop)."""
        return False


# -- the threads backend's inbox, and the instance actors' future (both backends') ---------


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

    def take_leading(self, kinds: tuple[type, ...]) -> list[Any]:
        """Remove and return the messages of the types ``kinds`` at the head, in order.

        Only a run at the head is taken, so none overtakes a message of another
        kind sent before it. Meant for the actor itself, the only reader.
        """
        items = self._items
        # Others only append, so a head seen here stays the head: most calls find
        # none to take, and need no lock to say so.
        if not items or type(items[0].message) not in kinds:
            return []
        taken = []
        with self._ready:
            while items and type(items[0].message) in kinds:
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


class Future(pykka.Future[Any]):
    """An instance actor's future (pykka's extension point ``_create_future``), for both
    backends: it waits on a latch, an OS lock until a :class:`GreenInbox` binds it to
    its scheduler's. Only ``close()`` asks an instance actor anything (to stop).
    """

    def __init__(self) -> None:
        super().__init__()
        self._latch: Latch = closed_lock()
        self._done = False
        self._value: Any = None
        self._exc_info: Any = None

    def bind(self, latch: Latch) -> None:
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
