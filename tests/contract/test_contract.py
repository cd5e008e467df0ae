"""The producer's contract, the same on every deployment (issue 34): each test runs
three times (``target``), against

- ``local``: a real-clock ``Runtime`` in this process, made for the test (the suite
  checks that no actor outlives a test), fed through ``runtime.pools[name]``;
- ``processes``: a ``dopool worker`` process serving the module, fed through
  ``dopool.connect(store).pool(name)``;
- ``ray``: a ``dopool.ray`` deployment on a local Ray serving the module (two CPUs,
  100 MiB of object store, no dashboard; shut down after it), fed through
  ``dopool.ray.connect(name).pool(name)``; marked ``ray``, and skipped where Ray cannot
  be imported.

Each test's events carry a tag and partition keys of its own (``Target``), so the tests
sharing a worker or a deployment never see each other's. What ran is read from the
files the app's handler writes (``contract_app.py``), and waited for within a bound;
"ran once" is checked after a barrier event has run on every instance
(``Target.settle``), never after a sleep.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract_app import CONCURRENCY, OPTIONS, POOL, SMALL, build
from contract_support import HERE, Producer, Target, instance_of, worker_process

import dopool
import dopool.ray
from dopool import (
    EventTooLargeError,
    EventValidationError,
    PoolNotFoundError,
    QueueFullError,
    Runtime,
    ScheduleError,
)

APP = "contract_app:build"

# Worker processes, Ray and real time: run on CI's first Python only (.ci/run).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dopool.Connection, Path]]:
    """A ``dopool worker`` serving the module, a connection to its store, and the
    directory of the app's records."""
    base = tmp_path_factory.mktemp("processes")
    with worker_process(base / "store"), dopool.connect(base / "store") as connection:
        yield connection, base / "ran"


@pytest.fixture(scope="module")
def ray_deployment(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dopool.ray.RayConnection, Path]]:
    """A local Ray and a ``dopool.ray`` deployment on it, serving the module; a
    producer's connection to it, and the directory of the app's records."""
    ray = pytest.importorskip("ray")
    base = tmp_path_factory.mktemp("ray")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("RAY_ADDRESS", raising=False)
        ray.init(
            "local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=100 * 2**20,
            logging_level="WARNING",
            runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}},  # the app, by module name
        )
        try:
            store = str(base / "stores" / "{host}")
            with dopool.ray.deploy(APP, store, name=base.name, durability="async") as deployed:
                # 10 s, not 30, before HostUnavailableError: a host answers in milliseconds,
                # and a regression that has it answer nil fails within the test's bound.
                producer = dopool.ray.connect(deployed.name, timeout=10.0)
                yield producer, base / "stores" / "ran"
        finally:
            ray.shutdown()


@pytest.fixture(params=["local", "processes", pytest.param("ray", marks=pytest.mark.ray)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """The deployment a contract test runs against, once per target."""
    if request.param == "local":
        with Runtime(tmp_path / "store", durability="async") as runtime:
            build(runtime)
            yield Target("local", lambda name: runtime.pools[name], tmp_path / "ran")
    elif request.param == "processes":
        connection: dopool.Connection
        connection, ran = request.getfixturevalue("processes")

        def producer(name: str) -> Producer:
            # The owner's options: a producer's own path applies those it is given.
            return connection.pool(name, **OPTIONS.get(name, {}))

        yield Target("processes", producer, ran)
    else:
        on_ray: dopool.ray.RayConnection
        on_ray, ran = request.getfixturevalue("ray_deployment")
        yield Target("ray", on_ray.pool, ran)


def test_each_acknowledged_enqueue_runs_once_where_its_result_says(target: Target) -> None:
    pool = target.pool(POOL)
    count = 16
    results = [
        pool.enqueue(target.event(n), partition_key=target.key(f"k{n % 3}") if n % 2 else None)
        for n in range(count)
    ]
    assert len({result.event_id for result in results}) == count
    sequences: dict[int, list[int]] = defaultdict(list)
    for result in results:
        assert 0 <= result.instance_index < CONCURRENCY
        assert result.instance_id == f"{POOL}:{result.instance_index}"
        assert result.event_id == f"{result.instance_id}:{result.sequence}"
        assert not result.duplicate
        sequences[result.instance_index].append(result.sequence)
    for found in sequences.values():  # one producer alone: consecutive, in its order
        assert found == list(range(found[0], found[0] + len(found)))
    target.wait_for(range(count))
    runs = target.settle()
    assert sorted(run["event"]["n"] for run in runs) == list(range(count))  # each once
    for run in runs:
        result = results[run["event"]["n"]]
        assert (run["instance"], run["sequence"]) == (result.instance_index, result.sequence)
        assert run["attempt"] == 1


def test_one_producers_partition_starts_in_enqueue_order_on_its_keys_instance(
    target: Target,
) -> None:
    pool = target.pool(POOL)
    keys = [target.key(name) for name in ("a", "b", "c", "d", "e")]
    count = 30
    results = [pool.enqueue(target.event(n), partition_key=keys[n % 5]) for n in range(count)]
    # The documented stable hash: the same key, the same instance, on every target.
    assert [result.instance_index for result in results] == [
        instance_of(keys[n % 5]) for n in range(count)
    ]
    target.wait_for(range(count))
    runs = target.settle()
    for key in keys:
        mine = [run for run in runs if run["partition_key"] == key]
        enqueued = [n for n in range(count) if keys[n % 5] == key]
        assert [run["event"]["n"] for run in mine] == enqueued
        assert {run["instance"] for run in mine} == {instance_of(key)}


def test_enqueue_many_answers_in_order_and_a_batch_with_a_bad_event_stores_nothing(
    target: Target,
) -> None:
    pool = target.pool(POOL)
    key = target.key("batch")
    batch = pool.enqueue_many([target.event(n) for n in range(5)], partition_key=key)
    assert [result.instance_index for result in batch] == [instance_of(key)] * 5
    first = batch[0].sequence
    assert [result.sequence for result in batch] == list(range(first, first + 5))
    spread = pool.enqueue_many(target.event(n) for n in range(5, 13))  # round robin
    assert len({result.event_id for result in batch + spread}) == 13
    assert {result.instance_index for result in spread} == set(range(CONCURRENCY))
    bad = [target.event(13), target.event(14), target.event(15, bad={1, 2}), target.event(16)]
    with pytest.raises(EventValidationError) as raised:
        pool.enqueue_many(bad, partition_key=key)
    assert type(raised.value) is EventValidationError
    assert raised.value.position == 2
    after = pool.enqueue(target.event(17), partition_key=key)
    here = after.instance_index
    taken = [result.sequence for result in batch + spread if result.instance_index == here]
    assert after.sequence == max(taken) + 1  # none of the refused batch took a sequence
    target.wait_for([*range(13), 17])
    runs = target.settle()
    assert sorted(run["event"]["n"] for run in runs) == [*range(13), 17]
    ran = {run["event"]["n"]: run for run in runs}
    for n, result in enumerate(batch + spread):  # result n is event n's
        assert (ran[n]["instance"], ran[n]["sequence"]) == (result.instance_index, result.sequence)
    assert [run["event"]["n"] for run in runs if run["partition_key"] == key] == [0, 1, 2, 3, 4, 17]


def test_a_batch_its_instance_cannot_take_is_refused_whole_and_stores_nothing(
    target: Target,
) -> None:
    small = target.pool(SMALL)
    key = target.key("full")
    before = small.enqueue(target.event(0), partition_key=key)
    target.wait_for([0])  # its instance is started, and idle once event 0 succeeds
    with pytest.raises(QueueFullError) as raised:  # three, where two may pend
        small.enqueue_many([target.event(n) for n in range(10, 13)], partition_key=key)
    error = raised.value
    assert (error.pool, error.instance_index, error.max_depth) == (SMALL, before.instance_index, 2)
    assert error.stored == []
    after = small.enqueue(target.event(1), partition_key=key)
    assert after.sequence == before.sequence + 1  # none of the refused batch took a sequence
    # Had any been stored, it would have run before event 1, on the same instance.
    assert [run["event"]["n"] for run in target.wait_for([1])] == [0, 1]


def test_a_held_dedup_key_answers_its_first_event_as_a_duplicate_and_it_runs_once(
    target: Target,
) -> None:
    pool = target.pool(POOL)
    key = target.key("once")
    first = pool.enqueue(target.event(0), dedup_key=key)
    assert not first.duplicate
    again = pool.enqueue(target.event(1), dedup_key=key)  # held: unfinished, or in its window
    target.wait_for([0])
    finished = pool.enqueue(target.event(2), dedup_key=key)  # held: in the pool's window
    for answer in (again, finished):
        assert answer.duplicate
        assert answer.event_id == first.event_id
        assert (answer.instance_index, answer.sequence) == (first.instance_index, first.sequence)
    assert finished.position == 0  # nothing runs before a finished event any more
    runs = target.settle()
    assert [run["event"]["n"] for run in runs] == [0]


#: Bad input, what each call raises (the same class on every target), and why.
BAD_INPUT: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("an event msgpack cannot encode", {"event": {"bad": {1, 2}}}, EventValidationError),
    ("a map key that cannot come back", {"event": {"bad": {(1, 2): "x"}}}, EventValidationError),
    ("an event over 128 KiB", {"event": {"pad": "x" * (130 * 1024)}}, EventTooLargeError),
    ("a partition key over 2 KiB", {"partition_key": "k" * 3000}, EventTooLargeError),
    ("a partition key not a str", {"partition_key": 7}, EventValidationError),
    ("a priority out of range", {"priority": 2**40}, EventValidationError),
    ("a priority not an int", {"priority": "high"}, EventValidationError),
    ("an empty dedup key", {"dedup_key": ""}, EventValidationError),
    ("a negative delay", {"delay": -1}, ScheduleError),
]


def test_bad_input_raises_the_same_error_class_everywhere_and_stores_nothing(
    target: Target,
) -> None:
    pool = target.pool(POOL)
    key = target.key("bad")
    before = pool.enqueue(target.event(0), partition_key=key)
    for n, (why, given, error) in enumerate(BAD_INPUT, start=1):
        arguments: dict[str, Any] = {"partition_key": key, **given}
        event = {**target.event(n), **arguments.pop("event", {})}
        with pytest.raises(error) as raised:
            pool.enqueue(event, **arguments)
        assert type(raised.value) is error, why
    after = pool.enqueue(target.event(99), partition_key=key)
    assert after.sequence == before.sequence + 1  # nothing took a sequence in between
    target.wait_for([0, 99])
    runs = target.settle()
    assert [run["event"]["n"] for run in runs] == [0, 99]


#: What asking for a pool the app does not define raises: not the same everywhere.
#: ``runtime.pools`` is a read-only mapping of the pools defined (docs/api.md), so a
#: local runtime's answer is a mapping's; both kinds of producer name the pool.
UNKNOWN_POOL: dict[str, type[Exception]] = {
    "local": KeyError,
    "processes": PoolNotFoundError,
    "ray": PoolNotFoundError,
}


def test_an_unknown_pool_name_raises_what_each_target_documents(target: Target) -> None:
    with pytest.raises(UNKNOWN_POOL[target.name]) as raised:
        target.pool("nothing")
    error = raised.value
    if isinstance(error, PoolNotFoundError):
        assert (error.pool, error.known) == ("nothing", (POOL, SMALL))
    else:
        assert error.args == ("nothing",)


def test_a_delayed_event_does_not_start_before_its_due_time(target: Target) -> None:
    pool = target.pool(POOL)
    delay = 0.5
    called = time.time()  # the wall clock every target's due times and the app read
    result = pool.enqueue(target.event(0), partition_key=target.key("later"), delay=delay)
    assert not result.duplicate
    (run,) = target.wait_for([0])
    assert run["started"] >= called + delay
    assert (run["instance"], run["sequence"]) == (result.instance_index, result.sequence)
