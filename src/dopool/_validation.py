"""Checking an event before anything is sent or stored."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dopool._errors import ConfigurationError, EventTooLargeError, EventValidationError
from dopool._layout import (
    MAX_EVENT_BYTES,
    MAX_PARTITION_KEY_BYTES,
    POOL_NAME,
    PRIORITY_MAX,
    PRIORITY_MIN,
    encode_event,
)
from dopool._messages import Item

Schema = Callable[[Any], Any]

# Iterable, but as a batch almost always a mistake: characters, ints, or a mapping's keys.
_NOT_A_BATCH = (str, bytes, bytearray, memoryview, Mapping)


def check_pool_name(name: object) -> str:
    if not isinstance(name, str) or not POOL_NAME.fullmatch(name):
        raise ConfigurationError(
            f"pool name must be 1-64 characters of [A-Za-z0-9_.-], got {name!r}"
        )
    return name


def prepare(
    event: Any,
    *,
    partition_key: str | None,
    priority: int,
    schema: Schema | None,
    position: int | None = None,
) -> Item:
    """Validate, transform with the schema, encode and size-check one event."""
    if partition_key is not None:
        if not isinstance(partition_key, str):
            raise EventValidationError(
                f"partition_key must be a str or None, got {type(partition_key).__name__}",
                position=position,
            )
        try:
            size = len(partition_key.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise EventValidationError(
                f"partition_key is not valid UTF-8 text ({exc.reason})", position=position
            ) from exc
        if size > MAX_PARTITION_KEY_BYTES:
            raise EventTooLargeError(
                "partition_key", size=size, limit=MAX_PARTITION_KEY_BYTES, position=position
            )
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise EventValidationError(f"priority must be an int, got {priority!r}", position=position)
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise EventValidationError(
            f"priority must be within [{PRIORITY_MIN}, {PRIORITY_MAX}], got {priority}",
            position=position,
        )
    return Item(_encode(event, schema, position), partition_key, priority)


def prepare_many(
    events: Iterable[Any], *, partition_key: str | None, priority: int, schema: Schema | None
) -> tuple[Item, ...]:
    """:func:`prepare` for a batch that shares one partition key and priority.

    The first event checks them (an error names position 0); the rest are only
    transformed, encoded and size-checked. ``events`` must be an iterable other
    than text, bytes or a mapping, which would iterate characters, ints or keys.
    """
    name = type(events).__name__
    if isinstance(events, _NOT_A_BATCH):
        parts = "characters" if isinstance(events, str) else "bytes"
        if isinstance(events, Mapping):
            parts = "keys"
        raise EventValidationError(
            f"enqueue_many takes an iterable of events, got a {name}, whose items are its "
            f"{parts}; for one event, pass [event]"
        )
    try:
        iterator = iter(events)
    except TypeError:
        raise EventValidationError(
            f"enqueue_many takes an iterable of events, got {name}"
        ) from None
    items = []
    for position, event in enumerate(iterator):
        if position == 0:
            items.append(
                prepare(
                    event, partition_key=partition_key, priority=priority, schema=schema, position=0
                )
            )
        else:
            items.append(Item(_encode(event, schema, position), partition_key, priority))
    return tuple(items)


def _encode(event: Any, schema: Schema | None, position: int | None) -> bytes:
    """Transform with the schema, encode and size-check one event."""
    if schema is not None:
        try:
            event = schema(event)
        except Exception as exc:
            raise EventValidationError(
                f"schema rejected it ({type(exc).__name__}: {exc})", position=position
            ) from exc
    data = encode_event(event, position=position)
    if len(data) > MAX_EVENT_BYTES:
        raise EventTooLargeError("event", size=len(data), limit=MAX_EVENT_BYTES, position=position)
    return data
