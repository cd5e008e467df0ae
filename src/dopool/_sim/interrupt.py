"""Ctrl-C during a run: noted by a signal handler, acted on between two steps of the clock.

Python raises :class:`KeyboardInterrupt` in whatever code runs when SIGINT
comes. In a simulation that is mostly an actor's code or a handler's (a greenlet
on the driving thread), where the engine takes it for a failed attempt or a
crash and goes on: the run went on and printed tracebacks. So while a run drives
its clock, SIGINT only sets a flag, and the driver raises ``KeyboardInterrupt``
between two steps, from where closing the runtime and removing the temporary
store follow. A second SIGINT before that (a handler stuck in ``time.sleep`` or
on a lock, which keeps the driver from its next step) raises at once, wherever it
lands: that attempt fails, and the driver stops after it.

A sweep's worker processes ignore SIGINT between runs (:func:`ignore_between_runs`)
and take it as above during one, so Ctrl-C in a terminal, which reaches every
process of the group, stops each run where it is and leaves no traceback.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_worker = False  # a sweep's worker process: SIGINT is ignored between runs


class Interrupt:
    """Whether SIGINT came during the run; :meth:`check` raises if it did."""

    requested = False

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if SIGINT came since the run started."""
        if self.requested:
            raise KeyboardInterrupt


@contextmanager
def interruptible() -> Iterator[Interrupt]:
    """SIGINT sets the yielded :class:`Interrupt` while this lasts (the second raises).

    Only in the main thread, and only where SIGINT would raise ``KeyboardInterrupt``
    (or in a sweep's worker): a caller's own handler, or SIG_IGN, is left alone.
    """
    interrupt = Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield interrupt
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler and not _worker:
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


def ignore_between_runs() -> None:
    """A sweep's worker process: SIGINT stops a run (:func:`interruptible`), and is
    ignored while the worker waits for the next one."""
    global _worker  # noqa: PLW0603 - one flag per process, set once at its start
    _worker = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
