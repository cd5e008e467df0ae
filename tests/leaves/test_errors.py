"""The exception tree: each error's attributes and the message it builds."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from dopool import (
    ConfigurationError,
    DopoolError,
    EventTooLargeError,
    EventValidationError,
    PermanentError,
    PoolClosedError,
    QueueFullError,
    RetryAfter,
    RetryPolicy,
    StoreLockedError,
)
from dopool._errors import InstanceCrashedError, StorageError


@pytest.mark.parametrize(
    "cls",
    [
        ConfigurationError,
        EventValidationError,
        EventTooLargeError,
        QueueFullError,
        StoreLockedError,
        PoolClosedError,
        StorageError,
        InstanceCrashedError,
        PermanentError,
        RetryAfter,
    ],
)
def test_every_error_derives_from_dopool_error(cls: type[Exception]) -> None:
    assert issubclass(cls, DopoolError)
    assert issubclass(DopoolError, Exception)


def test_stored_defaults_to_empty() -> None:
    assert tuple(DopoolError().stored) == ()
    assert tuple(QueueFullError(pool="x", instance_index=0, depth=1, max_depth=1).stored) == ()


def test_queue_full_error() -> None:
    error = QueueFullError(pool="x", instance_index=2, depth=1000, max_depth=1000)
    assert str(error) == "instance 2 of pool 'x' is full (1000/1000)"
    assert (error.pool, error.instance_index, error.depth, error.max_depth) == ("x", 2, 1000, 1000)


def test_queue_full_error_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        QueueFullError("x", 2, 1000, 1000)  # type: ignore[call-arg]


def test_event_too_large_error() -> None:
    error = EventTooLargeError("event", size=200_000, limit=131_072)
    assert (error.what, error.size, error.limit, error.position) == (
        "event",
        200_000,
        131_072,
        None,
    )
    assert str(error) == "event is 200000 bytes, over the limit of 131072 bytes"


def test_event_too_large_error_in_a_batch() -> None:
    error = EventTooLargeError("partition_key", size=3000, limit=2048, position=4)
    assert error.what == "partition_key"
    assert error.position == 4
    assert str(error) == (
        "partition_key is 3000 bytes, over the limit of 2048 bytes (event 4 of the batch)"
    )


def test_event_validation_error() -> None:
    error = EventValidationError("not msgpack-encodable")
    assert error.reason == "not msgpack-encodable"
    assert error.position is None
    assert str(error) == "event rejected: not msgpack-encodable"


def test_event_validation_error_with_position() -> None:
    error = EventValidationError("schema rejected it", position=0)
    assert error.position == 0  # position 0 is a position, not "no position"
    assert str(error) == "event 0 of the batch rejected: schema rejected it"


def test_store_locked_error() -> None:
    error = StoreLockedError(path="/tmp/s", holder="pid 12 on host since t")
    assert (error.path, error.holder) == ("/tmp/s", "pid 12 on host since t")
    assert str(error) == "store '/tmp/s' is locked by pid 12 on host since t"


def test_pool_closed_error() -> None:
    error = PoolClosedError("orders")
    assert error.pool == "orders"
    assert "'orders'" in str(error)
    assert "closed" in str(error)


def test_instance_crashed_error() -> None:
    error = InstanceCrashedError("orders:3")
    assert error.instance_id == "orders:3"
    assert "orders:3" in str(error)


def test_permanent_error_keeps_its_message() -> None:
    assert str(PermanentError("bad input")) == "bad input"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(2.5, 2.5), (0, 0.0), (3, 3.0), (timedelta(minutes=1, milliseconds=500), 60.5)],
)
def test_retry_after_accepts_seconds_and_timedeltas(
    value: float | timedelta, seconds: float
) -> None:
    error = RetryAfter(value)
    assert error.seconds == seconds
    assert type(error.seconds) is float
    assert str(error) == f"retry after {seconds:g} s"


@pytest.mark.parametrize(
    "value",
    [-1, -0.001, timedelta(seconds=-1), math.nan, math.inf, -math.inf, "5", None, True],
    ids=repr,
)
def test_retry_after_rejects_invalid_delays(value: Any) -> None:
    with pytest.raises(ConfigurationError):
        RetryAfter(value)


def test_retry_after_can_be_raised_and_caught_as_dopool_error() -> None:
    with pytest.raises(DopoolError) as info:
        raise RetryAfter(1)
    assert isinstance(info.value, RetryAfter)
    assert info.value.seconds == 1.0


class _NoRepr:
    """A value whose repr raises, handed to dopool by a caller."""

    def __repr__(self) -> str:
        raise ValueError("no repr")


@pytest.mark.parametrize(
    "call",
    [
        lambda rt, pool, bad: pool.enqueue("x", delay=bad),
        lambda rt, pool, bad: pool.enqueue("x", ttl=bad),
        lambda rt, pool, bad: pool.enqueue("x", priority=bad),
        lambda rt, pool, bad: pool.schedule(bad, "x", every=1),
        lambda rt, pool, bad: pool.schedule("s", "x", every=bad),
        lambda rt, pool, bad: pool.redrive([bad]),
        lambda rt, pool, bad: pool.pause(bad),
        lambda rt, pool, bad: rt.define("q", execute=bad),
        lambda rt, pool, bad: rt.define("q", execute=print, concurrency=bad),
        lambda rt, pool, bad: rt.define(bad, execute=print),
        lambda rt, pool, bad: rt.subscribe(bad),
        lambda rt, pool, bad: rt.kill(bad, 0),
        lambda rt, pool, bad: RetryAfter(bad),
        lambda rt, pool, bad: RetryPolicy(initial_delay=bad),
    ],
)
def test_a_value_whose_repr_raises_is_refused_with_a_dopool_error(sim: Any, call: Any) -> None:
    """Its repr in the message raised instead: the caller got that ValueError."""
    pool = sim.define("p", execute=lambda ctx: None)
    with pytest.raises(DopoolError, match="<_NoRepr object>"):
        call(sim, pool, _NoRepr())
