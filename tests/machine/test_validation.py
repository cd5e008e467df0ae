"""Checks made before anything is sent or stored: pool names, events, keys, priorities."""

from __future__ import annotations

from typing import Any

import pytest

from dopool import ConfigurationError, EventTooLargeError, EventValidationError
from dopool._machine.validation import check_pool_name, prepare
from dopool._store.layout import (
    MAX_EVENT_BYTES,
    MAX_PARTITION_KEY_BYTES,
    PRIORITY_MAX,
    PRIORITY_MIN,
    encode_event,
    unpack,
)

# -- pool names ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "Z", "0", "x" * 64, "orders_v2.retry-queue", "...", "-_"])
def test_valid_pool_names(name: str) -> None:
    assert check_pool_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "x" * 65, "has space", " lead", "trail\n", "café", "日本", "a:b", "a/b", "a\0b", "é" * 10],
    ids=repr,
)
def test_invalid_pool_names(name: str) -> None:
    with pytest.raises(ConfigurationError, match="pool name") as info:
        check_pool_name(name)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("name", [None, 5, b"orders", ["orders"]], ids=repr)
def test_non_str_pool_names(name: object) -> None:
    with pytest.raises(ConfigurationError, match="pool name"):
        check_pool_name(name)


# -- prepare: the happy path -------------------------------------------------------


def test_prepare_encodes_the_event() -> None:
    item = prepare({"id": 1, "tags": ("a", "b")}, partition_key="k", priority=3, schema=None)
    assert unpack(item.event) == {"id": 1, "tags": ["a", "b"]}
    assert item.partition_key == "k"
    assert item.priority == 3


def test_schema_return_value_is_what_gets_encoded() -> None:
    seen: list[Any] = []

    def schema(event: Any) -> Any:
        seen.append(event)
        return {"normalised": event["raw"].upper()}

    item = prepare({"raw": "abc"}, partition_key=None, priority=0, schema=schema)
    assert seen == [{"raw": "abc"}]
    assert unpack(item.event) == {"normalised": "ABC"}


def test_schema_may_turn_an_unencodable_event_into_an_encodable_one() -> None:
    item = prepare({3, 1, 2}, partition_key=None, priority=0, schema=sorted)
    assert unpack(item.event) == [1, 2, 3]


def test_schema_result_is_validated_too() -> None:
    with pytest.raises(EventValidationError, match="not msgpack-encodable"):
        prepare({"ok": 1}, partition_key=None, priority=0, schema=lambda _: object())


# -- prepare: partition keys ---------------------------------------------------------


def test_partition_key_at_the_limit_is_accepted() -> None:
    key = "k" * MAX_PARTITION_KEY_BYTES
    assert prepare(1, partition_key=key, priority=0, schema=None).partition_key == key


def test_partition_key_too_long() -> None:
    with pytest.raises(EventTooLargeError) as info:
        prepare(1, partition_key="k" * (MAX_PARTITION_KEY_BYTES + 1), priority=0, schema=None)
    assert info.value.what == "partition_key"
    assert info.value.size == MAX_PARTITION_KEY_BYTES + 1
    assert info.value.limit == MAX_PARTITION_KEY_BYTES == 2048


def test_partition_key_limit_counts_utf8_bytes_not_characters() -> None:
    key = "é" * 1025  # 1025 characters, 2050 bytes
    with pytest.raises(EventTooLargeError) as info:
        prepare(1, partition_key=key, priority=0, schema=None)
    assert info.value.size == 2050


@pytest.mark.parametrize("key", [1, b"bytes", ("t",), 1.5], ids=repr)
def test_non_str_partition_key(key: Any) -> None:
    with pytest.raises(EventValidationError, match="partition_key must be a str"):
        prepare(1, partition_key=key, priority=0, schema=None)


def test_partition_key_with_a_lone_surrogate() -> None:
    with pytest.raises(EventValidationError, match="partition_key"):
        prepare(1, partition_key="bad \ud800", priority=0, schema=None)


# -- prepare: priorities -------------------------------------------------------------


@pytest.mark.parametrize("priority", [PRIORITY_MIN, -1, 0, 1, PRIORITY_MAX])
def test_priorities_in_int32_range(priority: int) -> None:
    assert prepare(1, partition_key=None, priority=priority, schema=None).priority == priority


@pytest.mark.parametrize(
    "priority", [True, False, 1.0, "1", None, PRIORITY_MAX + 1, PRIORITY_MIN - 1, 2**64], ids=repr
)
def test_bad_priorities(priority: Any) -> None:
    with pytest.raises(EventValidationError, match="priority"):
        prepare(1, partition_key=None, priority=priority, schema=None)


# -- prepare: events -------------------------------------------------------------------


def test_event_at_the_size_limit_is_accepted() -> None:
    event = b"x" * (MAX_EVENT_BYTES - 5)  # bin 32: a 5-byte header
    assert len(encode_event(event)) == MAX_EVENT_BYTES
    assert len(prepare(event, partition_key=None, priority=0, schema=None).event) == MAX_EVENT_BYTES


def test_event_over_the_size_limit() -> None:
    event = b"x" * (MAX_EVENT_BYTES - 4)
    with pytest.raises(EventTooLargeError) as info:
        prepare(event, partition_key=None, priority=0, schema=None)
    assert info.value.what == "event"
    assert info.value.size == MAX_EVENT_BYTES + 1
    assert info.value.limit == MAX_EVENT_BYTES == 128 * 1024


def test_the_limit_applies_to_the_schema_output() -> None:
    with pytest.raises(EventTooLargeError):
        prepare("small", partition_key=None, priority=0, schema=lambda _: "y" * MAX_EVENT_BYTES)


@pytest.mark.parametrize(
    "event",
    [{1}, object(), 2**64, "\udcff"],
    ids=lambda event: "object()" if type(event) is object else repr(event),  # no address
)
def test_unencodable_events(event: Any) -> None:
    with pytest.raises(EventValidationError, match="not msgpack-encodable"):
        prepare(event, partition_key=None, priority=0, schema=None)


def test_schema_that_raises() -> None:
    def schema(event: Any) -> Any:
        raise ValueError("amount must be positive")

    with pytest.raises(EventValidationError, match="schema") as info:
        prepare({"amount": -1}, partition_key=None, priority=0, schema=schema)
    assert "amount must be positive" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


def test_errors_carry_the_batch_position() -> None:
    def reject(event: Any) -> Any:
        raise KeyError("id")

    cases: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"event": {1}}, EventValidationError),
        ({"event": 1, "schema": reject}, EventValidationError),
        ({"event": 1, "priority": True}, EventValidationError),
        ({"event": 1, "partition_key": 7}, EventValidationError),
        ({"event": 1, "partition_key": "k" * 3000}, EventTooLargeError),
        ({"event": b"x" * MAX_EVENT_BYTES}, EventTooLargeError),
    ]
    for case, error in cases:
        options: dict[str, Any] = {"partition_key": None, "priority": 0, "schema": None, **case}
        with pytest.raises(error) as info:
            prepare(position=4, **options)
        assert info.value.position == 4, case  # type: ignore[attr-defined]
        assert "event 4 of the batch" in str(info.value), case
