"""The greenlet backend: every actor of a simulated runtime as a greenlet on one thread.

Under ``SimulatedClock(backend="greenlet")`` each instance actor's loop runs as a
greenlet (a *task*) on the thread that drives the clock. A task runs until it
waits, and it waits at exactly these points, where it *parks*
(switches back to the driver):

- its inbox is empty (:class:`GreenInbox`);
- a latch it waits on is closed (:class:`GreenLatch`): a reply from another
  instance, an instance's turn, a handler's ``ctx.sleep`` in virtual time;
- its loop ends (the actor stopped);
- and only once the driver's wall-clock deadline has passed (``join(timeout=...)``), a
  :meth:`Scheduler.checkpoint`: between two events an instance starts in one message,
  and at each turn of an async handler's loop that does not sleep, so that handlers
  that keep busy at one virtual time for ever cannot keep the driver from giving up (a
  closing runtime then abandons what it gave up on: :meth:`Scheduler.abandon`).

Waking a task (an inbox put, a latch released) only queues it: it never
switches. The driver (the thread's own code: the caller of ``enqueue``,
``join``, ``run_until``...) runs the queued tasks with :meth:`Scheduler.drive`,
first queued first run, each until it parks, until what it waits for holds or
no task can run. So the system is quiescent exactly when the queue is empty,
and an interleaving is a function of the calls made and the seed alone.

When no task can run and what the driver waits for does not hold, nothing ever
will without the clock moving: :meth:`Scheduler.stalled` names who waits for
what in a :class:`~dopool.SimulationStalledError`.

Ctrl-C (SIGINT) runs Python's handler in whatever greenlet runs on the main thread,
which is most often a task: a handler would take its KeyboardInterrupt for a failure,
and the engine for a crash, and the program would go on. So while a scheduler lives
on the main thread, SIGINT's default handler is replaced by one that, inside a task,
only marks the interrupt: the driver raises KeyboardInterrupt once that task parks
(a second Ctrl-C meanwhile is raised where it lands, to break a handler that never
parks). Outside the tasks it raises at once, as Python's own does.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import greenlet
import pykka

from dopool._clock.threads import Backend, Future, Inbox, Local
from dopool._errors import SimulationStalledError

IDLE = "a message"  # what an idle actor waits for: not a stall


class _Task(greenlet.greenlet):  # type: ignore[misc]  # greenlet's class is not typed as a base
    """An actor loop running as a greenlet, and what it waits for while parked."""

    def __init__(self, run: Callable[[], object], name: str, scheduler: Scheduler) -> None:
        super().__init__(run)
        self.name = name
        self.scheduler = scheduler
        self.waiting: object = None  # what it waits for (its str() says), while parked
        self.queued = False
        self.abandoned = False  # never run again (see Scheduler.abandon)


class GreenLatch:
    """A one-shot gate for tasks and the driver (the greenlet form of a held lock).

    A task that acquires it while closed parks until ``release``; the driver
    runs the tasks until it opens. It stays open: every later ``acquire`` passes.
    """

    __slots__ = ("_open", "_scheduler", "_waiters", "what")

    def __init__(self, scheduler: Scheduler, what: object) -> None:
        self._scheduler = scheduler
        self._open = False
        self._waiters: list[_Task] = []
        self.what = what

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._open:
            return True
        if not blocking or timeout == 0:
            return False
        scheduler = self._scheduler
        task = greenlet.getcurrent()
        if isinstance(task, _Task):
            self._waiters.append(task)
            while not self.is_open():
                scheduler.park(self.what)
            return True
        if scheduler.drive(self.is_open, self.what):
            return True
        if timeout is not None and timeout >= 0:
            return False  # no wall time can open it: time out at once
        raise scheduler.stalled(f"the caller waits for {self.what}")

    def is_open(self) -> bool:
        return self._open

    def release(self) -> None:
        if self._open:
            return
        self._open = True
        waiters, self._waiters = self._waiters, []
        for task in waiters:
            self._scheduler.wake(task)


class TaskLocal:
    """Attributes of the running greenlet's own: a ``threading.local`` for tasks.

    Kept in the greenlet's own ``__dict__``, under a key of this object's, so they
    end with the greenlet.
    """

    __slots__ = ("_key",)

    def __init__(self) -> None:
        object.__setattr__(self, "_key", f"_dopool_local_{next(_locals)}")

    def __getattr__(self, name: str) -> Any:
        values: dict[str, Any] | None = greenlet.getcurrent().__dict__.get(self._key)
        if values is None or name not in values:
            raise AttributeError(name)
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        own = greenlet.getcurrent().__dict__
        values = own.get(self._key)
        if values is None:
            values = own[self._key] = {}
        values[name] = value


_locals = itertools.count()  # each TaskLocal's key: never reused, unlike id()


class Scheduler:
    """Runs tasks on one thread, first queued first run, until the driver's wait is over.

    Why first in, first out: a task is queued when something it waits for
    happens (a message, an answer, the turn, its wake-up), and everything that
    happens runs on one thread, so the queue's order is the program's own
    order of events: the same calls and seed give the same order, without
    ranking the tasks. It is also fair: a task that keeps waking others cannot
    keep them waiting, and a chain of messages runs in the order it was sent,
    as it would with one thread per actor.
    """

    def __init__(self) -> None:
        self._home = threading.get_ident()
        #: The tasks that can run, first to run first (read it; only wake() adds).
        self.runnable: deque[_Task] = deque()
        self._tasks: dict[_Task, None] = {}  # the live tasks, in the order they started
        self._abandoned: list[_Task] = []  # given up on: never run again
        self._driver: Any = None  # the greenlet running drive(), while it does
        self._deadline: float | None = None  # its bound on wall time (time.monotonic())
        #: Describes what else waits (the clock's sleepers, its next time), for stalls.
        self.describe: Callable[[], list[str]] = list
        #: A Ctrl-C came while a task ran: the driver raises it when the task parks.
        self.interrupted = False
        _hold_interrupts(self)

    # -- the tasks' side -----------------------------------------------------
    def current(self) -> object:
        return greenlet.getcurrent()

    def spawn(self, run: Callable[[], object], name: str) -> None:
        self.check_thread()
        task = _Task(run, name, self)
        self._tasks[task] = None
        self.wake(task)

    def wake(self, task: object) -> None:
        assert isinstance(task, _Task)
        if not task.queued and not task.abandoned:
            task.queued = True
            self.runnable.append(task)

    def park(self, what: object) -> None:
        """Switch from the running task to the driver until the task is woken."""
        task = greenlet.getcurrent()
        if not isinstance(task, _Task) or task.scheduler is not self:
            raise RuntimeError(f"only an actor of this runtime can wait for {what} here")
        task.waiting = what
        try:
            self._driver.switch()
        finally:
            task.waiting = None

    def latch(self, what: object = "") -> GreenLatch:
        return GreenLatch(self, what)

    def checkpoint(self) -> None:
        """For a task that goes on without parking (an instance starting event after event
        in one message): once the driver's deadline has passed, switch back to it, first in
        line to run again, so that the driver can give up; otherwise nothing happens, and
        nothing runs in between."""
        if not self.checkpoint_due():
            return
        task = greenlet.getcurrent()
        task.queued = True
        self.runnable.appendleft(task)
        self._driver.switch()

    def checkpoint_due(self) -> bool:
        """Whether :meth:`checkpoint` would switch to the driver now: its deadline passed,
        and the caller is a task of this scheduler (not the driver, nor another's)."""
        deadline = self._deadline
        if deadline is None or time.monotonic() < deadline:
            return False
        task = greenlet.getcurrent()
        return isinstance(task, _Task) and task.scheduler is self

    # -- the driver's side ---------------------------------------------------
    def drive(
        self, until: Callable[[], bool] | None, what: object, deadline: float | None = None
    ) -> bool:
        """Run queued tasks until ``until()`` holds or none is queued; whether it holds.

        ``until=None``: until none is queued (quiescence); returns True. ``deadline``
        (``time.monotonic()``) bounds the wall time it runs them for, a drive nested in
        this one's included: the tasks never stop queueing more (handlers that enqueue
        follow-ups for ever, say) and the caller gave a timeout. A task that goes on
        without parking meets it at its :meth:`checkpoint`.

        Raises:
            RuntimeError: called from a task (a handler, hook or subscriber), or
                from another thread than the one that made the clock.
            TimeoutError: ``deadline`` passed first; the tasks stay queued, in order.
        """
        if threading.get_ident() != self._home:
            self.check_thread()
        driver = greenlet.getcurrent()
        if isinstance(driver, _Task):
            raise RuntimeError(
                f"{driver.name} would drive the simulated clock to wait for {what}: the "
                "clock is driven from outside the instances (not from a handler, hook or "
                "subscriber)"
            )
        outer, self._driver = self._driver, driver
        outer_deadline = bound = self._deadline
        if deadline is not None and (bound is None or deadline < bound):
            self._deadline = bound = deadline
        ready = self.runnable
        tasks = self._tasks
        try:
            while until is None or not until():
                if not ready:
                    return until is None
                if bound is not None and time.monotonic() >= bound:
                    raise TimeoutError(f"the simulated clock was driven past its deadline ({what})")
                task = ready.popleft()
                task.queued = False
                if task.dead or task.abandoned:
                    continue
                if task.parent is not driver:
                    task.parent = driver
                task.switch()
                if task.dead:
                    del tasks[task]
                if self.interrupted:
                    self.interrupted = False
                    raise KeyboardInterrupt
            return True
        finally:
            self._driver = outer
            self._deadline = outer_deadline

    def abandon(self, name: str) -> None:
        """Never run the task ``name`` again: a closing runtime gave up waiting for it (a
        handler that never returns, parked at a checkpoint past the deadline, say). It
        stays suspended, kept as long as the scheduler, as the live tasks are (a greenlet
        collected while suspended is sent ``GreenletExit``, which would run its end)."""
        for task in [task for task in self._tasks if task.name == name]:
            task.abandoned = True
            del self._tasks[task]
            self._abandoned.append(task)
        ready = self.runnable  # (the clock keeps this deque: changed in place)
        kept = [task for task in ready if not task.abandoned]
        if len(kept) < len(ready):
            ready.clear()
            ready.extend(kept)

    def idle(self) -> bool:
        """Whether no task can run."""
        return not self.runnable

    def waits(self) -> list[tuple[str, str]]:
        """Each parked task that waits for something other than a message, and what."""
        return [
            (task.name, str(task.waiting))
            for task in self._tasks
            if task.waiting is not None and task.waiting != IDLE
        ]

    def stalled(self, cause: str) -> SimulationStalledError:
        """The error for a wait that no task can end: ``cause``, and who waits for what."""
        return SimulationStalledError(cause, tuple(self.waits()), tuple(self.describe()))

    def check_thread(self) -> None:
        """Raise RuntimeError unless called on the thread that made the scheduler."""
        if threading.get_ident() != self._home:
            raise RuntimeError(
                "a simulated clock with backend='greenlet' runs every actor on the thread "
                "that made it; call the runtime from that thread only"
            )


_holders = [0]  # the live schedulers that hold SIGINT (see the module docstring)


class GreenInbox(Inbox):
    """An inbox whose reader is a greenlet: an empty inbox parks it instead of blocking.

    Every putter runs on the reader's thread, so nothing here needs a lock: a put
    appends, and wakes the reader if it waits (waking never switches). A future
    put with a request (pykka's ``ask``, which only ``close()`` uses: the stop
    request) is bound to the scheduler, so that waiting for it runs the actors.
    """

    __slots__ = ("_reader", "_tasks")

    def __init__(self, tasks: Scheduler) -> None:  # (no super(): it would make a condition
        self._items = deque()  # that nothing here uses, some 1 KiB per instance running)
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

    def take_leading(self, kinds: tuple[type, ...]) -> list[Any]:
        items = self._items
        taken = []
        while items and type(items[0].message) in kinds:
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


def _on_interrupt(signum: int, frame: Any) -> None:
    """SIGINT: inside a task, held for its driver (once); elsewhere Python's own."""
    task = greenlet.getcurrent()
    if isinstance(task, _Task) and not task.scheduler.interrupted:
        task.scheduler.interrupted = True
        return
    signal.default_int_handler(signum, frame)


def _hold_interrupts(scheduler: Scheduler) -> None:
    """Have SIGINT held for the driver while ``scheduler`` lives, if it runs on the main
    thread and SIGINT's handler is Python's default (or already this module's)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_interrupt)
    if signal.getsignal(signal.SIGINT) is _on_interrupt:
        _holders[0] += 1
        weakref.finalize(scheduler, _release_interrupts)


def _release_interrupts() -> None:
    """A holding scheduler is gone: the last one gives SIGINT back to Python's handler."""
    _holders[0] -= 1
    main = threading.current_thread() is threading.main_thread()
    if not _holders[0] and main and signal.getsignal(signal.SIGINT) is _on_interrupt:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class GreenletBackend(Backend):
    """Every actor a greenlet on the thread that drives the clock (see the module docstring)."""

    name = "greenlet"

    def __init__(self) -> None:
        super().__init__()
        self._keys: tuple[str, ...] = ()  # each TaskLocal's made here (see ``acting``)
        self.scheduler = Scheduler()
        self.runner = self.scheduler

    def latch(self, what: object = "") -> GreenLatch:
        return self.scheduler.latch(what)

    def waiter(self, what: str) -> Callable[[], GreenLatch]:
        return partial(self.scheduler.latch, what)

    def inbox(self) -> Inbox:
        return GreenInbox(self.scheduler)

    def checkpoint(self) -> None:
        self.scheduler.checkpoint()

    def checkpoint_due(self) -> bool:
        return self.scheduler.checkpoint_due()

    def local(self) -> Local:
        local = TaskLocal()
        self._keys = (*self._keys, local._key)
        return local

    def acting(self) -> bool:
        """As the threads backend's, without a ``TaskLocal`` lookup per local: a task always
        acts for its instance; the driver's greenlet does while one's ``instance`` is set."""
        current = greenlet.getcurrent()
        if isinstance(current, _Task):
            return True
        own = current.__dict__
        if not own:  # the usual driver: it never acted for an instance
            return False
        return any((own.get(key) or {}).get("instance") is not None for key in self._keys)
