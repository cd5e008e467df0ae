"""The frozen-writer fault: a process stopped (SIGSTOP) while it holds the store's writer lock.

Every write transaction of a store first takes an exclusive ``flock`` on
``<store>/writer.lock`` (:mod:`dopool._store.writerlock`), so a process frozen while it
holds that lock (by SIGSTOP, a debugger, a cgroup freezer) stops every writer of the
store until it is continued. This module finds such a moment from the kernel alone,
without any of dopool's internals: ``/proc/locks`` lists each ``flock`` with the pid
of the process that took it and the device and inode of its file::

    3: FLOCK  ADVISORY  WRITE 4425 fe:00:2146309 0 EOF
    3: -> FLOCK  ADVISORY  WRITE 4431 fe:00:2146309 0 EOF    (a process waiting for it)

:func:`catch` polls that table until its target holds the lock, stops it, waits
until the kernel reports the whole process stopped (every thread: the parent's
``waitid(WSTOPPED)``), and looks again. A stopped process releases nothing, so if it
holds the lock now it held it from before the stop to now: the freeze has landed. If
it does not (it released the lock between the look and the stop), it is continued at
once and the polling goes on. Whatever happens, a process this module stopped is
continued before :func:`catch` returns, unless it returns the freeze to its caller,
who must continue it (:func:`cont`, in a ``finally``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from dopool._store.writerlock import PROC_LOCKS, WRITER_LOCK, holders_in

LOCKS = PROC_LOCKS
STOP_WAIT = 1.0  # seconds a SIGSTOP may take to stop every thread of its target
STOP_POLL = 0.0005  # seconds between two looks at whether it stopped
NEVER = threading.Event()  # never set: what waits here waits its timeout, in real time


@dataclass(frozen=True, slots=True)
class LockFile:
    """The store's writer lock file, as ``/proc/locks`` names it: ``maj:min:inode``."""

    major: int
    minor: int
    inode: int

    @classmethod
    def of(cls, store: Path) -> LockFile:
        """The writer lock of ``store`` (its file exists once a process opened the store)."""
        st = os.stat(store / WRITER_LOCK)
        return cls(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)

    def holders(self, table: str) -> set[int]:
        """The pids that hold this lock in ``table`` (the text of ``/proc/locks``); a
        process waiting for it does not."""
        return set(holders_in(table, (self.major, self.minor, self.inode)))

    def held_by(self, pid: int) -> bool:
        return pid in self.holders(LOCKS.read_text())


@dataclass(frozen=True, slots=True)
class Caught:
    """What :func:`catch` did: ``at`` (the system's monotonic clock, ns) when the kernel
    confirmed the process stopped and holding the lock, None if it never did; ``misses``
    how many stops found the lock released, each continued at once."""

    pid: int
    at: int | None
    misses: int


def catch(
    pid: int,
    lock: LockFile,
    *,
    until: float,
    alive: Callable[[], bool],
    between: Callable[[], object],
) -> Caught:
    """Stop ``pid`` (a child of this process) at a moment it holds ``lock``, or give up
    (``at`` None) once ``until`` (``time.monotonic()``) passed or it is no longer
    ``alive``, and then it runs. ``between`` is called between two looks at
    ``/proc/locks`` (it waits a little: the caller counts its progress there). A
    process caught stays stopped: the caller continues it (:func:`cont`)."""
    misses = 0
    while time.monotonic() < until and alive():
        if lock.held_by(pid):
            os.kill(pid, signal.SIGSTOP)
            try:
                held = _stopped(pid) and lock.held_by(pid)
            except BaseException:
                cont(pid)
                raise
            if held:
                return Caught(pid, time.monotonic_ns(), misses)
            cont(pid)
            misses += 1
        between()
    return Caught(pid, None, misses)


def cont(pid: int) -> None:
    """SIGCONT ``pid``, which may have exited since."""
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _stopped(pid: int) -> bool:
    """Whether every thread of child ``pid`` stopped within :data:`STOP_WAIT`: the kernel
    reports a child's stop to its parent once the last of its threads stopped. (The
    stop is consumed here: ``subprocess`` only ever waits for exits.)"""
    deadline = time.monotonic() + STOP_WAIT
    while True:
        try:
            reported = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG)
        except ChildProcessError:  # reaped: it exited
            return False
        if reported is not None and reported.si_code == os.CLD_STOPPED:
            return True
        if time.monotonic() > deadline:
            return False
        NEVER.wait(STOP_POLL)
