"""What a producer and the owner of its instances say to each other: enqueues and answers.

A producer (``dopool.connect``) that finds a live owner for an instance sends it its
enqueues, over a UNIX stream socket, and the owner stores them in its own transactions
(``_engine/owner_calls.py``, ``_handles/owner_link.py``). Sans I/O: frames made and
read here, sent and received there.

A frame is a 4-byte big-endian length and a msgpack array. A **request** carries the
producer's id (16 random bytes, one per connection), the number below which it needs no
answer of its again (its call records may go), whether its calls must be fsynced before
they are answered, and its calls: each one's number, pool, instance and items (an
``Item``'s fields, checked and encoded by the producer). An **answer** carries, for
each call, its number and either its results, each ``(instance, sequence, position,
duplicate)``, or nil: not stored here (the owner does not serve the instance, anything);
the producer then stores the call itself, as it always could. A nil may carry a third
field, a refusal (:class:`Full`: the instance's queue is full by the owner's
``max_queue_depth``), and the producer then raises ``QueueFullError`` as the owner's own
enqueue would, storing nothing. (A producer of before refusals reads that answer as no
answer of its version, and stores the call itself.)

The owner trusts nothing it reads: a frame whose fields are not what a producer sends
(a type, a range, a size) is refused whole, and the connection closed.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack

from dopool._machine.types import Item
from dopool._store.layout import (
    MAX_DEDUP_KEY_BYTES,
    MAX_EVENT_BYTES,
    MAX_PARTITION_KEY_BYTES,
    POOL_NAME,
    PRIORITY_MAX,
    PRIORITY_MIN,
    PRODUCER_ID_BYTES,
    trace_carrier,
)

VERSION = 1
#: The calls one request carries at most, and the events one call.
MAX_CALLS = 1024
MAX_ITEMS = 4096
#: A frame's length at most: the largest events a full call may carry, and some room.
MAX_FRAME = 64 * 1024 * 1024
_LENGTH = struct.Struct(">I")
HEADER = _LENGTH.size

# One call's results, each (instance, sequence, position, duplicate); None: not stored.
Results = list[tuple[int, int, int, bool]] | None


class Full(NamedTuple):
    """A call the owner refused, its instance's queue full: the depth it found, the pool's
    ``max_queue_depth``, and how many events the call brought (``QueueFullError``'s)."""

    depth: int
    max_depth: int
    incoming: int


# One call's answer: its results, None (not stored here), or the owner's refusal.
Answer = Results | Full


class WireError(Exception):
    """A frame that is not what the other side sends (the connection is dropped)."""


class Call(NamedTuple):
    """One enqueue a producer asks the owner to store: all its items on one instance."""

    number: int
    pool: str
    instance: int
    items: tuple[Item, ...]


class Request(NamedTuple):
    producer: bytes
    done_below: int  # the producer needs no record of its calls numbered below this
    sync: bool  # fsynced before answered (the producer's durability is "sync")
    calls: list[Call]


def frame(body: Any) -> bytes:
    """``body`` encoded, behind its length."""
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return _LENGTH.pack(len(data)) + data


def frame_length(header: bytes) -> int:
    """The length of the frame ``header`` (its first :data:`HEADER` bytes) begins.

    Raises:
        WireError: longer than :data:`MAX_FRAME`.
    """
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME:
        raise WireError(f"a frame of {length} bytes, over {MAX_FRAME}")
    return int(length)


def encode_request(request: Request) -> bytes:
    calls = [
        [call.number, call.pool, call.instance, [_item_fields(item) for item in call.items]]
        for call in request.calls
    ]
    return frame([VERSION, request.producer, request.done_below, request.sync, calls])


def _item_fields(item: Item) -> list[Any]:
    return [
        item.event,
        item.partition_key,
        item.priority,
        item.due,
        item.dedup_key,
        item.ttl,
        item.trace,
    ]


def decode_request(data: bytes) -> Request:
    """A request frame's body, every field checked.

    Raises:
        WireError: not a request as a producer makes it.
    """
    fields = _unpack(data)
    if type(fields) is not list or len(fields) != 5 or fields[0] != VERSION:
        raise WireError("not a request of this version")
    _, producer, done_below, sync, calls = fields
    if type(producer) is not bytes or len(producer) != PRODUCER_ID_BYTES:
        raise WireError("a bad producer id")
    if not _count(done_below) or type(sync) is not bool:
        raise WireError("a bad request header")
    if type(calls) is not list or not 0 < len(calls) <= MAX_CALLS:
        raise WireError("a bad list of calls")
    return Request(producer, done_below, sync, [_call(call) for call in calls])


def _call(fields: Any) -> Call:
    if type(fields) is not list or len(fields) != 4:
        raise WireError("a call is not [number, pool, index, items]")
    number, pool, index, items = fields
    if not _count(number) or not _count(index):
        raise WireError("a bad call number or instance")
    if type(pool) is not str or not POOL_NAME.fullmatch(pool):
        raise WireError("a bad pool name")
    if type(items) is not list or not 0 < len(items) <= MAX_ITEMS:
        raise WireError("a bad list of events")
    return Call(number, pool, index, tuple(_item(item) for item in items))


def _item(fields: Any) -> Item:
    if type(fields) is not list or len(fields) != 7:
        raise WireError("an event is not its seven fields")
    event, partition_key, priority, due, dedup_key, ttl, trace = fields
    if type(event) is not bytes or len(event) > MAX_EVENT_BYTES:
        raise WireError("a bad event")
    if not _text(partition_key, MAX_PARTITION_KEY_BYTES) or not _text(
        dedup_key, MAX_DEDUP_KEY_BYTES
    ):
        raise WireError("a bad partition or dedup key")
    if type(priority) is not int or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise WireError("a bad priority")
    if not _time(due) or not (_time(ttl) and (ttl is None or ttl > 0)):
        raise WireError("a bad due time or ttl")
    if not trace_carrier(trace):
        raise WireError("a bad trace context")
    return Item(event, partition_key, priority, due, dedup_key, ttl, None, trace)


def encode_answer(answers: Sequence[tuple[int, Answer]]) -> bytes:
    """The answer to a request: each call's number and results (None: not stored; a
    :class:`Full`: refused)."""
    body: list[list[Any]] = []
    for number, answer in answers:
        if isinstance(answer, Full):
            body.append([number, None, list(answer)])
        else:
            body.append([number, None if answer is None else [list(r) for r in answer]])
    return frame([VERSION, body])


def decode_answer(data: bytes) -> dict[int, Answer]:
    """Each call's answer by number, from an answer frame's body.

    Raises:
        WireError: not an answer as an owner makes it.
    """
    fields = _unpack(data)
    if type(fields) is not list or len(fields) != 2 or fields[0] != VERSION:
        raise WireError("not an answer of this version")
    answers: dict[int, Answer] = {}
    body = fields[1]
    if type(body) is not list:
        raise WireError("a bad list of answers")
    for answer in body:
        if type(answer) is not list or len(answer) not in (2, 3) or not _count(answer[0]):
            raise WireError("a bad answer")
        number, results, *refusal = answer
        if refusal:
            answers[number] = _full(results, refusal[0])
        else:
            answers[number] = None if results is None else [_result(r) for r in results]
    return answers


def _full(results: Any, fields: Any) -> Full:
    if (
        results is not None
        or type(fields) is not list
        or len(fields) != 3
        or not all(_count(field) for field in fields)
        or fields[1] < 1
        or fields[2] < 1
    ):
        raise WireError("a bad refusal")
    return Full(*fields)


def _result(fields: Any) -> tuple[int, int, int, bool]:
    if (
        type(fields) is not list
        or len(fields) != 4
        or not all(_count(field) for field in fields[:3])
        or type(fields[3]) is not bool
    ):
        raise WireError("a bad result")
    return fields[0], fields[1], fields[2], fields[3]


def _unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"a frame that does not decode ({type(exc).__name__})") from exc


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**64


def _text(value: Any, limit: int) -> bool:
    return value is None or (type(value) is str and len(value.encode("utf-8", "replace")) <= limit)


def _time(value: Any) -> bool:
    return value is None or (type(value) is float and math.isfinite(value))
