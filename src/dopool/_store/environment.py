"""The store: one LMDB environment per runtime, its transactions, group commit and lock.

What the keys and values hold is :mod:`dopool._store.layout`'s; this module opens the
environment (refusing a damaged one or one of another format), runs write
transactions, one commit for many writers, and holds the store lock. LMDB's
errors are mapped to :class:`StorageError` here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import lmdb

from dopool._clock.latch import Waiter
from dopool._errors import (
    ConfigurationError,
    StorageError,
    StoreDamagedError,
    StoreFormatError,
    StoreNotFoundError,
)
from dopool._store.commit import GroupCommit, OwnCommit, SoleCommit, sync_meta
from dopool._store.layout import (
    FORMAT_KEY,
    FORMAT_VERSION,
    MIGRATES_FROM,
    PoolRecord,
    get_pool,
    migrate_store,
    pool_paused,
    put_pool,
    read_format,
    seal_format,
)
from dopool._store.lmdbfile import missing_pages_are_free
from dopool._store.storelock import StoreLock
from dopool._store.txn import Txn
from dopool._store.writerlock import WriterLock

# Virtual address space only: LMDB grows the file as pages are used.
_MAP_SIZE = 1 << 36
# Read transactions open at once, over every process on the store: each thread reading
# holds a slot only while it reads, but a worker may run ``max_active`` actors (1,024 by
# default) that all read at once (when instances begin to wait for a slot, every idle one
# looks at its meta), and several workers share the table. A slot is 64 bytes of LMDB's
# lock file; the first process to open the store sizes it, later ones use what it has.
_MAX_READERS = 16384

logger = logging.getLogger("dopool")

T = TypeVar("T")
_NOT_A_DIRECTORY = "not a directory"
_DATA_MISSING = "data/data.mdb is missing"
_DATA_EMPTY = "data/data.mdb is empty"
# What a store a runtime is creating looks like for a moment (LMDB makes its lock file,
# then its data file, then writes it): what connect(wait=) looks again for.
_BEING_CREATED = (_DATA_MISSING, _DATA_EMPTY)
_WAIT_POLL = 0.05  # seconds between looks for a store connect(wait=) waits for


class Store:
    """One LMDB environment in a directory, locked for one runtime, or shared by workers.

    ``durability="sync"`` fsyncs every commit; ``"async"`` leaves commits in the
    OS page cache, which survives a crash of the process but not of the OS.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "sync",
        latch: Waiter | None = None,
        one_thread: bool = False,
        shared: bool = False,
        scratch: bool = False,
    ) -> None:
        """``latch``: what a writer waiting for another waits on (``Backend.waiter``);
        ``one_thread``: every writer runs on one thread (the greenlet backend);
        ``shared``: take the store lock shared, as one of several workers;
        ``scratch``: a store deleted after this use, which nobody else opens (a
        simulation's temporary one): LMDB writes its pages in place in the memory
        map, sparing a copy of every page a commit changed (``writemap``; its data
        file then takes the map's size, sparse: 64 GiB as ``ls`` shows it)."""
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create store directory {str(self.path)!r}: {exc}") from exc
        self._lock = StoreLock(self.path, shared=shared)
        sync = durability == "sync"
        try:
            _check_data_file(self.path)
            self._shared = Environment.acquire(self.path, sync=sync, create=True, writemap=scratch)
        except BaseException:
            self._lock.release()
            raise
        self._env = self._shared.env
        self._pid = _process[0]  # LMDB's environment is this process's: not a forked child's
        self._closed = False
        self._close_lock = threading.Lock()
        self._group: GroupCommit | OwnCommit | SoleCommit
        writer = self._shared.writer
        if one_thread:  # no group to gather, nobody to take turns with (nor writer lock)
            self._group = SoleCommit(self._env, durable=sync)
        elif sync:
            self._group = GroupCommit(self._env, latch, writer)
        else:
            self._group = OwnCommit(self._env, latch, writer)

    def transact(self, body: Callable[[Txn], T]) -> T:
        """Run ``body(txn)`` atomically and return its result once it is durable.

        With ``durability="sync"``, bodies from concurrent threads share one
        commit (group commit), each in its own nested transaction; with
        ``"async"`` each has a transaction of its own. Either way one that raises
        is rolled back alone and its exception is raised here. ``body`` may run
        on another writer's thread, so it must only touch the transaction and
        its own objects.
        """
        if _process[0] != self._pid:  # (no system call: the fork hook keeps _process)
            self._refuse_child()
        return self._group.run(body)

    def nested(self, txn: Txn, body: Callable[[Txn], T]) -> T:
        """Run ``body`` in a transaction nested in ``txn``, a write transaction of this
        store's open on this thread: if it raises, what it wrote is rolled back alone
        (``txn`` goes on) and its exception is raised here.

        Raises:
            StorageError: LMDB refused the nested transaction (or it failed).
        """
        try:
            with self._env.begin(write=True, parent=txn) as child:
                return body(child)
        except lmdb.Error as exc:
            raise StorageError(f"a nested write failed and was rolled back: {exc}") from exc

    @property
    def durable(self) -> bool:
        """Whether each commit is fsynced (``durability="sync"``)."""
        return bool(self._shared.sync)

    def flush(self) -> None:
        """Make every commit so far durable (an fsync), under ``"async"`` too.

        Raises:
            StorageError: the sync failed.
        """
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise StorageError(f"commits made could not be synced: {exc}") from exc

    @property
    def commit_counts(self) -> tuple[int, int]:
        """(commits, transaction bodies) since the store opened: the mean group size."""
        return self._group.groups, self._group.bodies

    @contextmanager
    def write(self) -> Iterator[Txn]:
        """One atomic write transaction on the calling thread, outside group commit."""
        if _process[0] != self._pid:
            self._refuse_child()
        try:
            with self._shared.writer, self._env.begin(write=True) as txn:
                yield txn
        except lmdb.Error as exc:
            raise StorageError(f"write failed and was rolled back: {exc}") from exc
        if self._shared.sync:
            sync_meta(self._env)

    def lease_time(self) -> float:
        """The host's lease clock (:mod:`dopool._store.leaseclock`), by which leases expire; only
        inside :meth:`write`, which holds the writer lock."""
        return self._shared.writer.lease_time()

    @contextmanager
    def read(self) -> Iterator[Txn]:
        """A read-only snapshot of committed state; never waits for writers."""
        if _process[0] != self._pid:
            self._refuse_child()
        try:
            with self._env.begin(write=False, buffers=False) as txn:
                yield txn
        except lmdb.Error as exc:
            raise StorageError(f"read failed: {exc}") from exc

    def _refuse_child(self) -> NoReturn:
        """Refuse a transaction in a child forked after the store was opened."""
        raise ConfigurationError(opened_before_fork("a runtime", self.path, self._pid))

    def clear_stale_readers(self) -> int:
        """Free the reader slots of processes that died inside a read; how many.

        A process killed while reading (a producer's ``status``, say) leaves its slot
        behind, and the snapshot it names keeps LMDB from reusing the pages written
        since: the file would grow for as long as the store stays open. LMDB clears
        such slots only when asked (``mdb_reader_check``).
        """
        try:
            cleared: int = self._env.reader_check()
        except lmdb.Error as exc:
            raise StorageError(f"reader check failed: {exc}") from exc
        return cleared

    def get_pool(self, txn: Txn, name: str) -> int | None:
        """The concurrency a pool was stored with, or None for a pool never defined."""
        return get_pool(txn, name)

    def put_pool(self, txn: Txn, name: str, concurrency: int) -> None:
        """Store a pool's concurrency, keeping its whole-pool pause, if any."""
        paused = pool_paused(txn, name)
        put_pool(txn, name, PoolRecord(concurrency, paused))

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            if _process[0] != self._pid:  # a forked child's copy: the parent's to close
                return
            self._group.close()  # no transaction may still be open when the env closes
            try:
                self._env.sync(True)
            finally:
                self._shared.release()
                self._lock.release()


class Environment:
    """The LMDB environment of one store, shared by everyone in this process who opens it.

    LMDB must not be opened twice in one process: closing one copy would drop the
    locks the other holds. So a runtime's :class:`Store` and the producers'
    connections (:mod:`dopool._handles.connection`) of one process share one environment,
    opened with the first opener's durability and closed by the last to release it.
    """

    __slots__ = ("_key", "env", "sync", "users", "writer")

    def __init__(self, env: Any, key: tuple[int, str], sync: bool, writer: WriterLock) -> None:
        self.env = env
        self.writer = writer  # taken around every write transaction (_writerlock)
        self._key = key
        self.sync = sync  # whether its commits are fsynced (LMDB's flags, fixed at open)
        self.users = 0

    @classmethod
    def acquire(
        cls, path: Path, *, sync: bool, create: bool, writemap: bool = False
    ) -> Environment:
        """The environment of the store at ``path``: the one open in this process, or a new one.

        ``create``: a runtime's (:func:`_check_opened`); ``writemap``: LMDB's option, for
        a new one (see :class:`Store`'s ``scratch``). A runtime refuses an
        environment that a connection of this process opened with another durability:
        its commits would be fsynced, or not, against its option.

        Raises:
            StorageError: LMDB cannot open it, or its checks fail (see :func:`_check_opened`).
            ConfigurationError: a runtime's durability differs from the open environment's.
        """
        key = (os.getpid(), os.path.realpath(path / "data"))
        with _environments_lock:
            shared = _environments.get(key)
            inherited = [pid for pid, where in _environments if where == key[1] and pid != key[0]]
            if shared is None and inherited:
                # LMDB refuses a second open in one process, and the parent's copy cannot
                # be closed here without touching the parent's reader slots.
                raise ConfigurationError(
                    opened_before_fork("a runtime or connection", path, inherited[0])
                )
            if shared is None:
                env, writer = _open_env(path, sync=sync, create=create, writemap=writemap)
                shared = cls(env, key, sync, writer)
                _environments[key] = shared
            elif create and shared.sync != sync:
                mode = "sync" if shared.sync else "async"
                raise ConfigurationError(
                    f"store {str(path)!r} is open in this process by a connection with "
                    f"durability={mode!r}; a runtime here must use the same durability, or "
                    "open before the connection"
                )
            shared.users += 1
            return shared

    def release(self) -> None:
        """One user is done with it; the last closes it."""
        with _environments_lock:
            self.users -= 1
            if self.users:
                return
            del _environments[self._key]
        self.env.close()
        self.writer.close()


def opened_before_fork(what: str, path: Path, pid: int) -> str:
    """What a forked child is told when it uses, or opens again, a store its parent opened."""
    return (
        f"store {str(path)!r} was opened by {what} of process {pid} before a fork, and "
        "this process is a child of that fork; LMDB cannot be used across a fork: open the store "
        "(dopool.connect, Runtime) in each process after forking, none before (with "
        "gunicorn --preload, or a multiprocessing fork, not at import)"
    )


# Every environment open in this process, by pid (a forked child opens its own) and path.
_environments: dict[tuple[int, str], Environment] = {}
_environments_lock = threading.Lock()


#: This process's id, kept by the fork hook: a store compares it with its opener's at
#: every transaction, which ``os.getpid()`` (a system call) would slow.
_process = [os.getpid()]


def _unlock_in_child() -> None:
    """A thread of the parent may have held the lock at the fork: in the child, no thread
    ever releases it, so its first connect would wait for ever."""
    global _environments_lock  # noqa: PLW0603 - a fresh lock, for this process alone
    _environments_lock = threading.Lock()
    _process[0] = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unlock_in_child)


def _open_env(
    path: Path, *, sync: bool, create: bool, writemap: bool = False
) -> tuple[Any, WriterLock]:
    """Open and check the store's LMDB environment (read-write), and its writer lock;
    see :func:`_check_opened`."""
    try:
        writer = WriterLock(path)
    except OSError as exc:
        raise StorageError(f"cannot open store {str(path)!r}: {exc}") from exc
    try:
        env = lmdb.open(
            str(path / "data"),
            map_size=_MAP_SIZE,
            subdir=True,
            create=create,
            sync=sync,
            # A durable commit flushes its pages under the writer lock, and the writer
            # flushes the meta page that makes it current after releasing the lock
            # (``sync_meta``): other processes' commits need not wait for that flush.
            metasync=False,
            writemap=writemap,
            readahead=False,
            max_readers=_MAX_READERS,
            max_spare_txns=16,
        )
    except (lmdb.Error, OSError) as exc:
        writer.close()
        raise StorageError(f"cannot open store {str(path)!r}: {exc}") from exc
    try:
        _check_opened(env, path, create=create, writer=writer)
    except BaseException:
        env.close()
        writer.close()
        raise
    return env, writer


def open_shared(path: str | os.PathLike[str], *, sync: bool, wait: float = 0.0) -> Environment:
    """The store at ``path`` opened for a producer: no store lock, nothing created. With
    ``wait``, a store not there yet, or still being created (its lock file made, its data
    file not yet, or empty), is looked for again every :data:`_WAIT_POLL` seconds for
    that many seconds: a producer started beside the worker that will create it.

    Raises:
        StoreNotFoundError: no store at ``path`` (after ``wait`` seconds).
        StoreFormatError: a store of another format, or one a runtime must migrate.
        StorageError: it cannot be opened, or it is damaged.
    """
    deadline = time.monotonic() + wait
    pause = threading.Event()  # never set: a bounded wait between looks
    while True:
        try:
            where = check_store_path(path)
            _check_data_file(where)
            return Environment.acquire(where, sync=sync, create=False)
        except (StoreNotFoundError, StoreDamagedError) as exc:
            if isinstance(exc, StoreNotFoundError):
                being_made = exc.reason != _NOT_A_DIRECTORY
            else:
                being_made = exc.reason in _BEING_CREATED
            left = deadline - time.monotonic()
            if not being_made:
                raise
            if left <= 0:
                if wait and isinstance(exc, StoreNotFoundError):
                    raise StoreNotFoundError(exc.path, exc.reason, waited=wait) from None
                raise
            pause.wait(min(_WAIT_POLL, left))


def check_store_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a :class:`Path`, if it holds a store someone created.

    Raises:
        StoreNotFoundError: no such directory, or no data file in it.
        StorageError: the path cannot be read.
    """
    where = Path(path)
    try:
        if not where.exists():
            raise StoreNotFoundError(str(path), "no such directory")
        if not where.is_dir():
            raise StoreNotFoundError(str(path), _NOT_A_DIRECTORY)
        if not (where / "data" / "data.mdb").is_file():
            raise StoreNotFoundError(
                str(path), "it has no data/data.mdb (is it a store directory?)"
            )
    except OSError as exc:  # e.g. a name too long, or a directory we may not search
        raise StorageError(f"cannot read store path {str(path)!r}: {exc.strerror or exc}") from exc
    return where


def _check_data_file(path: Path) -> None:
    """Refuse a store whose data file was lost or emptied, rather than start it anew.

    LMDB would silently make a new, empty database in its place.
    """
    data = path / "data"
    try:
        size = (data / "data.mdb").stat().st_size
    except FileNotFoundError:
        if (data / "lock.mdb").exists():  # made with the data file: it was there once
            raise StoreDamagedError(path=str(path), reason=_DATA_MISSING) from None
        return
    except OSError as exc:
        raise StorageError(f"cannot read store {str(path)!r}: {exc}") from exc
    if size == 0:
        raise StoreDamagedError(path=str(path), reason=_DATA_EMPTY)


def _check_opened(env: Any, path: Path, *, create: bool, writer: WriterLock | None = None) -> None:
    """Check an opened store: its file holds every page it uses, its format is ours.

    A file shorter than its last page in use would kill the process with SIGBUS on
    first read of a missing page; one whose missing pages are all free is sound. With
    ``create`` (a runtime's store, which may write), a new, empty store gets the format
    record, and a store of an older format it knows is migrated in place, in one
    transaction (:mod:`dopool._store.layout.migrate`); read-only, such a store is refused like
    any other. A store without a format record that holds anything is of no known format.
    """
    try:
        page_size = env.stat()["psize"]
        used = (env.info()["last_pgno"] + 1) * page_size
        data = path / "data" / "data.mdb"
        size = data.stat().st_size
        # Pages past the end may be free ones LMDB never wrote (see _lmdbfile).
        if size < used and not missing_pages_are_free(str(data), size, page_size):
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
            assert writer is not None  # create: a read-write environment
            with writer, env.begin(write=True) as txn:  # one transaction: all, or nothing
                changed = migrate_store(txn, found)
            env.sync(True)  # its meta page (see _open_env), whatever the durability
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
            assert writer is not None
            with writer, env.begin(write=True) as txn:
                txn.put(FORMAT_KEY, seal_format(FORMAT_KEY))
            env.sync(True)
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
