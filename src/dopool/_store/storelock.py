"""The store lock: an ``flock`` on ``<store>/lock``, exclusive or shared.

A runtime (``Runtime(path)``) holds it exclusively: no other runtime or worker opens
the store meanwhile. Shared workers (``Runtime(path, shared=True)``, ``dopool worker``)
hold it shared: they exclude an exclusive runtime and coexist, and leases
(:mod:`dopool._cluster.leases`) decide which serves which instance. The kernel releases it
with its holder's process, so a dead holder leaves no stale lock; a child made with
``os.fork`` closes its copy of the file as it starts (:func:`os.register_at_fork`), or
it would keep its parent's lock held after the parent died, and the next runtime would
be refused for as long as the child lived.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import os
import socket
import stat
import weakref
from contextlib import suppress
from pathlib import Path

from dopool._errors import StorageError, StoreLockedError


class StoreLock:
    """An ``flock`` on ``<path>/lock``: exclusive for one runtime, or shared by workers.

    An exclusive holder excludes everyone; shared holders (``Runtime(shared=True)``)
    exclude an exclusive one and coexist. The file names the holders, one line each:
    an exclusive one, or the first shared one, replaces what is there; a later shared
    one appends its line (a line of a process gone is not shown, see :func:`_holder`).
    ``flock`` locks belong to an open file description, so a second runtime in the
    same process conflicts exactly like one in another process. Every ``OSError``
    becomes a :class:`StorageError`, except a held lock.
    """

    def __init__(self, directory: Path, *, shared: bool = False) -> None:
        self._file = directory / "lock"
        self._shared = shared
        where = str(self._file)
        # O_NOFOLLOW: a planted symlink must not get its target truncated (or created).
        # O_NONBLOCK: a planted FIFO must not block the open; no effect on a regular file.
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self._file, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP and self._file.is_symlink():
                raise StorageError(
                    f"lock file {where!r} is a symbolic link; dopool does not follow it"
                ) from exc
            raise StorageError(f"cannot open lock file {where!r}: {_reason(exc)}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StorageError(f"lock file {where!r} is not a regular file")
            # Alone (an exclusive lock granted), a holder replaces the text; a shared
            # one then turns its lock shared (not atomically: someone may slip in
            # between, and then it is refused as if it had come second).
            alone = _flock(fd, fcntl.LOCK_EX, directory, refuse=not shared)
            if shared:
                _flock(fd, fcntl.LOCK_SH, directory, refuse=True)
            started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
            mode = " (shared)" if shared else ""
            text = f"pid {os.getpid()} on {socket.gethostname()} since {started}{mode}\n"
            try:
                if alone:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, text.encode(), 0)
                else:
                    os.pwrite(fd, text.encode(), os.fstat(fd).st_size)
            except OSError as exc:
                raise StorageError(f"cannot write lock file {where!r}: {_reason(exc)}") from exc
        except BaseException:
            os.close(fd)  # releases the flock, if taken
            raise
        self._fd: int | None = fd
        _open.add(self)

    def release(self) -> None:
        if self._fd is not None:
            if not self._shared:
                with suppress(OSError):  # a stale holder text is harmless: the flock decides
                    os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
            _open.discard(self)

    def forget(self) -> None:
        """In a forked child: close this copy of the parent's file, which leaves the lock
        (and the holder's line) to the parent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            _open.discard(self)
            with suppress(OSError):
                os.close(fd)


_open: weakref.WeakSet[StoreLock] = weakref.WeakSet()  # every lock not released yet


def _forget_in_child() -> None:
    for lock in list(_open):
        lock.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _flock(fd: int, operation: int, directory: Path, *, refuse: bool) -> bool:
    """Take ``operation`` without waiting: True if granted; if held by others, False, or
    with ``refuse`` :class:`StoreLockedError` naming them."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise StorageError(f"cannot lock store {str(directory)!r}: {exc}") from exc
        if refuse:
            raise StoreLockedError(path=str(directory), holder=_holder(fd)) from None
        return False
    return True


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _holder(fd: int) -> str:
    """Who holds the lock, as its holders wrote it in the file (those of this host
    whose process is gone left out)."""
    try:
        text = os.pread(fd, 65536, 0).decode("utf-8", "replace")
    except OSError:
        text = ""
    host = socket.gethostname()
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        pid, on = _pid_and_host(line)
        if not line or (pid is not None and on == host and not _alive(pid)):
            continue
        mine = pid == os.getpid() and on == host
        lines.append(f"{line} (this process)" if mine else line)
    return "; ".join(lines) if lines else "another runtime"


def _pid_and_host(line: str) -> tuple[int | None, str]:
    """The pid and host a lock file's line names (``pid P on HOST since ...``)."""
    words = line.split()
    if len(words) >= 4 and words[0] == "pid" and words[1].isdigit() and words[2] == "on":
        return int(words[1]), words[3]
    return None, ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True
