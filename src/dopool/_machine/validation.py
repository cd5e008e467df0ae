"""Checking an event, and when it is due, before anything is sent or stored."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from dopool._errors import (
    MAX_DELAY,
    ConfigurationError,
    EventTooLargeError,
    EventValidationError,
    ScheduleError,
    shown,
)
from dopool._machine.types import Item
from dopool._store.layout import (
    MAX_DEDUP_KEY_BYTES,
    MAX_EVENT_BYTES,
    MAX_PARTITION_KEY_BYTES,
    PER_KEY,
    POOL_NAME,
    PRIORITY_MAX,
    PRIORITY_MIN,
    encode_event,
)
from dopool._usercode import ran

Schema = Callable[[Any], Any]

_ASCII_KEY = MAX_DEDUP_KEY_BYTES  # an ASCII key of this many characters is as many bytes

# What a delay, or a not_before's distance from now, may not exceed (a retry's limit too).
_LONGEST = f"MAX_DELAY, {MAX_DELAY:.0f} s (365 days)"

# Iterable, but as a batch almost always a mistake: characters, ints, or a mapping's keys.
_NOT_A_BATCH = (str, bytes, bytearray, memoryview, Mapping)


def check_path(path: object) -> None:
    """Refuse a store path that is not a non-empty ``str`` or ``os.PathLike`` of one."""
    # Path("") is the current directory: an empty setting must not put a store there.
    text = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    if not isinstance(text, str):
        raise ConfigurationError(f"path must be a str or an os.PathLike of str, got {shown(path)}")
    if not text:
        raise ConfigurationError("path is empty; name the store directory ('.' for this one)")
    if "\0" in text:
        raise ConfigurationError(f"path contains a NUL character: {text!r}")


def check_pool_name(name: object) -> str:
    if not isinstance(name, str) or not POOL_NAME.fullmatch(name):
        raise ConfigurationError(
            f"pool name must be 1-64 characters of [A-Za-z0-9_.-], got {shown(name)}"
        )
    return name


def due_time(
    delay: float | timedelta | None,
    not_before: float | datetime | None,
    *,
    now: Callable[[], float],
    wall: bool,
) -> float | None:
    """The clock time an event is due at: ``now() + delay``, or ``not_before``; None if
    neither is given. One at or before the time it is stored is due at once.

    ``wall``: the clock reads wall time (seconds since the Unix epoch), so a timezone-aware
    ``datetime`` names one of its times.

    Raises:
        ScheduleError: both are given; a delay that is negative, not finite, not
            seconds, or over ``MAX_DELAY``; a ``not_before`` that is not finite, not a
            number or a datetime, more than ``MAX_DELAY`` after ``now()``, a naive
            datetime, or a datetime under a clock that is not wall time.
    """
    if not_before is None:
        if delay is None:
            return None
        if (type(delay) is int or type(delay) is float) and 0 <= delay <= MAX_DELAY:
            return _finite("delay", delay, now() + delay)  # the usual delay, checked at once
        seconds = _seconds("delay", delay)
        if seconds < 0:
            raise ScheduleError("delay", delay, "a delay is seconds >= 0")
        if seconds > MAX_DELAY:
            raise ScheduleError("delay", delay, f"a delay is at most {_LONGEST}")
        return _finite("delay", delay, now() + seconds)
    if delay is not None:
        raise ScheduleError("not_before", not_before, "give delay or not_before, not both")
    if isinstance(not_before, datetime):
        if not wall:
            raise ScheduleError(
                "not_before",
                not_before,
                "a datetime names a wall-clock time, and this runtime's clock is simulated: "
                "give a float of its time",
            )
        if not_before.utcoffset() is None:
            raise ScheduleError("not_before", not_before, "a naive datetime: give its timezone")
        at = _finite("not_before", not_before, not_before.timestamp())
    else:
        at = _finite("not_before", not_before, _number("not_before", not_before))
    start = now()
    if at - start > MAX_DELAY:
        raise ScheduleError(
            "not_before",
            not_before,
            f"it is {at - start:g} s after now ({start:g}), and a due time is at most "
            f"{_LONGEST} ahead",
        )
    return at


def with_ttl(
    items: tuple[Item, ...], ttl: float | timedelta | None, due: float | None, now: float
) -> tuple[Item, ...]:
    """``items`` with a ``ttl`` (seconds from the enqueue to start within), checked.

    Raises:
        ScheduleError: not seconds > 0, not finite, or not past the events' due time
            (a ttl counts from the enqueue: the event would expire before it is due).
    """
    if ttl is None:
        return items
    seconds = _seconds("ttl", ttl)
    if seconds <= 0:
        raise ScheduleError("ttl", ttl, "a ttl is seconds > 0")
    if due is not None and now + seconds <= due:
        raise ScheduleError(
            "ttl", ttl, "it counts from the enqueue, and would end before the event is due"
        )
    return tuple(item._replace(ttl=seconds) for item in items)


def _seconds(argument: str, value: Any) -> float:
    if isinstance(value, timedelta):
        return _finite(argument, value, value.total_seconds())
    return _finite(argument, value, _number(argument, value))


def _number(argument: str, value: Any) -> float:
    what = "a clock time or a datetime" if argument == "not_before" else "seconds or a timedelta"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScheduleError(argument, value, f"not {what}")
    try:
        return float(value)
    except OverflowError:  # an int past a float's range
        raise ScheduleError(argument, value, "too large for a clock time") from None


def _finite(argument: str, value: Any, seconds: float) -> float:
    if not math.isfinite(seconds):
        raise ScheduleError(argument, value, "not a finite time")
    return seconds


def prepare(
    event: Any,
    *,
    partition_key: str | None,
    priority: int,
    schema: Schema | None,
    position: int | None = None,
    due: float | None = None,
    dedup_key: str | None = None,
) -> Item:
    """Validate, transform with the schema, encode and size-check one event."""
    if partition_key is not None:
        _check_key("partition_key", partition_key, MAX_PARTITION_KEY_BYTES, position)
    if dedup_key is not None and not (
        type(dedup_key) is str and dedup_key.isascii() and 0 < len(dedup_key) <= _ASCII_KEY
    ):  # (the usual key, ASCII and short, passes without a call)
        _check_key("dedup_key", dedup_key, MAX_DEDUP_KEY_BYTES, position)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise EventValidationError(
            f"priority must be an int, got {shown(priority)}", position=position
        )
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise EventValidationError(
            f"priority must be within [{PRIORITY_MIN}, {PRIORITY_MAX}], got {priority}",
            position=position,
        )
    return Item(_encode(event, schema, position), partition_key, priority, due, dedup_key)


def check_keyed(pool: str, concurrency: int, partition_key: str | None) -> None:
    """Refuse an event without a partition key for a pool with an instance per key.

    Raises:
        EventValidationError: ``concurrency`` is :data:`PER_KEY` and ``partition_key`` None.
    """
    if partition_key is None and concurrency == PER_KEY:
        raise EventValidationError(
            f"pool {pool!r} has an instance per partition key (concurrency='per-key'): "
            "its events need a partition_key"
        )


def _check_key(argument: str, key: Any, limit: int, position: int | None) -> None:
    """A partition or dedup key: a str, valid UTF-8, within ``limit`` bytes encoded; a dedup
    key not empty."""
    if not isinstance(key, str):
        raise EventValidationError(
            f"{argument} must be a str or None, got {type(key).__name__}", position=position
        )
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise EventValidationError(
            f"{argument} is not valid UTF-8 text ({exc.reason})", position=position
        ) from exc
    if size > limit:
        raise EventTooLargeError(argument, size=size, limit=limit, position=position)
    if not size and argument == "dedup_key":
        raise EventValidationError("dedup_key must not be empty", position=position)


def prepare_many(
    events: Iterable[Any],
    partition_key: str | None,
    priority: int,
    schema: Schema | None,
    *,
    due: float | None = None,
    dedup_keys: Iterable[str | None] | None = None,
) -> tuple[Item, ...]:
    """:func:`prepare` for a batch that shares one partition key and priority.

    The first event checks them (an error names position 0); the rest are only
    transformed, encoded and size-checked. ``events`` must be an iterable other
    than text, bytes or a mapping, which would iterate characters, ints or keys.
    ``dedup_keys``, if given, holds one dedup key (or None) per event, each checked
    (an error names its position).
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
    keys = None if dedup_keys is None else _keys_of(dedup_keys)
    given = keys or ()  # each item gets its key as it is built; the keys are checked after
    count = len(given)
    for position, event in enumerate(iterator):
        key = given[position] if position < count else None
        if position == 0:
            first = prepare(
                event,
                partition_key=partition_key,
                priority=priority,
                schema=schema,
                position=0,
                due=due,
            )
            items.append(first if key is None else first._replace(dedup_key=key))
        else:
            items.append(Item(_encode(event, schema, position), partition_key, priority, due, key))
    if keys is None:
        return tuple(items)
    if len(keys) != len(items):
        raise EventValidationError(
            f"dedup_keys holds {len(keys)} keys for {len(items)} events: give one per "
            "event (None for an event without one)"
        )
    for position, key in enumerate(keys):
        if key is not None and not (
            type(key) is str and key.isascii() and 0 < len(key) <= _ASCII_KEY
        ):
            _check_key("dedup_key", key, MAX_DEDUP_KEY_BYTES, position)
    return tuple(items)


def _keys_of(dedup_keys: Iterable[str | None]) -> list[str | None]:
    """``enqueue_many``'s ``dedup_keys`` as a list: an iterable other than one text."""
    if isinstance(dedup_keys, _NOT_A_BATCH):
        raise EventValidationError(
            f"dedup_keys takes one key per event, got a {type(dedup_keys).__name__}"
        )
    try:
        return list(dedup_keys)
    except TypeError:
        raise EventValidationError(
            f"dedup_keys takes one key per event, got {type(dedup_keys).__name__}"
        ) from None


def _encode(event: Any, schema: Schema | None, position: int | None) -> bytes:
    """Transform with the schema, encode and size-check one event."""
    if schema is not None:
        try:
            event = ran(schema(event), "the schema")
        except Exception as exc:
            raise EventValidationError(
                f"schema rejected it ({type(exc).__name__}: {exc})", position=position
            ) from exc
    data = encode_event(event, position=position)
    if len(data) > MAX_EVENT_BYTES:
        raise EventTooLargeError("event", size=len(data), limit=MAX_EVENT_BYTES, position=position)
    return data
