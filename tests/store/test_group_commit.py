"""``Store.transact``: group commit in sync mode, a transaction per body in async mode.

With ``durability="sync"`` concurrent bodies share one LMDB commit, each isolated.
Tests that need a group of a known shape hold a first body inside its transaction
until the writers they want have queued behind it: the queue is watched through
the group commit's own condition, so nothing depends on thread timing. With
``"async"`` each body commits on its own; the tests run on both say so.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dopool._errors import StorageError
from dopool._store.commit import GroupCommit, OwnCommit
from dopool._store.environment import Store
from dopool._store.txn import Txn

pytestmark = pytest.mark.threaded

TIMEOUT = 10.0
TOO_LONG_KEY = b"k" * 600  # LMDB refuses keys over 511 bytes (lmdb.BadValsizeError)


@pytest.fixture(params=["sync", "async"])
def store(request: pytest.FixtureRequest, store_path: Path) -> Iterator[Store]:
    yield from opened(store_path, request.param)


@pytest.fixture
def sync_store(store_path: Path) -> Iterator[Store]:
    yield from opened(store_path, "sync")


@pytest.fixture
def async_store(store_path: Path) -> Iterator[Store]:
    yield from opened(store_path, "async")


def opened(store_path: Path, durability: str) -> Iterator[Store]:
    store = Store(store_path, durability=durability)
    yield store
    store.close()


def put(key: bytes, value: bytes, result: Any = None) -> Callable[[Txn], Any]:
    def body(txn: Txn) -> Any:
        txn.put(key, value)
        return result

    return body


def committed(store: Store, key: bytes) -> bytes | None:
    with store.read() as txn:
        value: bytes | None = txn.get(key)
        return value


def in_thread(store: Store, body: Callable[[Txn], Any]) -> Future[Any]:
    """``store.transact(body)`` on a new thread; the future holds its result or exception."""
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(store.transact(body))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


def wait_queued(store: Store, count: int) -> None:
    """Wait until ``count`` writers wait behind the group being committed."""
    group = store._group
    assert isinstance(group, GroupCommit)
    deadline = time.monotonic() + TIMEOUT
    with group._cond:
        while len(group._queue) < count:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(group._queue)} of {count} writers queued"
            group._cond.wait(min(remaining, 0.01))


class Gate:
    """A transaction body that stays inside its transaction until opened."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.open = threading.Event()

    def __call__(self, txn: Txn) -> str:
        txn.put(b"gate", b"held")
        self.inside.set()
        assert self.open.wait(TIMEOUT)
        return "gate"


def queue_behind_gate(
    store: Store,
    bodies: list[Callable[[Txn], Any]],
    meanwhile: Callable[[], object] = lambda: None,
) -> list[Future[Any]]:
    """Hold a lone first group, queue ``bodies`` behind it in order, then let it commit.

    The bodies then form one group, in that order, led by the first of them.
    ``meanwhile`` runs while the first group is held, before the bodies queue.
    """
    gate = Gate()
    gated = in_thread(store, gate)
    assert gate.inside.wait(TIMEOUT)
    meanwhile()
    futures = []
    for number, body in enumerate(bodies, start=1):
        futures.append(in_thread(store, body))
        wait_queued(store, number)
    gate.open.set()
    assert gated.result(TIMEOUT) == "gate"
    return futures


# -- coalescing -------------------------------------------------------------------


def test_a_lone_writer_commits_alone_and_gets_its_result(store: Store) -> None:
    assert store.transact(put(b"a", b"1", result="done")) == "done"

    assert committed(store, b"a") == b"1"
    assert store.commit_counts == (1, 1)


def test_writers_queued_behind_a_commit_share_the_next_one(sync_store: Store) -> None:
    bodies = [put(b"k%d" % n, b"v%d" % n, result=n) for n in range(7)]

    futures = queue_behind_gate(sync_store, bodies)

    assert [future.result(TIMEOUT) for future in futures] == list(range(7))
    assert sync_store.commit_counts == (2, 8)  # the gate alone, then the seven together
    for n in range(7):
        assert committed(sync_store, b"k%d" % n) == b"v%d" % n


def test_many_concurrent_writers_every_write_lands_and_results_reach_their_callers(
    sync_store: Store,
) -> None:
    store = sync_store
    threads, writes = 8, 200
    wrong: list[tuple[int, int, Any]] = []
    unseen: list[tuple[int, int]] = []

    def writer(thread: int) -> None:
        for n in range(writes):
            key = f"{thread}/{n}".encode()
            got = store.transact(put(key, b"%d" % n, result=(thread, n)))
            if got != (thread, n):
                wrong.append((thread, n, got))
            if committed(store, key) != b"%d" % n:  # durable before transact returned
                unseen.append((thread, n))

    # Every writer's first body queues behind a held one, so at least one group is shared.
    gate = Gate()
    gated = in_thread(store, gate)
    assert gate.inside.wait(TIMEOUT)
    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    wait_queued(store, threads)
    gate.open.set()
    assert gated.result(TIMEOUT) == "gate"
    for worker in workers:
        worker.join(TIMEOUT)
        assert not worker.is_alive()

    assert wrong == []
    assert unseen == []
    with store.read() as txn:
        # and the gate's key, and the store's format record
        assert sum(1 for _ in txn.cursor()) == threads * writes + 2
    commits, bodies = store.commit_counts
    assert bodies == threads * writes + 1
    assert commits <= bodies - (threads - 1)  # the first bodies of all eight shared a commit


def test_a_lone_writer_after_a_large_group_does_not_wait_for_company(sync_store: Store) -> None:
    """The leader expects as many writers as last time, but waits only a fraction of a commit."""
    for future in queue_behind_gate(sync_store, [put(b"k%d" % n, b"v") for n in range(7)]):
        future.result(TIMEOUT)
    assert sync_store.commit_counts == (2, 8)

    for n in range(20):
        done = in_thread(sync_store, put(b"alone%d" % n, b"v"))
        done.result(TIMEOUT)  # a leader waiting for company forever would time out here

    assert sync_store.commit_counts == (22, 28)  # one commit each


# -- isolation of a failing body --------------------------------------------------------


def raise_after_put(key: bytes) -> Callable[[Txn], Any]:
    def body(txn: Txn) -> None:
        txn.put(key, b"never")
        raise ValueError(f"body for {key!r} failed")

    return body


@pytest.mark.parametrize("failing", [0, 1, 3], ids=["leader", "middle", "last"])
def test_a_raising_body_in_a_group_is_rolled_back_alone(sync_store: Store, failing: int) -> None:
    keys = [b"k%d" % n for n in range(4)]
    bodies = [
        raise_after_put(key) if n == failing else put(key, b"v", result=n)
        for n, key in enumerate(keys)
    ]

    futures = queue_behind_gate(sync_store, bodies)

    for n, future in enumerate(futures):
        if n == failing:
            with pytest.raises(ValueError, match="failed"):
                future.result(TIMEOUT)
        else:
            assert future.result(TIMEOUT) == n
    assert sync_store.commit_counts == (2, 5)  # the failure did not split the group
    for n, key in enumerate(keys):
        assert committed(sync_store, key) == (None if n == failing else b"v")
    assert committed(sync_store, b"gate") == b"held"


def test_a_lone_raising_body_is_rolled_back_and_reraised(store: Store) -> None:
    with pytest.raises(ValueError, match="failed"):
        store.transact(raise_after_put(b"a"))

    assert committed(store, b"a") is None
    assert store.transact(put(b"b", b"1", result="next")) == "next"  # the store goes on
    assert committed(store, b"b") == b"1"


def test_each_caller_gets_the_exception_its_own_body_raised(sync_store: Store) -> None:
    class Mine(Exception):
        pass

    def raises(n: int) -> Callable[[Txn], Any]:
        def body(_txn: Txn) -> None:
            raise Mine(n)

        return body

    futures = queue_behind_gate(sync_store, [raises(n) for n in range(5)])

    for n, future in enumerate(futures):
        error = future.exception(TIMEOUT)
        assert isinstance(error, Mine)
        assert error.args == (n,)


# -- lmdb errors ----------------------------------------------------------------------


def test_an_lmdb_error_in_a_lone_body_is_a_storage_error(store: Store) -> None:
    with pytest.raises(StorageError) as info:
        store.transact(put(TOO_LONG_KEY, b"v"))

    assert isinstance(info.value.__cause__, lmdb.BadValsizeError)
    assert store.transact(put(b"a", b"1", result="next")) == "next"


def test_an_lmdb_error_in_a_group_is_a_storage_error_for_that_body_only(
    sync_store: Store,
) -> None:
    def too_long(txn: Txn) -> None:
        txn.put(b"first", b"v")
        txn.put(TOO_LONG_KEY, b"v")

    fine, failing = queue_behind_gate(sync_store, [put(b"a", b"v", result="a"), too_long])

    error = failing.exception(TIMEOUT)
    assert isinstance(error, StorageError)
    assert isinstance(error.__cause__, lmdb.BadValsizeError)
    assert fine.result(TIMEOUT) == "a"
    assert sync_store.commit_counts == (2, 3)
    assert committed(sync_store, b"first") is None  # its own earlier write went with it
    assert committed(sync_store, b"a") == b"v"


class _CommitFails:
    """An LMDB environment whose outermost write transactions fail to commit."""

    def __init__(self, env: Any) -> None:
        self._env = env

    def begin(self, *, write: bool = False, parent: Any = None, **options: Any) -> Any:
        txn = self._env.begin(write=write, parent=parent, **options)
        return txn if parent is not None else _FailingCommit(txn)

    def sync(self, force: bool = False) -> None:
        self._env.sync(force)


class _FlushFails:
    """An LMDB environment whose commits go through, and whose flushes after them fail
    but the first (the group in hand when it is put in place)."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self._passes = 1

    def begin(self, **options: Any) -> Any:
        return self._env.begin(**options)

    def sync(self, force: bool = False) -> None:
        if self._passes:
            self._passes -= 1
            self._env.sync(force)
            return
        raise lmdb.DiskError("fdatasync failed")


class _FailingCommit:
    def __init__(self, txn: Any) -> None:
        self._txn = txn

    def __enter__(self) -> Any:
        return self._txn

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._txn.abort()
        if exc_type is None:
            raise lmdb.DiskError("commit failed")


def test_a_failed_commit_fails_every_body_of_the_group(
    sync_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [put(b"a", b"v", result="a"), raise_after_put(b"b"), put(b"c", b"v", result="c")]
    # The gate's commit goes through; the group queued behind it fails to commit.
    futures = queue_behind_gate(
        sync_store,
        bodies,
        lambda: monkeypatch.setattr(sync_store._group, "_env", _CommitFails(sync_store._env)),
    )

    for n in (0, 2):
        error = futures[n].exception(TIMEOUT)
        assert isinstance(error, StorageError)
        assert isinstance(error.__cause__, lmdb.DiskError)
    assert isinstance(futures[1].exception(TIMEOUT), ValueError)  # its own error, not the commit's
    for key in (b"a", b"b", b"c"):
        assert committed(sync_store, key) is None
    assert committed(sync_store, b"gate") == b"held"


def test_a_failed_commit_of_a_lone_body_is_a_storage_error(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store._group, "_env", _CommitFails(store._env))

    with pytest.raises(StorageError) as info:
        store.transact(put(b"a", b"v"))

    assert isinstance(info.value.__cause__, lmdb.DiskError)
    monkeypatch.undo()
    assert committed(store, b"a") is None
    assert store.transact(put(b"a", b"v", result="again")) == "again"


def test_a_failed_flush_after_the_commit_is_a_storage_error_for_every_body(
    sync_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A durable commit's meta page is flushed after it (``sync_meta``): a flush that fails
    is told to every writer of the group, which must not take its commit for durable."""
    bodies = [put(b"a", b"v", result="a"), put(b"b", b"v", result="b")]
    futures = queue_behind_gate(
        sync_store,
        bodies,
        lambda: monkeypatch.setattr(sync_store._group, "_env", _FlushFails(sync_store._env)),
    )

    for future in futures:
        error = future.exception(TIMEOUT)
        assert isinstance(error, StorageError)
        assert "committed but failed to sync" in str(error)
        assert isinstance(error.__cause__, lmdb.DiskError)
    assert committed(sync_store, b"a") == b"v"  # made, but not known to be on disk


# -- a group against a model ------------------------------------------------------

KEYS = [b"a", b"b", b"c"]
# One operation of a body: set a key, delete it, or append to what the body reads there.
operation = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(KEYS), st.binary(min_size=1, max_size=3)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.just(b"")),
    st.tuples(st.just("append"), st.sampled_from(KEYS), st.binary(min_size=1, max_size=3)),
)
# A body: its operations, and whether it raises after doing them.
body_spec = st.tuples(st.lists(operation, max_size=4), st.booleans())


def apply(
    ops: list[tuple[str, bytes, bytes]],
    read: Callable[[bytes], bytes | None],
    write: Callable[[bytes, bytes | None], None],
) -> list[bytes | None]:
    """Do ``ops`` against a store or a model; returns what each ``append`` read."""
    seen = []
    for kind, key, value in ops:
        if kind == "set":
            write(key, value)
        elif kind == "delete":
            write(key, None)
        else:
            current = read(key)
            seen.append(current)
            write(key, (current or b"") + value)
    return seen


def spec_body(ops: list[tuple[str, bytes, bytes]], fails: bool) -> Callable[[Txn], Any]:
    def body(txn: Txn) -> list[bytes | None]:
        def write(key: bytes, value: bytes | None) -> None:
            if value is None:
                txn.delete(key)
            else:
                txn.put(key, value)

        seen = apply(ops, txn.get, write)
        if fails:
            raise ValueError("planned")
        return seen

    return body


@given(bodies=st.lists(body_spec, min_size=1, max_size=6))
@settings(max_examples=40, deadline=None)
def test_a_group_commits_exactly_what_its_bodies_would_alone_in_order(
    bodies: list[tuple[list[tuple[str, bytes, bytes]], bool]],
) -> None:
    """Each body sees the writes of the ones before it that succeeded, and only those."""
    model: dict[bytes, bytes] = {}

    def write(key: bytes, value: bytes | None) -> None:
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value

    with tempfile.TemporaryDirectory() as directory:
        store = Store(Path(directory), durability="sync")
        try:
            futures = queue_behind_gate(store, [spec_body(ops, fails) for ops, fails in bodies])
            for (ops, fails), future in zip(bodies, futures, strict=True):
                if fails:
                    with pytest.raises(ValueError, match="planned"):
                        future.result(TIMEOUT)
                    continue
                before = dict(model)
                expected = apply(ops, model.get, write)
                assert future.result(TIMEOUT) == expected, before
            assert store.commit_counts == (2, len(bodies) + 1)  # one group behind the gate
            with store.read() as txn:
                stored = {key: txn.get(key) for key in KEYS}
        finally:
            store.close()
    assert stored == {key: model.get(key) for key in KEYS}


def close_waits_for(store: Store, gate: Gate) -> None:
    """Close ``store`` while ``gate`` holds its transaction open: close returns after it."""
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.05)
    assert closer.is_alive()  # a transaction is still open: the environment must stay
    gate.open.set()
    closer.join(TIMEOUT)
    assert not closer.is_alive()


def assert_closed_keeping(store: Store, store_path: Path, key: bytes, value: bytes) -> None:
    """The closed store refuses bodies; reopened, it holds ``key`` and nothing sent late."""
    with pytest.raises(StorageError, match="closed"):
        store.transact(put(b"late", b"v"))
    reopened = Store(store_path)
    try:
        assert committed(reopened, key) == value
        assert committed(reopened, b"late") is None
    finally:
        reopened.close()


def test_close_waits_for_queued_groups_and_refuses_new_bodies(store_path: Path) -> None:
    store = Store(store_path, durability="sync")
    gate = Gate()
    gated = in_thread(store, gate)
    assert gate.inside.wait(TIMEOUT)
    queued = in_thread(store, put(b"queued", b"v", result="done"))
    wait_queued(store, 1)
    close_waits_for(store, gate)
    assert gated.result(TIMEOUT) == "gate"
    assert queued.result(TIMEOUT) == "done"  # queued before the close: committed
    assert_closed_keeping(store, store_path, b"queued", b"v")


# -- async: a transaction per body ------------------------------------------------------


def test_async_writers_commit_one_body_each_and_see_their_writes_on_return(
    async_store: Store,
) -> None:
    threads, writes = 8, 200
    wrong: list[tuple[int, int, Any]] = []

    def writer(thread: int) -> None:
        for n in range(writes):
            key = f"{thread}/{n}".encode()
            got = async_store.transact(put(key, b"%d" % n, result=(thread, n)))
            if got != (thread, n) or committed(async_store, key) != b"%d" % n:
                wrong.append((thread, n, got))

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(TIMEOUT)
        assert not worker.is_alive()

    assert wrong == []
    assert async_store.commit_counts == (threads * writes, threads * writes)
    with async_store.read() as txn:
        assert sum(1 for _ in txn.cursor()) == threads * writes + 1  # + the format record


def test_async_close_waits_for_an_open_transaction_then_refuses_bodies(
    store_path: Path,
) -> None:
    store = Store(store_path, durability="async")
    gate = Gate()
    gated = in_thread(store, gate)
    assert gate.inside.wait(TIMEOUT)
    close_waits_for(store, gate)
    assert gated.result(TIMEOUT) == "gate"  # begun before the close: committed
    assert_closed_keeping(store, store_path, b"gate", b"held")


class _Waiters(list[Any]):
    """A turn's queue of waiters that signals when a writer joins it."""

    def __init__(self) -> None:
        super().__init__()
        self.joined = threading.Event()

    def append(self, item: Any) -> None:
        super().append(item)
        self.joined.set()


def test_async_writers_take_turns_in_arrival_order(async_store: Store) -> None:
    """A writer that just committed cannot take the writer lock again past one that waits."""
    own = async_store._group
    assert isinstance(own, OwnCommit)
    waiters = own._turn._waiters = _Waiters()
    gate = Gate()
    rounds = 50

    def count(txn: Txn) -> None:
        txn.put(b"count", b"%d" % (int(txn.get(b"count") or b"0") + 1))

    def busy_writer() -> None:  # the gate, then transactions back to back
        async_store.transact(gate)
        for _ in range(rounds):
            async_store.transact(count)

    def seen(txn: Txn) -> bytes | None:
        value: bytes | None = txn.get(b"count")
        return value

    busy = threading.Thread(target=busy_writer)
    busy.start()
    assert gate.inside.wait(TIMEOUT)
    waiting = in_thread(async_store, seen)
    assert waiters.joined.wait(TIMEOUT)  # queued behind the gate
    gate.open.set()

    assert waiting.result(TIMEOUT) is None  # it went right after the gate, before any count
    busy.join(TIMEOUT)
    assert committed(async_store, b"count") == b"%d" % rounds
