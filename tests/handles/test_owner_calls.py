"""A producer's enqueues sent to the owner of their instance (``dopool.connect(via_owner=)``).

The owner (a runtime on a real clock) stores a producer's call in its own commit, starts
the event there if the instance is free, and answers once durable; when the answer does
not come, the producer stores the call itself, and a record of each call keeps it from
being stored twice (docs/guarantees.md, "Producers' calls through the owner"). These
tests run the owner and the connection in one process (they share the store's
environment, as LMDB requires) and wait on events with timeouts, never on sleeps.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

import dopool
from dopool import EventContext, Runtime
from dopool._cluster import owner_wire
from dopool._cluster.owner_wire import Call, Request
from dopool._engine.owner_calls import CALL_SOCKET
from dopool._handles import owner_link
from dopool._machine.validation import prepare
from dopool._store.layout import call_prefix

TIMEOUT = 30.0


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Held handlers wait for it; set at the end so that nothing is left waiting."""
    event = threading.Event()
    yield event
    event.set()


def _runtime(path: Path, seen: list[Any], gate: threading.Event | None = None) -> Runtime:
    def handle(ctx: EventContext) -> None:
        seen.append(ctx.event)
        if gate is not None:
            assert gate.wait(TIMEOUT)

    runtime = Runtime(path, durability="async")
    runtime.define("orders", execute=handle, concurrency=4)
    return runtime


def _records(runtime: Runtime) -> int:
    with runtime._store.read() as txn, txn.cursor() as cursor:
        found = 0
        if cursor.set_range(call_prefix()):
            for key, _ in cursor:
                if not key.startswith(call_prefix()):
                    break
                found += 1
        return found


def test_the_owner_stores_the_call_and_starts_its_event_in_that_commit(
    tmp_path: Path, gate: threading.Event
) -> None:
    seen: list[Any] = []
    with _runtime(tmp_path / "s", seen, gate) as runtime:
        assert (tmp_path / "s" / CALL_SOCKET).exists()
        gate.set()  # the instance running, idle: started by a first event
        runtime.pools["orders"].enqueue({"n": 0}, partition_key="a")
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
        gate.clear()
        with dopool.connect(tmp_path / "s", via_owner=True) as connection:
            pool = connection.pool("orders")
            commits = runtime._store.commit_counts[1]
            result = pool.enqueue({"n": 1}, partition_key="a")
            # The owner's commit stored it (the connection's own writes are not the
            # store's committer's) and started its attempt: it is running as the call
            # returns, before any wake-up could have reached the instance.
            assert runtime._store.commit_counts[1] == commits + 1
            info = pool.event(result.event_id)
            assert info is not None
            assert info.state == "running"
            gate.set()
            assert runtime.pools["orders"].join(timeout=TIMEOUT)
    assert seen == [{"n": 0}, {"n": 1}]


def test_without_via_owner_the_connection_stores_its_calls(tmp_path: Path) -> None:
    seen: list[Any] = []
    with _runtime(tmp_path / "s", seen) as runtime:
        with dopool.connect(tmp_path / "s", via_owner=False) as connection:
            commits = runtime._store.commit_counts[1]
            connection.pool("orders").enqueue({"n": 1})
            assert runtime._store.commit_counts[1] == commits  # stored by the connection
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
    assert seen == [{"n": 1}]


def test_the_default_goes_through_the_owner_under_sync_only(tmp_path: Path) -> None:
    with _runtime(tmp_path / "s", []):
        with dopool.connect(tmp_path / "s") as synced:
            assert synced.owners is not None
        with dopool.connect(tmp_path / "s", durability="async") as unsynced:
            assert unsynced.owners is None


def test_with_no_owner_listening_the_producer_stores_the_call(tmp_path: Path) -> None:
    seen: list[Any] = []
    _runtime(tmp_path / "s", seen).close()
    with dopool.connect(tmp_path / "s", via_owner=True) as connection:
        pool = connection.pool("orders")
        results = [pool.enqueue({"n": n}, partition_key="k") for n in range(3)]
        assert [r.sequence for r in results] == [0, 1, 2]
    with _runtime(tmp_path / "s", seen) as runtime:
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
    assert seen == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_a_call_the_owner_stored_whose_answer_was_lost_gets_the_first_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner committed, then its answer never came (it died, the connection broke):
    the producer stores the call itself, finds the owner's record, and answers from it."""
    exchange = owner_link._Link._exchange
    answered: list[Any] = []

    def lost(link: Any, calls: list[Call], links: Any) -> Any:
        answered.append(exchange(link, calls, links))  # the owner stores and answers...
        return None  # ...and the answer is lost on the way

    monkeypatch.setattr(owner_link._Link, "_exchange", lost)
    seen: list[Any] = []
    with _runtime(tmp_path / "s", seen) as runtime:
        with dopool.connect(tmp_path / "s", via_owner=True) as connection:
            pool = connection.pool("orders")
            result = pool.enqueue({"n": 1}, partition_key="a")
            ((results,),) = [list(a.values()) for a in answered]
            assert results == [(result.instance_index, result.sequence, result.position, False)]
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
    assert seen == [{"n": 1}]  # stored once, run once


def test_a_call_the_producer_stored_first_is_not_stored_again_by_the_owner(
    tmp_path: Path,
) -> None:
    """The producer gave up waiting and stored the call; the owner, still holding it,
    finds the call's record and answers from it, storing nothing."""
    seen: list[Any] = []
    with _runtime(tmp_path / "s", seen) as runtime:
        with dopool.connect(tmp_path / "s", via_owner=True) as connection:
            pool = connection.pool("orders")
            owners = connection.owners
            assert owners is not None
            items = (prepare({"n": 1}, partition_key="a", priority=0, schema=None),)
            number = owners.numbers.begin()
            mine = pool._store_here(items, "a", call=number)
            index = mine[0].instance_index
            theirs = owners.call(None, Call(number, "orders", index, items))
            owners.numbers.end(number)
            assert theirs == [(index, mine[0].sequence, mine[0].position, False)]
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
    assert seen == [{"n": 1}]


def test_order_per_partition_holds_across_the_switch_between_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exchange = owner_link._Link._exchange
    turns = iter(range(10**6))

    def every_other(link: Any, calls: list[Call], links: Any) -> Any:
        if next(turns) % 2:
            return None  # "no answer": the producer stores this one itself
        return exchange(link, calls, links)

    monkeypatch.setattr(owner_link._Link, "_exchange", every_other)
    monkeypatch.setattr(owner_link, "RETRY_AFTER", 0.0)  # try the owner again at once
    seen: list[Any] = []
    with _runtime(tmp_path / "s", seen) as runtime:
        with dopool.connect(tmp_path / "s", via_owner=True) as connection:
            pool = connection.pool("orders")
            for n in range(30):
                pool.enqueue(n, partition_key="one key")
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
        assert _records(runtime) <= 1  # forgotten as the producer moved on
    assert seen == list(range(30))


def test_a_frame_that_is_no_request_closes_only_its_connection(tmp_path: Path) -> None:
    seen: list[Any] = []
    with _runtime(tmp_path / "s", seen) as runtime:
        hostile = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        hostile.settimeout(TIMEOUT)
        hostile.connect(str(tmp_path / "s" / CALL_SOCKET))
        hostile.sendall(b"\x00\x00\x00\x05hello")
        assert hostile.recv(1) == b""  # closed by the owner
        hostile.close()
        with dopool.connect(tmp_path / "s", via_owner=True) as connection:
            connection.pool("orders").enqueue({"n": 1})
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
    assert seen == [{"n": 1}]


def test_a_closed_owner_leaves_its_producers_to_store_their_calls(tmp_path: Path) -> None:
    seen: list[Any] = []
    runtime = _runtime(tmp_path / "s", seen)
    with dopool.connect(tmp_path / "s", via_owner=True) as connection:
        pool = connection.pool("orders")
        pool.enqueue(0, partition_key="k")  # through the owner: its link is open
        runtime.close()
        assert not (tmp_path / "s" / CALL_SOCKET).exists()
        pool.enqueue(1, partition_key="k")  # the link breaks: stored here
    with _runtime(tmp_path / "s", seen) as reopened:
        assert reopened.pools["orders"].join(timeout=TIMEOUT)
    assert seen == [0, 1]


def test_an_owner_whose_commit_fails_never_answers_and_the_producer_stores_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer means durable: the owner's commit failing (as a crash before it would
    leave nothing) answers nil, and the producer stores the call. An owner that answered
    from what its transaction did before the commit would leave an acknowledged event
    nowhere in the store."""
    seen: list[Any] = []
    with _runtime(tmp_path / "s", seen) as runtime:
        with dopool.connect(tmp_path / "s", via_owner=True) as connection:
            pool = connection.pool("orders")
            store = runtime._store
            transact = store.transact

            def failing(body: Any) -> Any:
                def doomed(txn: Any) -> Any:
                    body(txn)  # everything done, then the commit fails
                    raise dopool.StorageError("the disk is gone")

                return transact(doomed)

            monkeypatch.setattr(store, "transact", failing)
            results = [pool.enqueue(n, partition_key="k") for n in range(3)]
            monkeypatch.undo()
            for result in results:
                assert pool.event(result.event_id) is not None  # stored, by the producer
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
    assert sorted(seen) == [0, 1, 2]


def _batch(*calls: tuple[bytes, int, int, Any]) -> list[Request]:
    """Requests as producers send them: ``(producer, number, instance, event)`` each, one
    request per producer, ``"sync"``."""
    requests: dict[bytes, list[Call]] = {}
    for producer, number, instance, event in calls:
        items = (prepare(event, partition_key=None, priority=0, schema=None),)
        requests.setdefault(producer, []).append(Call(number, "orders", instance, items))
    return [Request(producer, 0, True, listed) for producer, listed in requests.items()]


def _started_idle(
    path: Path, seen: list[Any], running: threading.Semaphore
) -> tuple[Runtime, threading.Event]:
    """A "sync" runtime (group commit) whose four instances have run one event each and
    are idle, and the gate its handlers now wait for, each after releasing ``running``."""
    gate = threading.Event()
    gate.set()

    def handle(ctx: EventContext) -> None:
        seen.append(ctx.event)
        running.release()
        assert gate.wait(TIMEOUT)

    runtime = Runtime(path, durability="sync")
    pool = runtime.define("orders", execute=handle, concurrency=4)
    for n in range(4):  # round robin: one each
        pool.enqueue(("first", n))
    assert pool.join(timeout=TIMEOUT)
    for _ in range(4):
        assert running.acquire(timeout=TIMEOUT)
    gate.clear()
    return runtime, gate


def test_a_batch_of_calls_starts_each_idle_instances_event_in_the_commit_that_stores_it(
    tmp_path: Path,
) -> None:
    """Several producers' calls stored together (as under "sync", where they share one
    commit) start their events in that commit, as a lone call does: no alarm, and no
    second commit per instance. Red if a batch stores its calls as a producer would and
    wakes the instances to start them."""
    seen: list[Any] = []
    running = threading.Semaphore(0)
    runtime, gate = _started_idle(tmp_path / "s", seen, running)
    with runtime:
        commits = runtime._store.commit_counts[0]
        batch = _batch((b"p" * 16, 0, 0, "a"), (b"p" * 16, 1, 1, "b"), (b"q" * 16, 0, 2, "c"))
        answers = runtime._call_store.store(batch)
        for _ in range(3):  # each handler runs: its attempt was started
            assert running.acquire(timeout=TIMEOUT)
        assert runtime._store.commit_counts[0] == commits + 1
        assert [[(n, r[0][:2]) for n, r in a if r] for a in answers] == [
            [(0, (0, 1)), (1, (1, 1))],
            [(0, (2, 1))],
        ]
        gate.set()
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
    assert sorted(map(str, seen[4:])) == ["a", "b", "c"]


def test_a_taken_call_whose_body_fails_is_stored_as_a_producers_in_the_same_commit(
    tmp_path: Path,
) -> None:
    """One instance's enqueue body raising rolls back that body alone: its call is then
    stored as a producer's in the same transaction, answered, and run once (the instance
    crashed and recovered); the others' calls are unaffected."""
    seen: list[Any] = []
    running = threading.Semaphore(0)
    runtime, gate = _started_idle(tmp_path / "s", seen, running)
    with runtime:
        served = runtime._served["orders"]
        take = served.take

        def planted(index: int, items: Any, mark: Any) -> Any:
            pair = take(index, items, mark)
            if pair is None or index != 1:
                return pair
            direct, body = pair

            def failing(txn: Any) -> Any:
                body(txn)  # the event stored and started, then:
                raise RuntimeError("planted")

            return direct, failing

        served.take = planted
        batch = _batch((b"p" * 16, 0, 0, "a"), (b"p" * 16, 1, 1, "b"))
        ((first, second),) = runtime._call_store.store(batch)
        assert first[1] is not None  # both stored and answered
        assert second[1] is not None
        assert second[1][0][:2] == (1, 1)
        gate.set()
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
    assert sorted(map(str, seen[4:])) == ["a", "b"]  # each once


def test_a_call_a_free_instance_refuses_hands_its_refusal_back_and_stores_nothing(
    tmp_path: Path,
) -> None:
    """A call made by the instance's own enqueue body and refused there (its queue full)
    is answered nil with its error handed back, as one stored as a producer's would be.
    Red if the refusal is taken for a publication that failed: then the call is nil with
    no error, and a Ray producer tries it again until its timeout."""
    with Runtime(tmp_path / "s", durability="sync") as runtime:
        pool = runtime.define("orders", execute=lambda _ctx: None, max_queue_depth=1)
        pool.enqueue("later", delay=3600)  # the instance started, idle, its queue full
        refused: dict[tuple[int, int], Any] = {}
        ((answer,),) = runtime._call_store.store(_batch((b"p" * 16, 0, 0, "x")), refused)
        assert answer == (0, None)
        ((where, error),) = refused.items()
        assert where == (0, 0)
        assert isinstance(error, dopool.QueueFullError)
        assert pool.status().pending == 1


def test_a_try_that_comes_after_its_call_was_answered_is_not_stored_again(
    tmp_path: Path,
) -> None:
    """A producer's first try of a call lingers (in Ray's queue, say) while its second
    is answered and the producer moves on, its ``done_below`` past the call, so that its
    record may go: the lingering try is answered nil and stores nothing, even where the
    record is gone. Red without the check: the call is stored twice."""
    with Runtime(tmp_path / "s", durability="sync") as runtime:
        pool = runtime.define("orders", execute=lambda _ctx: None)
        producer = b"p" * 16
        first = Request(producer, 5, True, _batch((producer, 5, 0, "a"))[0].calls)
        ((answered,),) = runtime._call_store.store([first])
        assert answered[1] is not None
        later = Request(producer, 6, True, _batch((producer, 6, 0, "b"))[0].calls)
        runtime._call_store.store([later])  # its done_below lets call 5's record go
        ((lingering,),) = runtime._call_store.store([first])
        assert lingering == (5, None)
        assert pool.join(timeout=TIMEOUT)
        assert pool.status().succeeded == 2


def test_a_call_the_owner_refuses_for_its_full_queue_raises_and_stores_nothing(
    tmp_path: Path,
) -> None:
    """The owner's ``max_queue_depth`` applies through its socket whatever the producer's
    handle was given: a call into a full instance comes back as the owner's refusal, and
    the producer raises ``QueueFullError`` storing nothing. Red when the refusal comes back
    nil: the connection's own path, without the limit, stores the event past it."""
    with Runtime(tmp_path / "s", durability="sync") as runtime:
        owned = runtime.define("orders", execute=lambda _ctx: None, max_queue_depth=1)
        owned.enqueue("later", delay=3600)  # instance 0 full, by the owner's limit
        with dopool.connect(tmp_path / "s", via_owner=True) as connection:
            pool = connection.pool("orders")  # made without the owner's max_queue_depth
            with pytest.raises(dopool.QueueFullError) as refused:
                pool.enqueue("now")
            error = refused.value
            assert (error.pool, error.instance_index, error.depth, error.max_depth) == (
                "orders",
                0,
                1,
                1,
            )
            with pytest.raises(dopool.QueueFullError) as many:
                pool.enqueue_many(["a", "b"])
            assert (many.value.incoming, many.value.stored) == (2, [])
        assert owned.status().pending == 1


@pytest.mark.parametrize(
    "answer",
    [
        [0, [[0, 1, 0, False]], [1, 1, 1]],  # results beside a refusal
        [0, None, [1, 0, 1]],  # no max_depth
        [0, None, [1, 1]],
        [0, None, "full"],
    ],
)
def test_an_answer_whose_refusal_is_not_one_an_owner_makes_is_refused(answer: Any) -> None:
    body = msgpack.packb([owner_wire.VERSION, [answer]])
    with pytest.raises(owner_wire.WireError):
        owner_wire.decode_answer(body)


def test_a_refusal_travels_in_an_answer_frame() -> None:
    full = owner_wire.Full(depth=3, max_depth=3, incoming=2)
    frame = owner_wire.encode_answer([(4, full), (5, None), (6, [(0, 7, 0, False)])])
    assert owner_wire.decode_answer(frame[owner_wire.HEADER :]) == {
        4: full,
        5: None,
        6: [(0, 7, 0, False)],
    }
