"""Where ``async def`` handlers run: the real clock's loop thread, or a loop in virtual time.

A coroutine an instance runs is always waited for by that instance: its actor blocks
until the coroutine ends, so one attempt per instance runs at a time, as with a plain
handler, and the engine commits the outcome on the instance's own thread or greenlet.

- Under the real clock (:class:`LoopThread`), every coroutine of a clock runs on one
  event loop in one daemon thread of the clock's, started when first needed. One loop,
  not one per instance: a thousand instances awaiting I/O cost one thread's loop, and
  what a loop binds (an HTTP client's or a database driver's connection pool) is shared
  by every handler of the runtime.
- Under a simulated clock (:func:`run_virtual`), the instance runs the coroutine itself,
  on a loop of its own for the attempt (:class:`VirtualLoop`) whose time is the clock's:
  when no callback is ready, the loop sleeps in virtual time (``clock.sleep``) until its
  next timer, so ``asyncio.sleep`` and every timeout move with the simulation and other
  actors run meanwhile. It opens no file descriptor and does no I/O.

Under both, a task the handler started and left running is cancelled when its attempt
ends (:func:`spawned_by`): nothing of an attempt outlives it, which keeps the clocks alike.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import threading
from collections.abc import Callable, Coroutine, Generator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from typing import Any, TypeVar, TypeVarTuple

from dopool._clock.threads import Backend
from dopool._errors import SimulationStalledError

logger = logging.getLogger("dopool.attempts")

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: What a coroutine run here gives: its value, or what it raised (a BaseException too).
Settled = tuple[Any, BaseException | None]

# The tasks started inside one attempt's coroutine (its context carries the set).
_spawned: contextvars.ContextVar[set[asyncio.Task[Any]] | None] = contextvars.ContextVar(
    "dopool_spawned", default=None
)


async def _settle(coroutine: Coroutine[Any, Any, Any]) -> Settled:
    """``coroutine``'s value or exception, never raised: a KeyboardInterrupt or SystemExit
    out of a task would stop the loop, and with it every other instance's handler."""
    try:
        return await coroutine, None
    except BaseException as exc:  # a handler's, handed to its attempt
        if exc.__traceback__ is not None:  # from the handler's frame on, not this one's
            exc.__traceback__ = exc.__traceback__.tb_next
        return None, exc


def _task_factory(
    loop: asyncio.AbstractEventLoop,
    coroutine: Coroutine[Any, Any, T] | Generator[Any, None, T],
    /,
    **kwargs: Any,
) -> asyncio.Task[T]:
    """Make a task as the loop would, noted in its attempt's set if one started it."""
    task = asyncio.Task(coroutine, loop=loop, **kwargs)
    context: contextvars.Context | None = kwargs.get("context")
    owner = (context or contextvars.copy_context()).get(_spawned)
    if owner is not None:
        owner.add(task)
    return task


def _run_to_end(loop: VirtualLoop, task: asyncio.Task[Settled]) -> Settled:
    """Run ``loop`` until ``task`` (a :func:`_settle`) ends, as the loop thread runs its
    loop: a BaseException out of another callback is logged and the loop goes on."""
    while True:
        try:
            loop.run_until_complete(task)
        except SimulationStalledError as exc:  # from the selector: nothing can move
            return None, exc
        except BaseException:  # a callback's or task's, raised out of the loop's run
            if not task.done():
                logger.exception("a task of an async handler stopped its event loop")
                continue
        try:
            return task.result()
        except BaseException as exc:  # cancelled before it began, by another task
            return None, exc


def _cancel_left(spawned: set[asyncio.Task[Any]]) -> None:
    """Cancel the tasks an attempt left running (on the loop's thread)."""
    for task in spawned:
        if not task.done():
            task.cancel()


class LoopThread:
    """The real clock's event loop, on a daemon thread of its own (see the module)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.set_task_factory(_task_factory)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="dopool-asyncio", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        while not self._closing:
            try:
                self._loop.run_forever()
            except BaseException:  # a task's KeyboardInterrupt, say: the loop goes on
                logger.exception("a task of an async handler stopped dopool's event loop")
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def run(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Settled:
        """Run ``make()`` on the loop, in a copy of the caller's context (its span, the
        instance it acts for), and wait for it to end; what it gave or raised."""
        context = contextvars.copy_context()
        spawned: set[asyncio.Task[Any]] = set()
        context.run(_spawned.set, spawned)
        done: Future[Settled] = Future()

        def start() -> None:
            try:
                task = self._loop.create_task(_settle(context.run(make)), context=context)
            except BaseException as exc:  # ``make`` is the user's callable
                done.set_result((None, exc))
                return
            task.add_done_callback(finish)

        def finish(task: asyncio.Task[Settled]) -> None:
            try:
                settled = task.result()
            except BaseException as exc:  # cancelled before it began, by another task
                settled = None, exc
            _cancel_left(spawned)
            done.set_result(settled)

        self._loop.call_soon_threadsafe(start)
        return done.result()

    def close(self) -> None:
        """Stop the loop and wait for its thread (a handler blocking it is not waited for:
        the thread is a daemon, and an abandoned attempt's instance is recovered later)."""
        self._closing = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=1.0)


class _VirtualWaits:
    """A :class:`VirtualLoop`'s selector: no file descriptors; a wait is a virtual sleep,
    or, while a thread the loop started runs, a real wait for it."""

    def __init__(self, sleep: Callable[[float], None], backend: Backend | None) -> None:
        self._sleep = sleep
        self._backend = backend  # the clock's: its checkpoint, for a turn that does not sleep
        self._woken = threading.Event()  # a thread called into the loop
        self.threads = 0  # executor calls not finished yet

    def wake(self) -> None:
        self._woken.set()

    def select(self, timeout: float | None) -> list[Any]:
        if timeout == 0 or self._woken.is_set():
            self._woken.clear()
            backend = self._backend
            if backend is not None and backend.checkpoint_due():
                # A handler that awaits only what is ready (``asyncio.sleep(0)`` in a loop)
                # never sleeps in virtual time: the driver, past its deadline, takes over.
                with _outside_loops():
                    backend.checkpoint()
            return []
        if self.threads:  # a thread's work takes no virtual time: wait for it first
            self._woken.wait()
            self._woken.clear()
            return []
        if timeout is None:
            raise SimulationStalledError(
                "an async handler awaits what nothing in virtual time will bring (no timer, "
                "no task that can run, no thread of loop.run_in_executor or asyncio.to_thread)"
            )
        with _outside_loops():
            self._sleep(timeout)
        return []


@contextmanager
def _outside_loops() -> Generator[None]:
    """Look like no loop runs on this thread until the block ends, then as before: while a
    virtual loop sleeps, another greenlet of the thread may run a loop of its own, and a
    virtual loop may run while the thread's driver is inside one (a simulated runtime
    driven from a coroutine). The running loop and async generator hooks are per thread."""
    loop = asyncio.events._get_running_loop()
    hooks = sys.get_asyncgen_hooks()
    asyncio.events._set_running_loop(None)
    try:
        yield
    finally:
        sys.set_asyncgen_hooks(*hooks)
        asyncio.events._set_running_loop(loop)


class VirtualLoop(asyncio.BaseEventLoop):
    """An event loop whose time is a simulated clock's (see the module docstring)."""

    # Timers this close to due run: a virtual sleep lands on the timer's time, give or
    # take the rounding of a large clock time.
    _clock_resolution = 1e-6

    def __init__(
        self,
        now: Callable[[], float],
        sleep: Callable[[float], None],
        backend: Backend | None = None,
    ) -> None:
        super().__init__()
        self._now = now
        self._waits = _VirtualWaits(sleep, backend)
        self._selector = self._waits  # what BaseEventLoop._run_once waits on
        self.set_task_factory(_task_factory)

    def time(self) -> float:
        return self._now()

    def _write_to_self(self) -> None:
        self._waits.wake()

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*Ts], T], *args: *Ts
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._waits.threads += 1

        def finished(_: object) -> None:
            self._waits.threads -= 1

        future.add_done_callback(finished)
        return future


def run_virtual(
    make: Callable[[], Coroutine[Any, Any, Any]],
    now: Callable[[], float],
    sleep: Callable[[float], None],
    backend: Backend | None = None,
) -> Settled:
    """Run ``make()`` to its end on a :class:`VirtualLoop` of the caller's own; what it
    gave or raised. Tasks it left running are cancelled and given one pass of the loop to
    end; its executor's threads are not waited for. ``backend``: the clock's, whose
    checkpoint each turn of the loop that does not sleep meets."""
    with _outside_loops():
        return _run_virtual(make, now, sleep, backend)


def _run_virtual(
    make: Callable[[], Coroutine[Any, Any, Any]],
    now: Callable[[], float],
    sleep: Callable[[float], None],
    backend: Backend | None,
) -> Settled:
    loop = VirtualLoop(now, sleep, backend)
    spawned: set[asyncio.Task[Any]] = set()
    token = _spawned.set(spawned)
    try:
        try:
            coroutine = make()
        except BaseException as exc:  # ``make`` is the user's callable
            return None, exc
        settled = _run_to_end(loop, loop.create_task(_settle(coroutine)))
        _cancel_left(spawned)
        loop.call_soon(loop.stop)  # one pass: the cancelled tasks see CancelledError
        loop.run_forever()
        return settled
    finally:
        _spawned.reset(token)
        loop.close()  # (its default executor shut down without waiting)
