"""The store's writer lock: one process at a time writes, by ``flock``.

LMDB serialises writers with a mutex in its lock file, robust against a holder that
dies. But when a holder is SIGKILLed while other processes wait for that mutex, the
waiters may never be woken (a lost wake-up in the robust mutex's hand-over): with
py-lmdb alone, four processes committing in a loop and one killed left two of the
others asleep in ``futex_wait`` in 7 of 40 runs, until a signal woke them
(``dopool chaos --processes`` found it as producers hung after a worker's SIGKILL).

So every write transaction of a store that other processes may write (a runtime on a
real clock, a connection, the command line's) first takes an exclusive ``flock`` on
``<store>/writer.lock``. The kernel releases it when its holder dies and wakes the
next waiter, so at most one process ever waits on LMDB's mutex, and none sleeps
through a dead holder (0 of 40 runs, the same test). Within a process a thread lock
goes first: ``flock`` locks belong to the open file, which the process's threads
share, so it would not keep them apart. A runtime on a simulated clock writes
without it: its store is not shared with live writers (docs/deployment.md).

A child made with ``os.fork`` shares the parent's open file, and with it the lock: if
the parent died holding it, the child would keep it held for as long as it lives, and
every other writer of the store would wait for ever. So the child closes its copy as
it starts (:func:`os.register_at_fork`); it never writes with the parent's lock.
"""

from __future__ import annotations

import fcntl
import os
import threading
import weakref
from contextlib import suppress
from pathlib import Path

#: The writer lock's file, in the store directory.
WRITER_LOCK = "writer.lock"


class WriterLock:
    """One process's side of the store's writer lock: ``with lock:`` around a write.

    Raises:
        OSError: the lock file cannot be opened or created.
    """

    __slots__ = ("__weakref__", "_fd", "_thread")

    def __init__(self, directory: Path) -> None:
        self._fd = os.open(directory / WRITER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._thread = threading.Lock()
        _open.add(self)

    def __enter__(self) -> None:
        self._thread.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # a signal's EINTR is retried (PEP 475)
        except BaseException:
            self._thread.release()
            raise

    def __exit__(self, *_exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread.release()

    def close(self) -> None:
        """Close the file (which releases the lock, if this process held it)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _open.discard(self)
            os.close(fd)


_open: weakref.WeakSet[WriterLock] = weakref.WeakSet()  # every lock not closed yet


def _close_in_child() -> None:
    """In a forked child: close the parent's lock files (the locks stay the parent's)."""
    for lock in list(_open):
        with suppress(OSError):
            lock.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)
