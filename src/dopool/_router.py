"""Choosing an instance for an event.

The router is an object, not an actor: its choice is one hash or one counter
step, so the caller's own thread makes it and sends straight to the instance.
A router actor in between would cost every enqueue a second thread hop.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")

#: A batch's positions that one instance takes: a range, or a list once dedup keys
#: have moved some (see :meth:`Router.split`).
Positions = range | list[int]


def stable_hash(partition_key: str) -> int:
    """BLAKE2b (8-byte digest) of the key's UTF-8, read big-endian.

    Unlike Python's salted string hashing, it is the same in every process and on every
    Python version, so a partition always maps to the same instance.
    """
    digest = hashlib.blake2b(partition_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Router:
    """Round-robin, or ``stable_hash(partition_key) % concurrency``. Thread-safe."""

    def __init__(self, concurrency: int, *, start: int = 0) -> None:
        """``start``: the instance round-robin picks first."""
        self.concurrency = concurrency
        self._next = itertools.count(start)
        self._lock = threading.Lock()

    def choose(self, partition_key: str | None) -> int:
        """The instance for one event."""
        if partition_key is not None:
            return stable_hash(partition_key) % self.concurrency
        with self._lock:
            return next(self._next) % self.concurrency

    def split(
        self, count: int, partition_key: str | None, keys: Sequence[str | None] | None = None
    ) -> dict[int, Positions]:
        """Positions ``0..count-1`` of a batch grouped by instance, in first-seen order.

        Round-robin gives instance ``i`` every ``concurrency``-th position, as a range.
        With ``keys`` (each position's dedup key, or None), a position whose key an earlier
        one has goes to that one's instance: there, in one transaction, it is its duplicate.
        """
        if partition_key is not None:
            return {self.choose(partition_key): range(count)}
        with self._lock:
            start = next(self._next)
            # Claim the whole batch's turns at once, so batches from threads never interleave.
            self._next = itertools.count(start + count)
        step = self.concurrency
        groups: dict[int, Positions] = {
            (start + first) % step: range(first, count, step) for first in range(min(step, count))
        }
        return groups if keys is None else _with_repeats(groups, keys)


def _with_repeats(groups: dict[int, Positions], keys: Sequence[str | None]) -> dict[int, Positions]:
    if len(groups) == 1:
        return groups  # one instance takes the whole batch, repeats and all
    named = [key for key in keys if key is not None]
    if len(set(named)) == len(named):
        return groups  # no key repeats (the usual case): round-robin stands
    where = [0] * len(keys)
    for index, positions in groups.items():
        for position in positions:
            where[position] = index
    first: dict[str, int] = {}
    parts: dict[int, list[int]] = {index: [] for index in groups}
    for position, key in enumerate(keys):
        if key is not None:
            where[position] = where[first.setdefault(key, position)]
        parts[where[position]].append(position)
    return {index: part for index, part in parts.items() if part}


def pick(items: Sequence[T], positions: Positions) -> tuple[T, ...]:
    """The items at ``positions``."""
    if isinstance(positions, range):
        return tuple(items[positions.start : positions.stop : positions.step])
    return tuple(items[position] for position in positions)


def place(results: list[Any], positions: Positions, values: Sequence[Any]) -> None:
    """Put ``values`` at ``positions`` of ``results``."""
    if isinstance(positions, range):
        results[positions.start : positions.stop : positions.step] = values
    else:
        for position, value in zip(positions, values, strict=True):
            results[position] = value
