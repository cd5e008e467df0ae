"""Committing write transactions: each body's own, or many bodies' in one commit.

The store (:mod:`dopool._store.environment`) hands every write transaction's body to one
of these committers, chosen by durability and by how the runtime's actors run:

- :class:`GroupCommit` (``durability="sync"``): concurrent writers share one
  commit, and so one fsync, each body in a nested transaction of its own;
- :class:`OwnCommit` (``"async"``): each body its own transaction, writers
  taking turns first come, first served;
- :class:`SoleCommit` (the greenlet backend, either durability): each body its
  own transaction, with nobody to take turns with.

The first two take the store's writer lock around each commit, which keeps other
processes' writers apart (:mod:`dopool._store.writerlock`); a simulated runtime's store
has none.

All three raise LMDB's errors as :class:`StorageError`, roll back a body that
raises alone, and return a body's result only once its commit is made, durable ones
once :func:`sync_meta` has flushed it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar, cast

import lmdb

from dopool._clock.latch import Waiter, closed_lock
from dopool._clock.turn import Turn
from dopool._errors import StorageError, StoreClosedError
from dopool._store.txn import Txn

T = TypeVar("T")

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


class GroupCommit:
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
    for the disk; :class:`OwnCommit` serves ``"async"``.
    """

    def __init__(
        self,
        env: Any,
        latch: Waiter | None = None,
        writer: AbstractContextManager[None] | None = None,
    ) -> None:
        self._env = env
        self._writer = writer or nullcontext()  # the store's, across processes
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
                raise StoreClosedError()
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
            with self._writer, self._env.begin(write=True) as txn:
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
            return
        except BaseException as exc:  # a lone body raised: its transaction was aborted
            group[0].error = exc
            return
        # Outside the writer lock: another process's commit may go on meanwhile.
        try:
            sync_meta(self._env)
        except StorageError as exc:
            for job in group:
                if job.error is None:
                    job.error = exc


class OwnCommit:
    """Runs each body in a write transaction of its own, on the writer's thread.

    Used when commits do not wait for the disk (``durability="async"``): a
    commit then costs ~15 µs, less than handing the body to a leader and waking
    its writer afterwards. The same interface as :class:`GroupCommit`, and the
    same errors. Writers take turns first come, first served: LMDB's writer
    lock alone lets the thread that just committed take it again before a
    waiter wakes, so one busy instance could keep the others from committing.
    """

    def __init__(
        self,
        env: Any,
        latch: Waiter | None = None,
        writer: AbstractContextManager[None] | None = None,
    ) -> None:
        self._env = env
        self._writer = writer or nullcontext()  # the store's, across processes
        self._turn = Turn(latch)
        self._closed = False
        self.groups = 0  # commits made, for the benchmarks
        self.bodies = 0

    def run(self, body: Callable[[Txn], T]) -> T:
        turn = self._turn
        turn.acquire()  # not ``with``: this runs once per event, and each call counts
        try:
            if self._closed:
                raise StoreClosedError()
            self.groups += 1
            self.bodies += 1
            with self._writer, self._env.begin(write=True) as txn:
                return body(txn)
        except lmdb.Error as exc:
            raise _storage_error(exc) from exc
        finally:
            turn.release()

    def close(self) -> None:
        """Refuse new bodies, once the writers already waiting have had their turn."""
        with self._turn:
            self._closed = True


class SoleCommit:
    """Runs each body in a write transaction of its own, for writers that all run on one
    thread, one after another (the greenlet backend): nobody to take turns with.

    A body never waits (it only reads and writes its transaction), so it cannot
    hand the thread to another writer mid-transaction; if one ever did, the
    second would find the transaction open and fail here, rather than wait on
    LMDB's writer lock, which its own thread holds.
    """

    def __init__(self, env: Any, *, durable: bool) -> None:
        self._env = env
        self._durable = durable  # each commit flushed (``durability="sync"``)
        self._open = False
        self._closed = False
        self.groups = 0  # commits made, for the benchmarks
        self.bodies = 0

    def run(self, body: Callable[[Txn], T]) -> T:
        if self._closed:
            raise StoreClosedError()
        if self._open:
            raise RuntimeError("a write transaction is already open on this thread")
        self._open = True
        self.groups += 1
        self.bodies += 1
        try:
            with self._env.begin(write=True) as txn:
                result = body(txn)
        except lmdb.Error as exc:
            raise _storage_error(exc) from exc
        finally:
            self._open = False
        if self._durable:
            sync_meta(self._env)
        return result

    def close(self) -> None:
        self._closed = True


def sync_meta(env: Any) -> None:
    """Make a durable commit's meta page, which makes it current, reach the disk.

    The store's environment is opened without LMDB's own meta flush (``metasync``):
    a durable commit flushes its pages under the writer lock, and its writer calls
    this once the lock is released, so other processes' commits need not wait for a
    second flush. Until then a crash of the machine may undo the commit, but never
    damage the store (LMDB writes the meta page only once the pages it names are on
    disk). Nobody may be told of the commit before this returns.

    Raises:
        StorageError: the flush failed; the commit is made but may not be durable.
    """
    try:
        env.sync(True)
    except lmdb.Error as exc:
        raise StorageError(f"a write committed but failed to sync: {exc}") from exc


def _storage_error(exc: lmdb.Error) -> StorageError:
    error = StorageError(f"write failed and was rolled back: {exc}")
    error.__cause__ = exc
    return error


def _result(job: _Job) -> Any:
    if job.error is not None:
        raise job.error
    return job.value
