"""Ctrl-C during a run: noted by a signal handler, acted on between two steps of the clock.

Python raises :class:`KeyboardInterrupt` in whatever code runs when SIGINT
comes. In a simulation that is mostly an actor's code or a handler's (a greenlet
on the driving thread), where the engine takes it for a failed attempt or a
crash and goes on: the run went on, printing tracebacks. So while a run drives
its clock, SIGINT only sets a flag, and the driver raises ``KeyboardInterrupt``
between two steps, from where closing the runtime and removing the temporary
store follow. A second SIGINT before that (a handler stuck in ``time.sleep`` or
on a lock keeps the driver from its next step) raises at once, wherever it
lands: that attempt fails, and the driver stops after it.

A sweep's worker process (:func:`worker_setup`) notes SIGINT for good, whenever it
comes: the run in hand stops, and every later one stops before it starts. So
Ctrl-C in a terminal, which reaches every process of the group, and the SIGINT
the sweep's own process sends its workers, stop the sweep and print no traceback.

A Ray task (:func:`worker_task`) runs in a worker process that serves many, and Ray's
cancel reaches it as SIGINT: it stops that task's run the same way, and no later one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from types import FrameType
from typing import Any


class Interrupt:
    """Whether SIGINT came during the run; :meth:`check` raises if it did."""

    def __init__(self) -> None:
        self.requested = False

    def asked(self) -> bool:
        """Whether SIGINT came: the driver stops driving the clock."""
        return self.requested

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if SIGINT came."""
        if self.requested:
            raise KeyboardInterrupt


_worker: Interrupt | None = None  # a sweep's worker process: one for all its runs


@contextmanager
def interruptible() -> Iterator[Interrupt]:
    """SIGINT sets the yielded :class:`Interrupt` while this lasts (the second raises).

    Only in the main thread, and only where SIGINT would raise ``KeyboardInterrupt``:
    a caller's own handler, or SIG_IGN, is left alone (the interrupt never comes).
    """
    if _worker is not None:
        yield _worker
        return
    interrupt = Interrupt()
    previous = signal.getsignal(signal.SIGINT)
    main = threading.current_thread() is threading.main_thread()
    if not main or previous is not signal.default_int_handler:
        yield interrupt
        return

    def note(signum: int, frame: FrameType | None) -> None:
        if interrupt.requested:
            raise KeyboardInterrupt
        interrupt.requested = True

    signal.signal(signal.SIGINT, note)
    try:
        yield interrupt
    finally:
        signal.signal(signal.SIGINT, previous)


def worker_setup() -> None:
    """A sweep's worker process: SIGINT stops its run, and every later one."""
    global _worker  # noqa: PLW0603 - once, as the worker process starts
    interrupt = _worker = Interrupt()

    def note(signum: int, frame: FrameType | None) -> None:
        interrupt.requested = True

    signal.signal(signal.SIGINT, note)


@contextmanager
def worker_task() -> Iterator[Interrupt]:
    """One task in a worker process that runs many (a Ray task): SIGINT, which Ray's
    cancel sends, stops this task's run between two steps of the clock (every run
    inside it takes the yielded :class:`Interrupt`), and no later task's."""
    global _worker  # noqa: PLW0603 - for this task only, restored after it
    interrupt = Interrupt()
    outer, _worker = _worker, interrupt
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT)

    def note(signum: int, frame: FrameType | None) -> None:
        interrupt.requested = True

    if main:
        signal.signal(signal.SIGINT, note)
    try:
        yield interrupt
    finally:
        _worker = outer
        if main:
            signal.signal(signal.SIGINT, previous)


def interrupt_workers(executor: ProcessPoolExecutor) -> None:
    """SIGINT to each of a sweep's worker processes: each stops its run, and every later one."""
    processes: dict[int, Any] = getattr(executor, "_processes", None) or {}  # no public list
    for process in list(processes.values()):
        with contextlib.suppress(OSError, TypeError):  # gone already, or not started
            os.kill(process.pid, signal.SIGINT)
