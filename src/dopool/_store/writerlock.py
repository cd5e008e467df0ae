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

A holder that stops without dying (SIGSTOP, a debugger, a cgroup freezer) stops every
writer for as long. A producer's write waits at most its ``lock_timeout``
(:meth:`WriterLock.acquire`): ``flock`` itself has no timeout, so a contended bounded
wait is handed to a helper thread that blocks in it, and a caller that gives up leaves
the lock to that thread, which releases it as soon as it gets it. The file also holds
the host's lease clock and the holder's name (:mod:`dopool._store.leaseclock`), kept up to
date at each take and release.

A child made with ``os.fork`` shares the parent's open file, and with it the lock: if
the parent died holding it, the child would keep it held for as long as it lives, and
every other writer of the store would wait for ever. So the child closes its copy as
it starts (:func:`os.register_at_fork`); it never writes with the parent's lock.
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
import time
import weakref
from contextlib import suppress
from pathlib import Path

from dopool._errors import StoreBusyError
from dopool._store.leaseclock import LOCK_FILE, LockRecord

#: The writer lock's file, in the store directory.
WRITER_LOCK = LOCK_FILE
#: Linux's table of the file locks held and waited for.
PROC_LOCKS = Path("/proc/locks")

_monotonic = time.monotonic  # (read twice per write transaction)
# A producer that finds the lock taken tries again after these pauses (seconds; 0: the
# processor given up once) before it hands the wait to the helper thread: a commit
# holds the lock for tens of microseconds, and the hand-off costs a thread switch each
# way, more CPU than the pauses (benchmarks.md, "Producers' calls through the owner").
_RETRIES = (0.0, 20e-6, 50e-6, 100e-6, 200e-6)


class _Taking:
    """A bounded wait handed to the helper thread: it takes the lock for the caller,
    or, once the caller has given up, releases it again."""

    __slots__ = ("abandoned", "done", "error", "since")

    def __init__(self, since: float) -> None:
        self.since = since  # when the caller began to wait (monotonic)
        self.done = threading.Event()
        self.abandoned = False
        self.error: BaseException | None = None


class WriterLock:
    """One process's side of the store's writer lock: ``with lock:`` around a write.

    Raises:
        OSError: the lock file cannot be opened or created.
    """

    __slots__ = (
        "__weakref__",
        "_busy",
        "_closing",
        "_directory",
        "_fd",
        "_mutex",
        "_record",
        "_requests",
        "_thread",
    )

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._fd = os.open(directory / WRITER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            self._record = LockRecord(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        self._thread = threading.Lock()
        self._mutex = threading.Lock()  # between a bounded waiter and the helper thread
        self._requests: queue.SimpleQueue[_Taking | None] | None = None  # the helper's
        self._busy = False  # the helper is taking the lock for a caller
        self._closing = False  # closed while it was: the last release closes the file
        _open.add(self)

    def __enter__(self) -> None:
        """Take the lock, waiting as long as it takes (an engine's write: a worker's)."""
        self._thread.acquire()
        try:
            started = _monotonic()
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # a signal's EINTR is retried (PEP 475)
                self._record.taken(_monotonic(), started)
            else:
                self._record.taken(started, started)  # taken at once: one clock reading
        except BaseException:
            self._thread.release()
            raise

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def acquire(self, timeout: float | None = None) -> None:
        """Take the lock; with ``timeout``, wait at most that many seconds for it (a
        producer's write), handing a contended wait to the helper thread.

        Raises:
            StoreBusyError: ``timeout`` passed first (nothing is held then).
        """
        if timeout is None:
            self.__enter__()
            return
        started = _monotonic()
        if not self._thread.acquire(timeout=timeout):
            raise self._busy_error(_monotonic() - started)
        if self._try_take(started, timeout):
            return
        if not self._take_in_helper(started, timeout - (_monotonic() - started)):
            # The thread lock is the helper's now: it releases it with the lock.
            raise self._busy_error(_monotonic() - started)

    def _try_take(self, started: float, timeout: float) -> bool:
        """Take the lock without blocking, trying again after each of :data:`_RETRIES`
        while ``timeout`` allows; whether it was taken (the thread lock, held, is kept)."""
        try:
            for pause in (None, *_RETRIES):
                if pause is not None:
                    if _monotonic() - started + pause > timeout:
                        return False
                    time.sleep(pause)
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                self._record.taken(_monotonic(), started)
                return True
        except BaseException:
            self._thread.release()
            raise
        return False

    def release(self) -> None:
        try:
            self._record.released(_monotonic())
        finally:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                self._thread.release()
                if self._closing:
                    self._close()

    def lease_time(self) -> float:
        """The host's lease clock (:mod:`dopool._store.leaseclock`); only while holding the lock."""
        return self._record.lease_time(time.monotonic())

    def close(self) -> None:
        """Close the file (which releases the lock, if this process held it); left to the
        helper thread if it is still taking the lock for a caller that gave up."""
        with self._mutex:
            requests, self._requests = self._requests, None
            if requests is not None:
                requests.put(None)  # the helper thread ends
            if self._busy:
                self._closing = True
                return
        self._close()

    def _close(self) -> None:
        with self._mutex:
            self._closing = False
            self._close_file()

    def _close_file(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _open.discard(self)
            self._record.close()
            os.close(fd)

    def _take_in_helper(self, since: float, timeout: float) -> bool:
        """Have the helper thread wait in ``flock``; True once it holds the lock for us,
        False if ``timeout`` passed first (the helper then releases it when it gets it,
        with the thread lock this caller holds). What the helper met taking it is raised
        here, and so is what interrupted the wait (Ctrl-C): either way this caller then
        holds nothing, and neither does the process once the helper is done."""
        taking = _Taking(since)
        with self._mutex:
            if self._requests is None:
                self._requests = queue.SimpleQueue()
                threading.Thread(
                    target=self._help, args=(self._requests,), name="dopool-writer", daemon=True
                ).start()
            self._busy = True
            self._requests.put(taking)
        try:
            taking.done.wait(max(0.0, timeout))
        except BaseException:  # interrupted (Ctrl-C): hold nothing
            if not self._abandon(taking):
                self._let_go(taking)
            raise
        if self._abandon(taking):
            return False
        if taking.error is not None:
            self._thread.release()
            raise taking.error
        return True

    def _abandon(self, taking: _Taking) -> bool:
        """Give the wait up, unless the helper is done with it; whether it was given up."""
        with self._mutex:
            taking.abandoned = not taking.done.is_set()
            return taking.abandoned

    def _let_go(self, taking: _Taking) -> None:
        """Release what the helper took for a caller that no longer wants it."""
        if taking.error is None:
            self.release()
        else:
            self._thread.release()

    def _help(self, requests: queue.SimpleQueue[_Taking | None]) -> None:
        """The helper thread: take the lock for each request, one at a time."""
        while (taking := requests.get()) is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                self._record.taken(time.monotonic(), taking.since)
            except BaseException as exc:  # the file closed under it (a fork's child)
                taking.error = exc
            with self._mutex:
                self._busy = False
                abandoned = taking.abandoned
                taking.done.set()
            if not abandoned:
                continue  # the caller holds the lock now, and releases it
            self._let_go(taking)  # the record, the flock and the caller's thread lock
            if taking.error is not None and self._closing:
                self._close()

    def _busy_error(self, waited: float) -> StoreBusyError:
        """The error for a caller that waited ``waited`` seconds: who holds the lock."""
        pid, held_for = None, None
        holders = flock_holders(self._directory / WRITER_LOCK)
        named = self._record.holder()
        if named is not None and (not holders or named.pid in holders):
            pid, held_for = named.pid, time.monotonic() - named.since
        elif holders:
            pid = holders[0]
        return StoreBusyError(path=str(self._directory), waited=waited, pid=pid, held_for=held_for)


def flock_holders(path: Path) -> list[int]:
    """The pids that hold an ``flock`` on ``path``, as Linux's ``/proc/locks`` lists them
    (empty where it does not, or lists none)."""
    try:
        stat = os.stat(path)
        with open(PROC_LOCKS, encoding="ascii", errors="replace") as listing:
            table = listing.read()
    except OSError:
        return []
    return holders_in(table, (os.major(stat.st_dev), os.minor(stat.st_dev), stat.st_ino))


def holders_in(table: str, file: tuple[int, int, int]) -> list[int]:
    """The pids that hold an ``flock`` on ``file`` (its device's major and minor numbers,
    its inode) in ``table``, the text of ``/proc/locks``::

        3: FLOCK  ADVISORY  WRITE 4425 fe:00:2146309 0 EOF
        3: -> FLOCK  ADVISORY  WRITE 4431 fe:00:2146309 0 EOF    (a process waiting for it)
    """
    pids = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # a waiter's: "N: -> FLOCK ..."
            continue
        with suppress(ValueError):
            major, minor, inode = fields[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == file:
                pids.append(int(fields[4]))
    return pids


_open: weakref.WeakSet[WriterLock] = weakref.WeakSet()  # every lock not closed yet


def _close_in_child() -> None:
    """In a forked child: close the parent's lock files (the locks stay the parent's).
    No helper thread lives in the child, and a parent's thread may have held the mutex
    at the fork: the file is closed without it."""
    for lock in list(_open):
        with suppress(OSError):
            lock._close_file()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)
