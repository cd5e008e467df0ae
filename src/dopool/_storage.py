"""The store: one LMDB environment per runtime, its transactions, group commit and lock.

What the keys and values hold is :mod:`dopool._layout`'s; this module opens the
environment (refusing a damaged one or one of another format), runs write
transactions, one commit for many writers, and holds the store lock. LMDB's
errors are mapped to :class:`StorageError` here.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar, cast

import lmdb

from dopool._backend import closed_lock
from dopool._errors import (
    StorageError,
    StoreDamagedError,
    StoreFormatError,
    StoreLockedError,
)
from dopool._layout import (
    FORMAT_KEY,
    FORMAT_VERSION,
    MIGRATES_FROM,
    get_pool,
    migrate_from_1,
    put_pool,
    read_format,
    seal_format,
)
from dopool._turn import Turn

# Virtual address space only: LMDB grows the file as pages are used.
_MAP_SIZE = 1 << 36
_MAX_READERS = 512

logger = logging.getLogger("dopool")

Txn = Any  # an lmdb.Transaction; lmdb ships no type hints
T = TypeVar("T")


class _StoreLock:
    """An exclusive ``flock`` on ``<path>/lock``; the file names the holder.

    ``flock`` locks belong to an open file description, so a second runtime in
    the same process conflicts exactly like one in another process. Every
    ``OSError`` becomes a :class:`StorageError`, except a held lock.
    """

    def __init__(self, directory: Path) -> None:
        self._file = directory / "lock"
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
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise StorageError(f"cannot lock store {str(directory)!r}: {exc}") from exc
                raise StoreLockedError(path=str(directory), holder=_holder(fd)) from None
            started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
            text = f"pid {os.getpid()} on {socket.gethostname()} since {started}"
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, text.encode(), 0)
            except OSError as exc:
                raise StorageError(f"cannot write lock file {where!r}: {_reason(exc)}") from exc
        except BaseException:
            os.close(fd)  # releases the flock, if taken
            raise
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            with suppress(OSError):  # a stale holder text is harmless: the flock decides
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it in the file."""
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    if not text:
        return "another runtime"
    if text.startswith(f"pid {os.getpid()} "):
        return f"{text} (this process)"
    return text


# A leader waits for the writers it expects at most this fraction of a commit's
# duration, and not at all if that is under the minimum (seconds).
_GATHER_FRACTION = 0.5
_GATHER_MIN = 50e-6


class _Job:
    """One writer's transaction body, waiting for the group it joins to commit."""

    __slots__ = ("body", "error", "lead", "value", "wake")

    def __init__(self, body: Callable[[Txn], Any]) -> None:
        self.body = body
        self.wake: Any = None  # a held lock the leader releases, for a writer that waits
        self.lead = False  # woken to commit the next group rather than with a result
        self.value: Any = None
        self.error: BaseException | None = None

    def wait(self) -> None:
        self.wake.acquire()

    def set(self) -> None:
        if self.wake is not None:
            self.wake.release()


class _GroupCommit:
    """Coalesces concurrent write transactions into one LMDB commit (one fsync).

    A writer with nothing ahead of it becomes the leader: it takes every body
    queued so far, runs each in its own nested transaction of one write
    transaction, commits once, and wakes the writers. A body that raises rolls
    back only its own nested transaction. Writers that queued meanwhile form
    the next group, led by the first of them. No writer learns of its result
    before the commit that made it durable.

    A leader may wait a little for company (like PostgreSQL's ``commit_delay``):
    while the last group had more writers than are queued now, and only for a
    fraction of what a commit costs, so waiting can save a whole commit but
    never costs more than a small part of one. A lone writer never waits.
    This is the committer of ``durability="sync"``, where every commit waits
    for the disk; :class:`_OwnCommit` serves ``"async"``.
    """

    def __init__(self, env: Any, latch: Callable[[], Any] | None = None) -> None:
        self._env = env
        self._latch = latch or closed_lock
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Job] = []
        self._busy = False  # a leader is gathering or committing a group
        self._closed = False
        self._expected = 1  # the last group's size: how many writers are about
        self._commit_seconds = 0.0  # a moving average of one commit's duration
        self.groups = 0  # commits made, for the benchmarks
        self.bodies = 0

    def run(self, body: Callable[[Txn], T]) -> T:
        job = _Job(body)
        cond = self._cond
        with cond:
            if self._closed:
                raise StorageError("the store is closed")
            lead = not self._busy
            self._busy = True
            if not lead:
                job.wake = self._latch()
            self._queue.append(job)
            if len(self._queue) >= self._expected:
                cond.notify()  # a gathering leader has its group
        if not lead:
            job.wait()
            if not job.lead:
                return cast(T, _result(job))
        with cond:
            window = self._commit_seconds * _GATHER_FRACTION
            if len(self._queue) < self._expected and window >= _GATHER_MIN:
                cond.wait_for(lambda: len(self._queue) >= self._expected, window)
            group, self._queue = self._queue, []
            # Expect as many writers as the larger of this group and one fewer than
            # last time: one group that came up short does not stop the waiting.
            self._expected = max(len(group), self._expected - 1)
        started = time.perf_counter()
        try:
            self._commit(group)
        finally:
            elapsed = time.perf_counter() - started
            self._commit_seconds += (elapsed - self._commit_seconds) * 0.1
            with cond:
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                    successor.set()
                else:
                    self._busy = False
                    cond.notify_all()  # close() may be waiting for the last group
            for other in group:
                if other is not job:
                    other.set()
        return cast(T, _result(job))

    def close(self) -> None:
        """Refuse new bodies, and wait for the groups already queued to commit."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: not self._busy)

    def _commit(self, group: list[_Job]) -> None:
        self.groups += 1
        self.bodies += len(group)
        try:
            with self._env.begin(write=True) as txn:
                if len(group) == 1:  # nothing to isolate it from: no nested transaction
                    group[0].value = group[0].body(txn)
                else:
                    for job in group:
                        try:
                            with self._env.begin(write=True, parent=txn) as child:
                                job.value = job.body(child)
                        except lmdb.Error as exc:
                            job.error = _storage_error(exc)
                        except BaseException as exc:  # rolled back; the others go on
                            job.error = exc
        except lmdb.Error as exc:
            error = _storage_error(exc)
            for job in group:
                if job.error is None:
                    job.error = error
        except BaseException as exc:  # a lone body raised: its transaction was aborted
            group[0].error = exc


class _OwnCommit:
    """Runs each body in a write transaction of its own, on the writer's thread.

    Used when commits do not wait for the disk (``durability="async"``): a
    commit then costs ~15 µs, less than handing the body to a leader and waking
    its writer afterwards. The same interface as :class:`_GroupCommit`, and the
    same errors. Writers take turns first come, first served: LMDB's writer
    lock alone lets the thread that just committed take it again before a
    waiter wakes, so one busy instance could keep the others from committing.
    """

    def __init__(self, env: Any, latch: Callable[[], Any] | None = None) -> None:
        self._env = env
        self._turn = Turn(latch)
        self._closed = False
        self.groups = 0  # commits made, for the benchmarks
        self.bodies = 0

    def run(self, body: Callable[[Txn], T]) -> T:
        turn = self._turn
        turn.acquire()  # not ``with``: this runs once per event, and each call counts
        try:
            if self._closed:
                raise StorageError("the store is closed")
            self.groups += 1
            self.bodies += 1
            with self._env.begin(write=True) as txn:
                return body(txn)
        except lmdb.Error as exc:
            raise _storage_error(exc) from exc
        finally:
            turn.release()

    def close(self) -> None:
        """Refuse new bodies, once the writers already waiting have had their turn."""
        with self._turn:
            self._closed = True


def _storage_error(exc: lmdb.Error) -> StorageError:
    error = StorageError(f"write failed and was rolled back: {exc}")
    error.__cause__ = exc
    return error


def _result(job: _Job) -> Any:
    if job.error is not None:
        raise job.error
    return job.value


class Store:
    """One LMDB environment in a directory, locked for one runtime at a time.

    ``durability="sync"`` fsyncs every commit; ``"async"`` leaves commits in the
    OS page cache, which survives a crash of the process but not of the OS.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, durability: str = "sync", latch: Any = None
    ) -> None:  # latch: what a writer waiting for another waits on (Backend.waiter)
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create store directory {str(self.path)!r}: {exc}") from exc
        self._lock = _StoreLock(self.path)
        sync = durability == "sync"
        try:
            _check_data_file(self.path)
            self._env = lmdb.open(
                str(self.path / "data"),
                map_size=_MAP_SIZE,
                subdir=True,
                sync=sync,
                metasync=sync,
                readahead=False,
                max_readers=_MAX_READERS,
                max_spare_txns=16,
            )
        except (lmdb.Error, OSError) as exc:
            self._lock.release()
            raise StorageError(f"cannot open store {str(self.path)!r}: {exc}") from exc
        except BaseException:
            self._lock.release()
            raise
        try:
            _check_opened(self._env, self.path, create=True)
        except BaseException:
            self._env.close()
            self._lock.release()
            raise
        self._closed = False
        self._close_lock = threading.Lock()
        self._group = _GroupCommit(self._env, latch) if sync else _OwnCommit(self._env, latch)

    def transact(self, body: Callable[[Txn], T]) -> T:
        """Run ``body(txn)`` atomically and return its result once it is durable.

        With ``durability="sync"``, bodies from concurrent threads share one
        commit (group commit), each in its own nested transaction; with
        ``"async"`` each has a transaction of its own. Either way one that raises
        is rolled back alone and its exception is raised here. ``body`` may run
        on another writer's thread, so it must only touch the transaction and
        its own objects.
        """
        return self._group.run(body)

    @property
    def commit_counts(self) -> tuple[int, int]:
        """(commits, transaction bodies) since the store opened: the mean group size."""
        return self._group.groups, self._group.bodies

    @contextmanager
    def write(self) -> Iterator[Txn]:
        """One atomic write transaction on the calling thread, outside group commit."""
        try:
            with self._env.begin(write=True) as txn:
                yield txn
        except lmdb.Error as exc:
            raise StorageError(f"write failed and was rolled back: {exc}") from exc

    @contextmanager
    def read(self) -> Iterator[Txn]:
        """A read-only snapshot of committed state; never waits for writers."""
        try:
            with self._env.begin(write=False, buffers=False) as txn:
                yield txn
        except lmdb.Error as exc:
            raise StorageError(f"read failed: {exc}") from exc

    def get_pool(self, txn: Txn, name: str) -> int | None:
        """The concurrency a pool was stored with, or None for a pool never defined."""
        return get_pool(txn, name)

    def put_pool(self, txn: Txn, name: str, concurrency: int) -> None:
        put_pool(txn, name, concurrency)

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._group.close()  # no transaction may still be open when the env closes
            try:
                self._env.sync(True)
            finally:
                self._env.close()
                self._lock.release()


def _check_data_file(path: Path) -> None:
    """Refuse a store whose data file was lost or emptied, rather than start it anew.

    LMDB would silently make a new, empty database in its place.
    """
    data = path / "data"
    try:
        size = (data / "data.mdb").stat().st_size
    except FileNotFoundError:
        if (data / "lock.mdb").exists():  # made with the data file: it was there once
            raise StoreDamagedError(path=str(path), reason="data/data.mdb is missing") from None
        return
    except OSError as exc:
        raise StorageError(f"cannot read store {str(path)!r}: {exc}") from exc
    if size == 0:
        raise StoreDamagedError(path=str(path), reason="data/data.mdb is empty")


def _check_opened(env: Any, path: Path, *, create: bool) -> None:
    """Check an opened store: its file holds every page it uses, its format is ours.

    A file shorter than its last page would kill the process with SIGBUS on
    first read of a missing page. With ``create`` (a runtime's store, which may
    write), a new, empty store gets the format record, and a store of an older
    format it knows is migrated in place, in one transaction
    (:mod:`dopool._layout.migrate`); read-only, such a store is refused like any
    other. A store without a format record that holds anything is of no known format.
    """
    try:
        used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = (path / "data" / "data.mdb").stat().st_size
        if size < used:
            raise StoreDamagedError(
                path=str(path), reason=f"data/data.mdb is {size} bytes, shorter than {used} in use"
            )
        with env.begin(write=False) as txn:
            raw = txn.get(FORMAT_KEY)
            entries = env.stat()["entries"]
        if raw is not None:
            found = read_format(FORMAT_KEY, raw)
            if found == FORMAT_VERSION:
                return
            known = found in MIGRATES_FROM
            if not (create and known):
                raise StoreFormatError(
                    path=str(path), found=found, supported=FORMAT_VERSION, migrates=known
                )
            with env.begin(write=True) as txn:  # one transaction: all of it, or nothing
                changed = migrate_from_1(txn)
            logger.info(
                "store %r migrated from format %d to %d (%d records rewritten)",
                str(path),
                found,
                FORMAT_VERSION,
                changed,
            )
            return
        if entries:
            raise StoreFormatError(path=str(path), found=None, supported=FORMAT_VERSION)
        if create:
            with env.begin(write=True) as txn:
                txn.put(FORMAT_KEY, seal_format(FORMAT_KEY))
    except (lmdb.Error, OSError) as exc:
        raise StorageError(f"cannot open store {str(path)!r}: {exc}") from exc


def open_readonly(path: Path) -> Any:
    """Open a store's LMDB environment read-only, beside the runtime that may hold it.

    Returns an ``lmdb.Environment``; read it with ``begin(write=False)``.
    """
    _check_data_file(path)
    env = _open_readonly(path)
    try:
        _check_opened(env, path, create=False)
    except BaseException:
        env.close()
        raise
    return env


def _open_readonly(path: Path) -> Any:
    options = {"readonly": True, "subdir": True, "create": False, "readahead": False}
    try:
        return lmdb.open(
            str(path / "data"), map_size=_MAP_SIZE, max_readers=_MAX_READERS, **options
        )
    except (lmdb.Error, OSError):
        pass
    try:
        # Without write access to LMDB's lock file, read without it: consistent for a
        # snapshot this short, though a live writer may then reuse pages sooner.
        return lmdb.open(str(path / "data"), map_size=_MAP_SIZE, lock=False, **options)
    except (lmdb.Error, OSError) as exc:
        raise StorageError(f"cannot open store {str(path)!r} read-only: {exc}") from exc
