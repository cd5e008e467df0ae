"""Every write of a store takes its writer lock (``<store>/writer.lock``, an ``flock``).

LMDB's own writer mutex can leave its waiters asleep for good when a holder in another
process is SIGKILLed (src/dopool/_writerlock.py); the kernel releases an flock
when its holder dies and wakes the next waiter. These tests hold the lock from outside
(another open file, as another process would) and watch a write wait for it.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import dopool
from dopool import Runtime
from dopool._writerlock import WRITER_LOCK
from worker_support import parent_of_a_lingering_child

TIMEOUT = 60.0


@contextmanager
def held(store: Path) -> Iterator[None]:
    """The store's writer lock, held as another process would hold it."""
    fd = os.open(store / WRITER_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases it


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
        from dopool._writerlock import WriterLock
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
