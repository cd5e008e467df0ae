"""Every write of a store takes its writer lock (``<store>/writer.lock``, an ``flock``).

LMDB's own writer mutex can leave its waiters asleep for good when a holder in another
process is SIGKILLed (src/dopool/_store/writerlock.py); the kernel releases an flock
when its holder dies and wakes the next waiter. These tests hold the lock from outside
(another open file, as another process would) and watch a write wait for it.
"""

from __future__ import annotations

import fcntl
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import dopool
from dopool import ConfigurationError, Runtime, StoreBusyError
from dopool._store.writerlock import WRITER_LOCK
from worker_support import parent_of_a_lingering_child
from writer_lock_support import frozen_writer, held

TIMEOUT = 60.0


def waits_for_the_lock(store: Path, write: Callable[[], object]) -> None:
    done = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            write()
        except BaseException as exc:  # reported below
            failed.append(exc)
        finally:
            done.set()

    with held(store):
        writer = threading.Thread(target=run)
        writer.start()
        # It cannot finish while the lock is held elsewhere (a slow machine would only
        # make this pass without proving anything, never fail).
        assert not done.wait(0.3), "the write did not wait for the writer lock"
    assert done.wait(TIMEOUT)
    writer.join()
    assert not failed, failed


@pytest.mark.threaded
@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_runtime_and_a_producer_each_wait_for_the_writer_lock(
    durability: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    with Runtime(store, durability=durability) as runtime:
        pool = runtime.define("jobs", execute=lambda ctx: None)
        pool.pause()
        waits_for_the_lock(store, lambda: pool.enqueue("from the runtime"))
        with dopool.connect(store, durability="async") as connection:
            producer = connection.pool("jobs")
            waits_for_the_lock(store, lambda: producer.enqueue("from a producer"))
        assert pool.status().pending == 2


def test_the_lock_file_is_made_beside_the_store_lock(tmp_path: Path) -> None:
    with Runtime(tmp_path / "store", durability="async"):
        assert (tmp_path / "store" / WRITER_LOCK).is_file()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_keep_a_dead_parents_writer_lock(tmp_path: Path) -> None:
    # flock locks belong to the open file, which a fork shares: a parent killed while
    # writing left its lock held by a child that had never written, and every other
    # writer of the store waited for as long as the child lived.
    before = """
        import sys
        from pathlib import Path
        from dopool._store.writerlock import WriterLock
        lock = WriterLock(Path(sys.argv[1]))
        """
    after = """
        lock.__enter__()
        print("holding", flush=True)
        os._exit(0)  # dies holding the lock
        """
    with parent_of_a_lingering_child(before, after, str(tmp_path)) as line:
        assert line == "holding\n"
        fd = os.open(tmp_path / WRITER_LOCK, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if held
        finally:
            os.close(fd)


# -- a producer's bounded wait ------------------------------------------------------------


@pytest.fixture
def paused_store(tmp_path: Path) -> Path:
    """A store whose pool ``jobs`` is paused, its runtime closed: nothing else writes."""
    store = tmp_path / "store"
    with Runtime(store, durability="async") as runtime:
        runtime.define("jobs", execute=lambda ctx: None).pause()
    return store


def _pending(store: Path) -> int:
    with dopool.connect(store) as connection:
        return connection.pool("jobs").status().pending


@pytest.mark.threaded
def test_a_producer_gives_up_after_its_lock_timeout_and_stores_nothing(
    paused_store: Path,
) -> None:
    with dopool.connect(paused_store, lock_timeout=0.3) as connection:
        producer = connection.pool("jobs")
        with held(paused_store):  # another program's flock: it writes no record
            with pytest.raises(StoreBusyError) as caught:
                producer.enqueue("late")
            with pytest.raises(StoreBusyError):
                producer.enqueue_many(["a", "b"])
        error = caught.value
        assert (error.path, error.pid, error.held_for) == (str(paused_store), os.getpid(), None)
        assert error.waited >= 0.3
        assert f"process {os.getpid()} has held its writer lock for at least" in str(error)
        assert "nothing was written" in str(error)
        # The helper that went on waiting let the lock go as soon as it had it.
        producer.enqueue("on time")
    assert _pending(paused_store) == 1


@pytest.mark.threaded
def test_a_producer_names_a_frozen_dopool_writer_and_how_long_it_has_held_the_lock(
    paused_store: Path,
) -> None:
    with frozen_writer(paused_store) as pid:
        with (
            dopool.connect(paused_store, lock_timeout=0.2) as connection,
            pytest.raises(StoreBusyError) as caught,
        ):
            connection.pool("jobs").enqueue("late")
        error = caught.value
        assert error.pid == pid
        assert error.held_for is not None
        assert error.held_for >= error.waited >= 0.2
        assert f"process {pid} has held its writer lock for" in str(error)
    with dopool.connect(paused_store, lock_timeout=0.2) as connection:
        connection.pool("jobs").enqueue("after it woke")
    assert _pending(paused_store) == 1


@pytest.mark.threaded
def test_a_producer_waits_its_bound_behind_another_thread_of_its_own_process(
    paused_store: Path,
) -> None:
    """The thread lock that keeps a process's own writers apart is waited for with the
    same bound, and the error names the process that holds the store's lock."""
    with dopool.connect(paused_store, lock_timeout=0.2) as connection:
        writer = connection._shared.writer  # the process's side of the lock, shared
        writer.acquire()
        try:
            with pytest.raises(StoreBusyError) as caught:
                connection.pool("jobs").enqueue("late")
        finally:
            writer.release()
        assert caught.value.pid == os.getpid()
        assert caught.value.held_for is not None
        connection.pool("jobs").enqueue("on time")
    assert _pending(paused_store) == 1


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, 1e12, True, "10"])
def test_a_bad_lock_timeout_is_refused(paused_store: Path, bad: object) -> None:
    # (1e12: more than a thread can wait at once; None waits as long as it takes)
    with pytest.raises(ConfigurationError, match="lock_timeout"):
        dopool.connect(paused_store, lock_timeout=bad)  # type: ignore[arg-type]


def test_the_lock_timeout_is_ten_seconds_by_default_and_none_waits(paused_store: Path) -> None:
    with dopool.connect(paused_store) as connection:
        assert connection.lock_timeout == 10.0
        with pytest.raises(AttributeError):
            connection.lock_timeout = -1  # type: ignore[misc]  # read-only: checked once
    with dopool.connect(paused_store, lock_timeout=None) as connection:
        assert connection.lock_timeout is None
        waits_for_the_lock(paused_store, lambda: connection.pool("jobs").enqueue("waits"))


class _Interrupted(threading.Event):
    """A bounded wait's event whose wait Ctrl-C cuts short: at once, or (``after_taken``)
    once the helper thread has taken the lock for the caller."""

    after_taken = False

    def wait(self, timeout: float | None = None) -> bool:
        if _Interrupted.after_taken:
            super().wait(TIMEOUT)
        raise KeyboardInterrupt


def _free(store: Path) -> bool:
    """Whether another process could take the writer lock now."""
    fd = os.open(store / WRITER_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@pytest.mark.threaded
@pytest.mark.parametrize("after_taken", [False, True])
def test_a_bounded_wait_cut_short_by_ctrl_c_leaves_the_lock_free(
    paused_store: Path, monkeypatch: pytest.MonkeyPatch, after_taken: bool
) -> None:
    """Ctrl-C while a producer waits for the writer lock: whether the helper thread takes
    the lock after the interrupt or had taken it before, the process lets it go."""
    from dopool._store.writerlock import _Taking

    monkeypatch.setattr(_Interrupted, "after_taken", after_taken)
    make = _Taking.__init__

    def interruptible(taking: _Taking, since: float) -> None:
        make(taking, since)
        taking.done = _Interrupted()

    monkeypatch.setattr(_Taking, "__init__", interruptible)
    with dopool.connect(paused_store, lock_timeout=TIMEOUT) as connection:
        producer = connection.pool("jobs")
        fd = os.open(paused_store / WRITER_LOCK, os.O_RDWR)  # held as another process would
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Let it go at once after the interrupt, or while the helper waits for it.
        later = threading.Timer(0.2, os.close, (fd,))
        if after_taken:
            later.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                producer.enqueue("interrupted")
        finally:
            if after_taken:
                later.join()
            else:
                os.close(fd)
        assert _eventually(lambda: _free(paused_store))
        monkeypatch.undo()
        producer.enqueue("on time")
    assert _pending(paused_store) == 1


def _eventually(predicate: Callable[[], bool]) -> bool:
    """Whether ``predicate`` holds within ``TIMEOUT`` (checked every 10 ms)."""
    pause = threading.Event()
    for _ in range(int(TIMEOUT / 0.01)):
        if predicate():
            return True
        pause.wait(0.01)
    return False


def test_a_lock_held_for_a_moment_is_taken_without_the_helper_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit holds the lock for microseconds: a producer that finds it taken tries
    again after short pauses before it hands the wait to the helper thread (two thread
    switches), and takes it itself when it comes free meanwhile."""
    from dopool._store import writerlock

    busy = [2]  # the first two tries find it held by another process
    flock = fcntl.flock

    def held_twice(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB and busy[0]:
            busy[0] -= 1
            raise BlockingIOError
        flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", held_twice)
    lock = writerlock.WriterLock(tmp_path)
    try:
        lock.acquire(TIMEOUT)
        assert busy == [0]
        assert lock._requests is None  # no helper thread was asked
        lock.release()
    finally:
        lock.close()
