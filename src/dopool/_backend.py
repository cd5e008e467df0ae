"""How the engine's actors run and wait: the threads backend, and what a backend provides.

A clock carries a backend (``clock.backend``). Under the real clock, and by
default under a simulated one, every instance actor runs on an OS thread of its
own (pykka's ``ThreadingActor``) and waits by blocking that thread. The
greenlet backend (:mod:`dopool._green`) runs every actor of a simulated runtime
as a greenlet on the one thread that drives the clock. Everything that waits
asks the backend for its primitives, so the same code runs on both:

- :meth:`Backend.latch`: a one-shot gate, made closed and opened once by
  ``release()``; ``acquire()`` waits for it. Replies, a turn's hand-over and a
  handler's sleep in virtual time wait on one.
- :meth:`Backend.inbox`: an instance actor's inbox (pykka's extension point).
- :attr:`Backend.runner`: what runs the actor loops, if the backend does
  (else pykka starts a thread for each).
- :meth:`Backend.local`: what each actor (thread or greenlet) sees of its own,
  such as the instance it acts for (its ``instance``; :meth:`Backend.acting` asks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from dopool._inbox import Inbox


class Latch(Protocol):
    """A one-shot gate: made closed, opened once by ``release``; ``acquire`` waits for it.

    A ``threading.Lock`` acquired at creation is one, for OS threads.
    """

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...

    def release(self) -> None: ...


class Local(Protocol):
    """Attributes of the running actor's own (a ``threading.local`` for threads)."""

    def __getattribute__(self, name: str, /) -> Any: ...

    def __setattr__(self, name: str, value: Any, /) -> None: ...


def closed_lock(what: str = "") -> threading.Lock:
    """A latch for OS threads: a lock, held from the start, released by the answer."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class Runner(Protocol):
    """What a backend that runs the actors itself does for the engine."""

    def spawn(self, run: Callable[[], object], name: str) -> None:
        """Run ``run`` (an actor's loop) as the actor ``name``."""

    def drive(self, until: Callable[[], bool] | None, what: object) -> bool:
        """Run actors until ``until()``, or until none can run (``until=None``); whether
        it holds."""

    def stalled(self, cause: str) -> Exception:
        """The error for a wait that :meth:`drive` found no actor able to end."""


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
        return self._made(threading.local())

    def _made(self, local: Local) -> Local:
        self._locals = (*self._locals, local)
        return local

    def acting(self) -> bool:
        """Whether the caller acts for an instance now: a handler, a hook or a subscriber
        (a :meth:`local` of this backend has its ``instance`` set), of any runtime."""
        return any(getattr(local, "instance", None) is not None for local in self._locals)
