"""``dopool.connect``: producers in other processes beside the runtime that owns the store.

Real processes (``_connect_child.py``, run with ``sys.executable``) enqueue while a
runtime, in this process or another, runs the handlers. Nothing here sleeps to wait
for the engine: it waits on events and on the children, with timeouts.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dopool
from dopool import (
    ConfigurationError,
    EventContext,
    EventTooLargeError,
    EventValidationError,
    FilterError,
    PermanentError,
    PoolClosedError,
    PoolNotFoundError,
    QueueFullError,
    Runtime,
    ScheduleError,
    StoreFormatError,
    StoreNotFoundError,
)
from dopool._engine.memory import InstanceMemory
from dopool._engine.wakeups import WAKE_SOCKET, Notifier, StoreWatcher
from dopool._ops.storeview import open_view
from dopool._store.layout import FORMAT_VERSION

CHILD = Path(__file__).parents[1] / "support" / "_connect_child.py"
FIXTURES = Path(__file__).parents[1] / "support" / "fixtures"
TIMEOUT = 60.0


def _child(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> list[str]:
    """The child's output lines, once it exited 0."""
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, err
    return out.splitlines()


def _acknowledged(lines: list[str]) -> list[dict[str, Any]]:
    assert lines[-1] == "done"
    return [json.loads(line) for line in lines[:-1]]


def _created(store: Path, pool: str = "orders", concurrency: int = 4) -> None:
    """A store in which a runtime defined ``pool``, owned by nobody now."""
    with Runtime(store) as runtime:
        runtime.define(pool, execute=_never, concurrency=concurrency)


def _never(_ctx: EventContext) -> None:
    raise AssertionError("no event runs here")


def _checked(store: Path) -> None:
    """``dopool check``'s verdict on the store: clean."""
    with open_view(store) as view:
        report = view.check()
    assert report.ok, report.problems


class Recorder:
    """A handler that records each execution and says when it has seen ``expected``."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.runs: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def __call__(self, ctx: EventContext) -> None:
        event = ctx.event
        with self.lock:
            self.runs.append(
                {**event, "index": ctx.instance_index, "sequence": ctx.sequence}
                if isinstance(event, dict)
                else {"event": event, "index": ctx.instance_index, "sequence": ctx.sequence}
            )
            if len(self.runs) >= self.expected:
                self.finished.set()


def _check_runs(acknowledged: list[dict[str, Any]], runs: list[dict[str, Any]]) -> None:
    """Every acknowledged event ran exactly once, where it was routed, and each producer's
    partition ran in its enqueue order (docs/guarantees.md, "Order and priority")."""
    ran = sorted((run["p"], run["k"]) for run in runs)
    assert ran == sorted((ack["p"], ack["k"]) for ack in acknowledged)
    assert len(set(ran)) == len(ran)
    where = {(ack["p"], ack["k"]): ack["index"] for ack in acknowledged}
    assert all(where[run["p"], run["k"]] == run["index"] for run in runs)
    partitions: dict[tuple[int, str], list[int]] = defaultdict(list)
    for run in runs:  # in the order they ran
        if run["key"] is not None:
            partitions[run["p"], run["key"]].append(run["k"])
    assert partitions
    assert all(ks == sorted(ks) for ks in partitions.values())
    # Partition keys route by the stable hash: one instance per key, whoever enqueued it.
    instances: dict[str, set[int]] = defaultdict(set)
    for run in runs:
        if run["key"] is not None:
            instances[run["key"]].add(run["index"])
    assert all(len(indices) == 1 for indices in instances.values())


# -- processes ---------------------------------------------------------------------------


def test_producer_processes_feed_a_runtime_in_this_process(store_path: Path) -> None:
    producers, count = 3, 45
    recorder = Recorder(producers * count)
    with Runtime(store_path) as runtime:
        pool = runtime.define("orders", execute=recorder, concurrency=4)
        children = [_child("produce", store_path, "orders", p, count) for p in range(producers)]
        acknowledged = [ack for proc in children for ack in _acknowledged(_finish(proc))]
        assert recorder.finished.wait(TIMEOUT)
        assert pool.join(TIMEOUT)
        status = pool.status()
    _check_runs(acknowledged, recorder.runs)
    assert status.enqueued == status.succeeded == producers * count
    assert status.pending == 0
    # Round-robin from each producer spread its events over every instance.
    assert {ack["index"] for ack in acknowledged} == {0, 1, 2, 3}
    _checked(store_path)


def test_a_runtime_in_another_process_runs_what_this_one_and_others_enqueue(
    store_path: Path,
) -> None:
    _created(store_path)
    producers, count, own_count = 2, 30, 20
    expected = producers * count + own_count
    owner = _child("own", store_path, "orders", 4, expected)
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "ready"
        children = [_child("produce", store_path, "orders", p, count) for p in range(producers)]
        mine = []
        with dopool.connect(store_path) as connection:
            pool = connection.pool("orders")
            for k in range(own_count):
                key = f"key-{k % 5}"
                result = pool.enqueue({"p": 9, "k": k, "key": key}, partition_key=key)
                mine.append(
                    {"p": 9, "k": k, "event_id": result.event_id, "index": result.instance_index}
                )
        # dopool status reads beside the owner and the producers.
        status = subprocess.run(
            [sys.executable, "-m", "dopool", "status", str(store_path), "--json"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pools"][0]["name"] == "orders"
        acknowledged = mine + [ack for proc in children for ack in _acknowledged(_finish(proc))]
        lines = _finish(owner)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.communicate()
    assert lines[-1] == "closed"
    _check_runs(acknowledged, [json.loads(line) for line in lines[:-1]])
    with open_view(store_path) as view:
        stored = view.status("orders", 4)
        report = view.check()
    assert stored.enqueued == stored.succeeded == expected
    assert report.ok, report.problems


def test_a_producer_racing_the_owners_own_enqueues_and_processing_loses_nothing(
    store_path: Path,
) -> None:
    """The owner's cached meta is checked against the store in each transaction.

    With that check skipped (``InstanceShell._load_meta`` returning its cached meta
    whatever the store holds), this fails: the owner writes over the producer's
    events and counters.
    """
    count, own_count = 150, 150
    recorder = Recorder(count + own_count)
    with Runtime(store_path) as runtime:
        pool = runtime.define("orders", execute=recorder, concurrency=1)
        producer = _child("produce", store_path, "orders", 0, count)
        mine = []
        for k in range(own_count):  # the owner enqueues while the producer does
            key = "key-0" if k % 2 else None
            result = pool.enqueue({"p": 1, "k": k, "key": key}, partition_key=key)
            mine.append({"p": 1, "k": k, "event_id": result.event_id, "index": 0})
        acknowledged = mine + _acknowledged(_finish(producer))
        assert recorder.finished.wait(TIMEOUT)
        assert pool.join(TIMEOUT)
        status = pool.status()
    assert len({ack["event_id"] for ack in acknowledged}) == count + own_count
    _check_runs(acknowledged, recorder.runs)
    assert status.enqueued == status.succeeded == count + own_count
    _checked(store_path)


# -- no owner, lost and hostile wake-ups ------------------------------------------------------


def test_events_enqueued_with_no_owner_run_when_a_runtime_opens(store_path: Path) -> None:
    _created(store_path)
    with dopool.connect(store_path) as connection:
        pool = connection.pool("orders")
        pool.enqueue_many([{"n": n} for n in range(6)])
        pool.enqueue({"n": 6}, partition_key="a", priority=3)
        waiting = pool.status()
    assert waiting.pending == waiting.enqueued == 7
    assert all(s.next_alarm_at is not None for s in waiting.instances if s.pending)
    recorder = Recorder(7)
    with Runtime(store_path) as runtime:
        runtime.define("orders", execute=recorder, concurrency=4)  # recovery re-arms them
        assert recorder.finished.wait(TIMEOUT)
        assert runtime.pools["orders"].join(TIMEOUT)
    assert sorted(run["n"] for run in recorder.runs) == list(range(7))
    _checked(store_path)


def test_without_wake_ups_the_poll_delivers(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StoreWatcher, "_bind", lambda _self: None)  # no socket: lost
    _created(store_path)
    recorder = Recorder(5)
    with Runtime(store_path, poll_interval=0.05) as runtime:
        assert runtime._watcher is not None
        assert not runtime._watcher.listening
        runtime.define("orders", execute=recorder, concurrency=4)
        with dopool.connect(store_path) as connection:
            pool = connection.pool("orders")
            for n in range(5):
                pool.enqueue({"n": n})
        assert recorder.finished.wait(TIMEOUT)
    assert sorted(run["n"] for run in recorder.runs) == list(range(5))


def test_a_wake_up_starts_the_event_without_the_poll(store_path: Path) -> None:
    _created(store_path)
    recorder = Recorder(3)
    with Runtime(store_path, poll_interval=3600) as runtime:  # the poll never comes
        assert runtime._watcher is not None
        assert runtime._watcher.listening
        runtime.define("orders", execute=recorder, concurrency=4)
        with dopool.connect(store_path) as connection:
            pool = connection.pool("orders")
            pool.enqueue({"n": 0}, delay=0.01)  # the owner's clock sets its alarm
            pool.enqueue_many([{"n": 1}, {"n": 2}])
        assert recorder.finished.wait(TIMEOUT)


def test_an_enqueue_into_an_instance_mid_attempt_wakes_nobody(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt's outcome commit reads the store anew and takes the event up: the
    producer sends no wake-up (the poll never comes here, so a wrong skip stalls)."""
    _created(store_path)
    sent: list[tuple[str, int]] = []
    wake = Notifier.wake

    def counted(notifier: Notifier, pool: str, index: int, owner: str | None = None) -> None:
        sent.append((pool, index))
        wake(notifier, pool, index, owner)

    monkeypatch.setattr(Notifier, "wake", counted)
    entered = threading.Event()
    release = threading.Event()

    def handler(ctx: EventContext) -> None:
        if ctx.event == "first":
            entered.set()
            assert release.wait(TIMEOUT)

    with Runtime(store_path, poll_interval=3600) as runtime:
        served = runtime.define("orders", execute=handler, concurrency=1)
        with dopool.connect(store_path, via_owner=False) as connection:
            pool = connection.pool("orders")
            pool.enqueue("first")  # into an idle instance: its owner is woken
            assert entered.wait(TIMEOUT)
            pool.enqueue("second")
            assert sent == [("orders", 0)]
            release.set()
            assert served.join(TIMEOUT)
        assert served.status().succeeded == 2


def _send(path: Path, data: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(data, str(path))


def _drained(sock: socket.socket) -> None:
    """Wait until nothing waits to be read on ``sock`` (at most ``TIMEOUT`` seconds)."""
    deadline = threading.Event()
    for _ in range(int(TIMEOUT / 0.01)):
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return
        deadline.wait(0.01)
    raise AssertionError(f"the wake-up socket still held datagrams after {TIMEOUT} s")


def test_a_store_path_too_long_for_a_socket_address_still_gets_wake_ups(tmp_path: Path) -> None:
    store = tmp_path / ("d" * 120) / "store"
    _created(store)
    recorder = Recorder(1)
    with Runtime(store, poll_interval=3600) as runtime:  # the poll never comes
        assert runtime._watcher is not None
        assert runtime._watcher.listening
        runtime.define("orders", execute=recorder, concurrency=4)
        with dopool.connect(store) as connection:
            connection.pool("orders").enqueue("woken")
        assert recorder.finished.wait(TIMEOUT)
    assert not (store / WAKE_SOCKET).exists()


def test_hostile_datagrams_are_ignored(store_path: Path) -> None:
    _created(store_path)
    recorder = Recorder(1)
    with Runtime(store_path, poll_interval=3600) as runtime:
        pool = runtime.define("orders", execute=recorder, concurrency=4)
        address = store_path / WAKE_SOCKET
        for data in (
            b"",
            b"\0",
            b"orders",
            b"orders\0",
            b"orders\0-1",
            b"orders\x004",  # beyond the concurrency
            b"orders\x0099999999999",
            b"nope\x000",  # a pool not defined here
            b"\xff\xfe\0\x01",
            b"a" * 60_000,
            bytes(range(256)),
            b"orders\x000\x000",
        ):
            _send(address, data)
        _send(address, b"orders\x002")  # a wake-up of an idle instance: harmless
        # A producer's wake-up never blocks: sent into a queue the datagrams above still
        # fill (the kernel queues 10), it would be dropped for the poll, which never comes
        # here. So the enqueue waits until the watcher has read them all.
        watcher = runtime._watcher
        assert watcher is not None
        assert watcher._socket is not None
        _drained(watcher._socket)
        with dopool.connect(store_path) as connection:
            connection.pool("orders").enqueue("still works")
        assert recorder.finished.wait(TIMEOUT)
        assert pool.join(TIMEOUT)
        assert all(s.restarts == 0 for s in pool.status().instances)


class _Mailbox:
    def __init__(self, *, vacant: bool = False) -> None:
        self.alarms = 0
        self.vacant = vacant

    def fire_alarm(self) -> bool:
        self.alarms += 1
        return not self.vacant


class _Cell:
    def __init__(self, mailbox: _Mailbox, memory: InstanceMemory) -> None:
        self.mailbox = mailbox
        self.memory = memory


class _Cells:
    """A pool of one instance, already running, as the watcher sees its cells."""

    name = "orders"
    on_demand = True
    concurrency = 1

    def __init__(self, mailbox: _Mailbox, memory: InstanceMemory) -> None:
        self._cell = _Cell(mailbox, memory)

    def __getitem__(self, index: int) -> _Cell:
        assert index == 0
        return self._cell

    def get(self, index: int) -> _Cell | None:
        return self._cell if index == 0 else None


def test_wake_ups_send_one_alarm_until_the_actor_takes_it(tmp_path: Path) -> None:
    watcher = StoreWatcher(tmp_path, 3600, _NoStore())
    try:
        mailbox, memory = _Mailbox(), InstanceMemory()
        watcher.watch("orders", _Cells(mailbox, memory))  # type: ignore[arg-type]
        for _ in range(3):
            watcher._wake("orders", 0)  # datagrams, or polls, while the alarm waits
        assert mailbox.alarms == 1
        memory.woken = False  # the actor began to handle it
        watcher._wake("orders", 0)
        watcher._wake("orders", 1)  # no such instance
        watcher._wake("emails", 0)  # no such pool
        assert mailbox.alarms == 2
    finally:
        watcher.close()
    assert not (tmp_path / WAKE_SOCKET).exists()


def test_a_wake_up_no_actor_took_holds_back_no_later_one(tmp_path: Path) -> None:
    """A shared worker polls an instance it does not serve yet (the alarm is dropped), then
    takes its lease: the next wake-up, or poll, must still send an alarm."""
    watcher = StoreWatcher(tmp_path, 3600, _NoStore())
    try:
        mailbox, memory = _Mailbox(vacant=True), InstanceMemory()
        watcher.watch("orders", _Cells(mailbox, memory))  # type: ignore[arg-type]
        watcher._wake("orders", 0)
        assert not memory.woken
        mailbox.vacant = False  # the lease taken, an actor here
        watcher._wake("orders", 0)
        watcher._wake("orders", 0)
        assert mailbox.alarms == 2
        assert memory.woken
    finally:
        watcher.close()


class _Queued:
    """A wake-up socket holding ``count`` datagrams, then none (as a non-blocking one)."""

    def __init__(self, count: int) -> None:
        self.left = count

    def recv(self, _size: int) -> bytes:
        if not self.left:
            raise BlockingIOError
        self.left -= 1
        return b"orders\x000"


@pytest.mark.parametrize("extra", [-1, 0, 5])
def test_a_run_of_datagrams_as_long_as_the_kernels_queue_polls_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: int
) -> None:
    """A producer's wake-up is dropped only when the socket's queue is full: a run of reads
    that long may have lost one, so the watcher polls then, not a poll interval later."""
    watcher = StoreWatcher(tmp_path, 3600, _NoStore())
    try:
        polls: list[int] = []
        monkeypatch.setattr(watcher, "_poll", lambda: polls.append(1))
        limit = watcher._queue_limit
        watcher._receive(_Queued(limit + extra))  # type: ignore[arg-type]
        assert len(polls) == (0 if extra < 0 else 1)
        watcher._receive(_Queued(1))  # type: ignore[arg-type]  # a short run after it: no poll
        assert len(polls) == (0 if extra < 0 else 1)
    finally:
        watcher.close()


class _NoStore:
    def read(self) -> Any:
        raise AssertionError("no poll in this test")

    def clear_stale_readers(self) -> int:
        raise AssertionError("no poll in this test")


def test_a_socket_file_left_by_a_dead_owner_is_harmless(store_path: Path) -> None:
    _created(store_path)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(store_path / WAKE_SOCKET))
    stale.close()  # as a killed owner leaves it: the file, nobody reading
    with dopool.connect(store_path) as connection:  # with no owner: ECONNREFUSED, silent
        connection.pool("orders").enqueue("first")
    recorder = Recorder(2)
    with Runtime(store_path, poll_interval=3600) as runtime:
        assert runtime._watcher is not None
        assert runtime._watcher.listening
        runtime.define("orders", execute=recorder, concurrency=4)
        with dopool.connect(store_path) as connection:
            connection.pool("orders").enqueue("second")
        assert recorder.finished.wait(TIMEOUT)
    assert not (store_path / WAKE_SOCKET).exists()  # removed on close


def test_the_watcher_stops_on_close_and_a_file_in_its_way_is_left_alone(store_path: Path) -> None:
    store_path.mkdir()
    (store_path / WAKE_SOCKET).write_text("not a socket")
    with Runtime(store_path) as runtime:
        assert runtime._watcher is not None
        assert not runtime._watcher.listening
        assert any(thread.name == "dopool-watch" for thread in threading.enumerate())
    assert not any(thread.name == "dopool-watch" for thread in threading.enumerate())
    assert (store_path / WAKE_SOCKET).read_text() == "not a socket"


def test_a_simulated_runtime_neither_listens_nor_polls(store_path: Path) -> None:
    with Runtime.simulated(store_path) as runtime:
        assert runtime._watcher is None
    assert not (store_path / WAKE_SOCKET).exists()


def test_an_open_runtime_lets_the_interpreter_exit(store_path: Path) -> None:
    code = (
        "import sys; from dopool import Runtime; "
        "rt = Runtime(sys.argv[1]); rt.define('p', execute=lambda ctx: None); print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(store_path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
    assert not (store_path / WAKE_SOCKET).exists()


# -- errors ----------------------------------------------------------------------------------


def _prints_one_enqueued(code: str, store: Path) -> None:
    """Run ``code`` (a parent that forks) on ``store``: it must exit 0 having printed 1,
    the count of events its pool holds at the end."""
    done = subprocess.run(
        [sys.executable, "-c", code, str(store)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "1"), done.stdout + done.stderr


@pytest.fixture
def created(store_path: Path) -> Path:
    _created(store_path)
    return store_path


@pytest.fixture
def producer(created: Path) -> Iterator[dopool.ProducerPool]:
    with dopool.connect(created) as connection:
        yield connection.pool("orders", schema=_no_secrets, max_queue_depth=3)


def _no_secrets(event: Any) -> Any:
    if isinstance(event, dict) and "secret" in event:
        raise ValueError("no secrets")
    return event


def test_an_unknown_pool_is_named_with_the_known_ones(created: Path) -> None:
    with dopool.connect(created) as connection, pytest.raises(PoolNotFoundError) as caught:
        connection.pool("emails")
    error = caught.value
    assert (error.path, error.pool, error.known) == (str(created), "emails", ("orders",))
    assert isinstance(error, ConfigurationError)


def test_a_store_nobody_created_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError) as caught:
        dopool.connect(tmp_path / "missing")
    assert caught.value.path == str(tmp_path / "missing")
    assert caught.value.waited == 0
    assert "created by the first `dopool worker APP --store PATH`, or `Runtime(PATH)`" in str(
        caught.value
    )
    with pytest.raises(StoreNotFoundError, match=r"data\.mdb"):
        dopool.connect(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_connect_waits_for_a_store_a_worker_creates_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A web process up before the worker that creates the store: ``wait=`` looks again
    until it is there, then connects as if it had been."""
    from dopool._store import environment

    store, looked = tmp_path / "store", threading.Event()
    check = environment.check_store_path

    def checked(path: Any) -> Path:
        try:
            return check(path)
        finally:
            looked.set()  # a first look was made: the store is created after it

    monkeypatch.setattr(environment, "check_store_path", checked)
    connected: list[dopool.Connection | BaseException] = []

    def connect() -> None:
        try:
            connected.append(dopool.connect(store, wait=60.0))
        except BaseException as exc:
            connected.append(exc)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    assert looked.wait(30.0)
    with Runtime(store) as runtime:
        runtime.define("jobs", execute=lambda ctx: None)
        thread.join(30.0)
        (connection,) = connected
        assert isinstance(connection, dopool.Connection)
        with connection:
            assert connection.pool("jobs").enqueue("x").sequence == 0


def test_connect_waits_no_longer_than_asked_and_says_so(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError) as caught:
        dopool.connect(tmp_path / "never", wait=0.2)
    assert caught.value.waited == 0.2
    assert "no such directory, after waiting 0.2 s for one" in str(caught.value)
    (tmp_path / "file").write_text("not a store")
    with pytest.raises(StoreNotFoundError, match="not a directory") as caught:
        dopool.connect(tmp_path / "file", wait=5.0)  # nothing will make a file a store
    assert caught.value.waited == 0


@pytest.mark.parametrize("wait", [-1, float("nan"), float("inf"), True, "1", None])
def test_a_bad_wait_is_refused(tmp_path: Path, wait: Any) -> None:
    with pytest.raises(ConfigurationError, match="wait must be a number of seconds"):
        dopool.connect(tmp_path, wait=wait)


def test_a_store_a_runtime_must_migrate_is_refused_as_dopool_status_does(tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(FIXTURES / "store-v2", store)
    with pytest.raises(StoreFormatError) as caught:
        dopool.connect(store)
    assert (caught.value.found, caught.value.supported) == (2, FORMAT_VERSION)
    assert "migrates it" in str(caught.value)


def test_bad_arguments_are_refused(created: Path) -> None:
    with pytest.raises(ConfigurationError, match="durability"):
        dopool.connect(created, durability="fast")
    with pytest.raises(ConfigurationError, match="path"):
        dopool.connect("")
    with dopool.connect(created) as connection:
        with pytest.raises(ConfigurationError, match="pool name"):
            connection.pool("no spaces")
        with pytest.raises(ConfigurationError, match="max_queue_depth"):
            connection.pool("orders", max_queue_depth=0)
        with pytest.raises(ConfigurationError, match="schema"):
            connection.pool("orders", schema=5)  # type: ignore[arg-type]


def test_bad_events_raise_what_a_worker_pool_raises_and_store_nothing(
    producer: dopool.ProducerPool,
) -> None:
    with pytest.raises(EventValidationError, match="schema rejected"):
        producer.enqueue({"secret": 1})
    with pytest.raises(EventValidationError) as caught:
        producer.enqueue_many([{"ok": 1}, {1, 2}])
    assert caught.value.position == 1
    with pytest.raises(EventTooLargeError):
        producer.enqueue("x" * (130 * 1024))
    with pytest.raises(EventTooLargeError):
        producer.enqueue("x", partition_key="k" * 3000)
    with pytest.raises(EventValidationError, match="priority"):
        producer.enqueue("x", priority=2**40)
    with pytest.raises(ScheduleError):
        producer.enqueue("x", delay=-1)
    with pytest.raises(ScheduleError):
        producer.enqueue("x", delay=1, not_before=5.0)
    assert producer.status().enqueued == 0


def test_a_full_instance_refuses_its_share_and_the_rest_is_stored(
    producer: dopool.ProducerPool,
) -> None:
    for _ in range(3):
        producer.enqueue("a", partition_key="same")
    with pytest.raises(QueueFullError) as caught:
        producer.enqueue("b", partition_key="same")
    assert (caught.value.depth, caught.value.max_depth, caught.value.pool) == (3, 3, "orders")
    with pytest.raises(QueueFullError) as batch:
        producer.enqueue_many(["c"] * 8)  # two for each instance: the full one refuses
    assert len(batch.value.stored) == 6
    assert producer.status().enqueued == 9


def test_a_closed_connection_refuses_calls(created: Path) -> None:
    connection = dopool.connect(created)
    pool = connection.pool("orders")
    assert pool.enqueue("x").instance_id.startswith("orders:")
    connection.close()
    connection.close()  # twice is harmless
    assert connection.closed
    for call in (
        lambda: pool.enqueue("y"),
        lambda: pool.enqueue_many(["y"]),
        pool.status,
        pool.dead_letters,
        lambda: connection.pool("orders"),
    ):
        with pytest.raises(PoolClosedError) as caught:
            call()
        assert (caught.value.pool, caught.value.closed) == ("orders", "connection")
    assert "its connection was closed" in str(caught.value)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_connection_made_before_a_fork_refuses_the_child(created: Path) -> None:
    code = textwrap.dedent(
        """
        import os, sys
        import dopool
        connection = dopool.connect(sys.argv[1])
        pool = connection.pool("orders")
        child = os.fork()
        if child == 0:
            try:
                pool.enqueue("from the child")
            except dopool.ConfigurationError as exc:
                ok = "before a fork" in str(exc)
                connection.close()  # only marks it closed: the environment is the parent's
                os._exit(0 if ok else 3)
            os._exit(4)
        assert os.waitpid(child, 0)[1] == 0
        pool.enqueue("from the parent")
        connection.close()
        print(dopool.connect(sys.argv[1]).pool("orders").status().enqueued)
        """
    )
    _prints_one_enqueued(code, created)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_connecting_again_in_a_forked_child_names_the_fork(created: Path) -> None:
    # gunicorn --preload: the master connected at import. The child's connect failed with
    # LMDB's 'already open in this process', a StorageError that told nothing of a fork.
    code = textwrap.dedent(
        """
        import os, sys
        import dopool
        connection = dopool.connect(sys.argv[1])
        child = os.fork()
        if child == 0:
            try:
                dopool.connect(sys.argv[1])
            except dopool.ConfigurationError as exc:
                os._exit(0 if "before a fork" in str(exc) else 3)
            except dopool.DopoolError as exc:
                print(type(exc).__name__, exc)
                os._exit(4)
            os._exit(5)
        assert os.waitpid(child, 0)[1] == 0
        connection.pool("orders").enqueue("from the parent")
        connection.close()
        with dopool.connect(sys.argv[1]) as again:  # once closed, the store opens anew
            print(again.pool("orders").status().enqueued)
        """
    )
    _prints_one_enqueued(code, created)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_while_another_thread_opens_a_store_leaves_the_child_free_to_connect(
    created: Path,
) -> None:
    # The lock around the process's open environments, held by a thread of the parent
    # at the fork, was never released in the child: its first connect hung.
    code = textwrap.dedent(
        """
        import os, sys
        import dopool
        from dopool._store import environment as _storage
        _storage._environments_lock.acquire()  # as a thread opening a store holds it
        child = os.fork()
        if child == 0:
            with dopool.connect(sys.argv[1]) as connection:
                connection.pool("orders").enqueue("from the child")
            os._exit(0)
        _storage._environments_lock.release()
        assert os.waitpid(child, 0)[1] == 0
        with dopool.connect(sys.argv[1]) as connection:
            print(connection.pool("orders").status().enqueued)
        """
    )
    _prints_one_enqueued(code, created)


def test_results_and_reads_match_a_worker_pools(created: Path) -> None:
    with dopool.connect(created) as connection:
        pool = connection.pool("orders")
        first = pool.enqueue("a", partition_key="k")
        second = pool.enqueue("b", partition_key="k", priority=5)
        later = pool.enqueue("c", partition_key="k", delay=3600)
        assert (first.position, second.position, later.position) == (0, 0, 2)
        assert first.instance_index == second.instance_index == later.instance_index
        assert second.event_id == f"{second.instance_id}:{second.sequence}"
        assert not second.duplicate
        status = pool.status()
        assert (status.enqueued, status.pending, status.scheduled) == (3, 3, 1)
        assert pool.dead_letters() == []
        assert pool.dead_letters(first.instance_index) == []
        with pytest.raises(ConfigurationError, match="no instance 4"):
            pool.dead_letters(4)
        assert repr(pool) == f"<ProducerPool 'orders' of {str(created)!r}>"
    with Runtime(created) as runtime:  # the owner's status reads the same
        owner = runtime.define("orders", execute=lambda ctx: None, concurrency=4)
        assert owner.status().instance(first.instance_index).enqueued == 3


def test_a_connection_in_the_owners_process_shares_its_environment(store_path: Path) -> None:
    recorder = Recorder(2)
    with Runtime(store_path, durability="async") as runtime:
        runtime.define("orders", execute=recorder, concurrency=2)
        with dopool.connect(store_path) as connection:  # sync: it fsyncs its commits itself
            assert connection._shared is runtime._store._shared
            connection.pool("orders").enqueue_many(["a", "b"])
        assert recorder.finished.wait(TIMEOUT)
    with dopool.connect(store_path, durability="async") as connection:
        with pytest.raises(ConfigurationError, match="durability='async'"):
            Runtime(store_path)
        assert connection.pool("orders").status().succeeded == 2


def test_a_producer_reads_dead_letters_with_the_worker_pools_filters(created: Path) -> None:
    recorder = Recorder(3)

    def handler(ctx: EventContext) -> None:
        recorder(ctx)
        if ctx.event != "good":
            raise PermanentError(f"boom {ctx.event}")

    with Runtime(created) as runtime:
        runtime.define("orders", execute=handler, concurrency=4)
        with dopool.connect(created) as connection:
            pool = connection.pool("orders")
            pool.enqueue("bad", partition_key="a")
            pool.enqueue("worse", partition_key="b")
            pool.enqueue("good")
            assert recorder.finished.wait(TIMEOUT)
            assert runtime.pools["orders"].join(TIMEOUT)
            assert sorted(letter.event for letter in pool.dead_letters()) == ["bad", "worse"]
            assert [letter.event for letter in pool.dead_letters(error="boom w")] == ["worse"]
            assert [letter.event for letter in pool.dead_letters(partition_key="a")] == ["bad"]
            assert pool.dead_letters(older_than=3600) == []
            with pytest.raises(FilterError):
                pool.dead_letters(older_than=-1)


def test_the_poll_interval_is_checked(store_path: Path) -> None:
    for bad in (0, -1, float("nan"), float("inf"), True, "1", 7200):
        with pytest.raises(ConfigurationError, match="poll_interval"):
            Runtime(store_path, poll_interval=bad)  # type: ignore[arg-type]
    assert not os.path.exists(store_path)
