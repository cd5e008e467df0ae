"""The store: one LMDB environment per runtime, one key namespace per instance.

Key layout (all integers big-endian, so LMDB's byte order is numeric order)::

    P <pool>                              pool record: {"concurrency": N}
    I <pool>:<index> \\0 m                 instance meta (counters, flags, alarm slot)
    I <pool>:<index> \\0 q <rank:4> <seq:8> one pending event
    I <pool>:<index> \\0 d <seq:8>          one dead letter
    I <pool>:<index> \\0 o <oseq:8>         one follow-up waiting in the outbox
    I <pool>:<index> \\0 s <source:4>       last outbox sequence accepted from a source

``rank`` is ``2**31 - 1 - priority``, so the first queue key under an instance's
prefix is always the next event to run: higher priority first, then FIFO.
Enqueue is one put and dequeue one ``set_range`` through the B-tree; nothing scans.

Everything outside this module sees records and namespaces, never LMDB or msgpack:
their errors are mapped to :class:`StorageError` / :class:`EventValidationError` here.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import lmdb

from dopool._errors import (
    DamagedRecordError,
    StorageError,
    StoreDamagedError,
    StoreFormatError,
    StoreLockedError,
)
from dopool._records import (
    FORMAT_VERSION,
    DeadRecord,
    EventRecord,
    Meta,
    OutboxRecord,
    damaged,
    read_dead,
    read_event,
    read_format,
    read_link,
    read_meta,
    read_outbox,
    read_pool,
    seal_dead,
    seal_event,
    seal_format,
    seal_link,
    seal_meta,
    seal_outbox,
    seal_pool,
)
from dopool._turn import Turn

MAX_EVENT_BYTES = 128 * 1024
MAX_PARTITION_KEY_BYTES = 2 * 1024
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1

# Virtual address space only: LMDB grows the file as pages are used.
_MAP_SIZE = 1 << 36
_MAX_READERS = 512
_POOL_PREFIX = b"P"
_FORMAT_KEY = b"F"  # the store's format version, written when it is created
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_RANK_SEQ = struct.Struct(">IQ")

Txn = Any  # an lmdb.Transaction; lmdb ships no type hints
T = TypeVar("T")


def queue_key_priority(key: bytes) -> int:
    """The priority encoded in a queue-key suffix (``rank:4 seq:8``)."""
    rank: int = _U32.unpack_from(key, len(key) - 12)[0]
    return PRIORITY_MAX - rank


def queue_key_sequence(key: bytes) -> int:
    """The sequence encoded in a queue key."""
    sequence: int = _U64.unpack_from(key, len(key) - 8)[0]
    return sequence


class InstanceKey(NamedTuple):
    """A key of some instance's namespace, taken apart (see :func:`parse_instance_key`)."""

    pool: str
    instance: int
    tag: bytes  # b"m", b"q", b"d", b"o" or b"s"
    suffix: bytes


# The length of the suffix after each tag of an instance's namespace.
_SUFFIX_LENGTHS = {b"m": 0, b"q": _RANK_SEQ.size, b"d": 8, b"o": 8, b"s": 4}


def parse_instance_key(key: bytes) -> InstanceKey | None:
    """Take an instance's key apart; None if it is not one of the layout above."""
    ident, nul, rest = key[1:].partition(b"\0")
    if key[:1] != b"I" or not nul or not rest:
        return None
    try:
        pool, _, index = ident.decode().rpartition(":")
    except UnicodeDecodeError:
        return None
    tag, suffix = rest[:1], rest[1:]
    if not pool or not index.isdigit() or _SUFFIX_LENGTHS.get(tag) != len(suffix):
        return None
    return InstanceKey(pool, int(index), tag, suffix)


def is_format_key(key: bytes) -> bool:
    return key == _FORMAT_KEY


def pool_name_of(key: bytes) -> str | None:
    """The pool a pool record's key names; None if ``key`` is not a pool record's."""
    if key[:1] != _POOL_PREFIX or len(key) == 1:
        return None
    try:
        return key[1:].decode()
    except UnicodeDecodeError:
        return None


class Namespace:
    """The keys of one instance. Methods take an open transaction from :class:`Store`.

    Every value is sealed and checked by :mod:`dopool._records`: a read raises
    :class:`DamagedRecordError` for a record that fails its checksum or layout.
    """

    __slots__ = ("_dead", "_meta", "_outbox", "_queue", "_seen", "prefix")

    def __init__(self, pool: str, index: int) -> None:
        self.prefix = b"I" + f"{pool}:{index}".encode() + b"\0"
        self._meta = self.prefix + b"m"
        self._queue = self.prefix + b"q"
        self._dead = self.prefix + b"d"
        self._outbox = self.prefix + b"o"
        self._seen = self.prefix + b"s"

    # -- meta ---------------------------------------------------------------
    def load_meta(self, txn: Txn) -> Meta:
        raw = txn.get(self._meta)
        if raw is None:
            return Meta()
        return read_meta(self._meta, raw)

    def save_meta(self, txn: Txn, meta: Meta) -> None:
        txn.put(self._meta, seal_meta(self._meta, meta))

    # -- queue --------------------------------------------------------------
    def queue_key(self, priority: int, sequence: int) -> bytes:
        return self._queue + _RANK_SEQ.pack(PRIORITY_MAX - priority, sequence)

    def put_event(self, txn: Txn, key: bytes, record: EventRecord | tuple[Any, ...]) -> None:
        """Store a pending event: an :class:`EventRecord`, or a plain tuple of its fields."""
        txn.put(key, seal_event(key, record), overwrite=False)

    def get_event(self, txn: Txn, key: bytes) -> EventRecord | None:
        raw = txn.get(key)
        return None if raw is None else read_event(key, raw)

    def first_event(self, txn: Txn) -> tuple[bytes, EventRecord] | None:
        """The queue's first key and its record: the next event to run, if any.

        Raises:
            DamagedRecordError: the first record is damaged (its ``key`` says which).
        """
        queue, length = self._queue, len(self._queue) + _RANK_SEQ.size
        with txn.cursor() as cursor:
            found = cursor.set_range(queue)
            while found:
                key, raw = cursor.item()
                if not key.startswith(queue):
                    break
                if len(key) == length:
                    return key, read_event(key, raw)
                found = cursor.next()  # a stray key of the wrong length: not an event
        return None

    def delete_event(self, txn: Txn, key: bytes) -> None:
        txn.delete(key)

    def delete_events(self, txn: Txn) -> int:
        return _delete_prefix(txn, self._queue)

    def iter_event_keys(self, txn: Txn) -> Iterator[bytes]:
        for key, _ in _iter_prefix(txn, self._queue):
            yield key

    # -- dead letters -------------------------------------------------------
    def put_dead_letter(self, txn: Txn, sequence: int, record: DeadRecord) -> None:
        key = self._dead + _U64.pack(sequence)
        txn.put(key, seal_dead(key, record))

    def iter_dead_letters(self, txn: Txn) -> Iterator[tuple[int, DeadRecord]]:
        """Every dead letter by sequence; a damaged one is listed as such, not raised."""
        for key, raw in _iter_prefix(txn, self._dead, len(self._dead) + 8):
            yield queue_key_sequence(key), _dead_or_damaged(key, raw)

    def pop_dead_letter(self, txn: Txn, sequence: int) -> DeadRecord | None:
        key = self._dead + _U64.pack(sequence)
        raw = txn.pop(key)
        return None if raw is None else _dead_or_damaged(key, raw)

    def delete_dead_letters(self, txn: Txn) -> int:
        return _delete_prefix(txn, self._dead)

    # -- outbox and delivery bookkeeping --------------------------------------
    def put_outbox(self, txn: Txn, oseq: int, record: OutboxRecord) -> None:
        key = self._outbox + _U64.pack(oseq)
        txn.put(key, seal_outbox(key, record))

    def iter_outbox(self, txn: Txn) -> Iterator[tuple[int, OutboxRecord | DamagedRecordError]]:
        """Every outbox entry by sequence; a damaged one comes as its error, not raised."""
        for key, raw in _iter_prefix(txn, self._outbox, len(self._outbox) + 8):
            try:
                record: OutboxRecord | DamagedRecordError = read_outbox(key, raw)
            except DamagedRecordError as exc:
                record = exc
            yield queue_key_sequence(key), record

    def delete_outbox(self, txn: Txn, oseq: int) -> bool:
        return bool(txn.delete(self._outbox + _U64.pack(oseq)))

    def last_delivered(self, txn: Txn, source: int) -> int:
        """The last link accepted from ``source`` (all below it were too), or -1."""
        key = self._seen + _U32.pack(source)
        raw = txn.get(key)
        return -1 if raw is None else read_link(key, raw)

    def set_delivered(self, txn: Txn, source: int, link: int) -> None:
        key = self._seen + _U32.pack(source)
        txn.put(key, seal_link(key, link))

    def count_keys(self, txn: Txn, tag: bytes) -> int:
        """How many keys of one kind (``b"q"``, ``b"d"``, ``b"o"``) exist: for checkers only."""
        return sum(1 for _ in _iter_prefix(txn, self.prefix + tag))


def _dead_or_damaged(key: bytes, raw: bytes) -> DeadRecord:
    """A dead letter as stored, or, if it is damaged, a record that says so."""
    try:
        return read_dead(key, raw)
    except DamagedRecordError as exc:
        return DeadRecord(raw, f"DamagedRecordError: {exc.reason}", 0, 0.0, 0.0, None, 0, True)


def _iter_prefix(
    txn: Txn, prefix: bytes, length: int | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """The records under ``prefix``; with ``length``, only keys of that length.

    A key of the wrong length is no record of the layout (``dopool check``
    reports it); skipping it keeps one stray key from stopping an instance.
    """
    with txn.cursor() as cursor:
        if not cursor.set_range(prefix):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            if length is None or len(key) == length:
                yield key, value


def _delete_prefix(txn: Txn, prefix: bytes) -> int:
    count = 0
    with txn.cursor() as cursor:
        if not cursor.set_range(prefix):
            return 0
        while cursor.key().startswith(prefix):
            cursor.delete()  # moves to the next key
            count += 1
            if not cursor.key():
                break
    return count


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

    def __init__(self, env: Any) -> None:
        self._env = env
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
                job.wake = threading.Lock()
                job.wake.acquire()
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

    def __init__(self, env: Any) -> None:
        self._env = env
        self._turn = Turn()
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

    def __init__(self, path: str | os.PathLike[str], *, durability: str = "sync") -> None:
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
        self._group = _GroupCommit(self._env) if sync else _OwnCommit(self._env)

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
        key = _POOL_PREFIX + name.encode()
        raw = txn.get(key)
        return None if raw is None else read_pool(key, raw)

    def put_pool(self, txn: Txn, name: str, concurrency: int) -> None:
        key = _POOL_PREFIX + name.encode()
        txn.put(key, seal_pool(key, concurrency))

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


def pool_records(txn: Txn) -> dict[str, int]:
    """Every pool a store knows, by name, with its stored concurrency (checked)."""
    pools = {}
    for key, raw in _iter_prefix(txn, _POOL_PREFIX):
        name = pool_name_of(key)
        if name is None:
            raise damaged(key, raw, "the pool name is not UTF-8")
        pools[name] = read_pool(key, raw)
    return pools


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
    first read of a missing page. A new, empty store gets the format record
    (``create``); a store without one that holds anything is of no known format.
    """
    try:
        used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = (path / "data" / "data.mdb").stat().st_size
        if size < used:
            raise StoreDamagedError(
                path=str(path), reason=f"data/data.mdb is {size} bytes, shorter than {used} in use"
            )
        with env.begin(write=False) as txn:
            raw = txn.get(_FORMAT_KEY)
            entries = env.stat()["entries"]
        if raw is not None:
            found = read_format(_FORMAT_KEY, raw)
            if found != FORMAT_VERSION:
                raise StoreFormatError(path=str(path), found=found, supported=FORMAT_VERSION)
            return
        if entries:
            raise StoreFormatError(path=str(path), found=None, supported=FORMAT_VERSION)
        if create:
            with env.begin(write=True) as txn:
                txn.put(_FORMAT_KEY, seal_format(_FORMAT_KEY))
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
