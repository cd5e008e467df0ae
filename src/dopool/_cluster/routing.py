"""Choosing an instance for an event, from a pool's routing table.

A :class:`RoutingTable` is an immutable snapshot of a pool's placement: its
concurrency, and where each lease unit's instances are served (here, by another worker
process, or by nobody known; :mod:`dopool._cluster.units`), so that its size is bounded
whatever the number of instances. In a runtime, the pool's router actor
(:mod:`dopool._engine.router`) is its single writer: it builds each new table and
publishes it in :attr:`Router.table`, one attribute assignment. Callers read that
attribute without a lock and route from their own thread, so an enqueue costs no
hop to the actor. The round-robin cursor is not placement: it stays a counter
beside the table. A producer (:mod:`dopool._handles.connection`) builds its table from the
store in each transaction, and routes with the same functions.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dopool._cluster.units import unit_of, units

T = TypeVar("T")

#: A batch's positions that one instance takes: a range, or a list once dedup keys
#: have moved some (see :meth:`Router.split`).
Positions = range | list[int]


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """A pool's placement as one process sees it, at one version.

    Attributes:
        concurrency: the pool's number of instances.
        here: the lease units whose instances this process serves (all of them in an
            exclusive or simulated runtime; those a shared worker holds the leases of).
        owners: per lease unit, the worker id its lease names (whom to wake), or None
            when none is known.
        version: how many tables the router actor published before this one.
    """

    concurrency: int
    here: frozenset[int]
    owners: tuple[str | None, ...]
    version: int = 0

    @classmethod
    def local(cls, concurrency: int) -> RoutingTable:
        """Every instance served here (an exclusive or simulated runtime)."""
        count = units(concurrency)
        return cls(concurrency, frozenset(range(count)), (None,) * count)

    @classmethod
    def elsewhere(cls, concurrency: int) -> RoutingTable:
        """No instance served here, no owner known (a producer; a shared worker at first)."""
        return cls(concurrency, frozenset(), (None,) * units(concurrency))

    def serves(self, index: int) -> bool:
        """Whether this process serves instance ``index``."""
        return unit_of(index, self.concurrency) in self.here

    def owner(self, index: int) -> str | None:
        """The worker serving instance ``index``, if known."""
        return self.owners[unit_of(index, self.concurrency)]


def stable_hash(partition_key: str) -> int:
    """BLAKE2b (8-byte digest) of the key's UTF-8, read big-endian.

    Unlike Python's salted string hashing, it is the same in every process and on every
    Python version, so a partition always maps to the same instance.
    """
    digest = hashlib.blake2b(partition_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Router:
    """A pool's published :class:`RoutingTable`, and its round-robin cursor. Thread-safe.

    Round-robin, or ``stable_hash(partition_key) % concurrency``. Only the pool's
    router actor assigns :attr:`table`; everyone else reads it.
    """

    __slots__ = ("_lock", "_next", "table")

    def __init__(self, concurrency: int, *, start: int = 0, table: RoutingTable | None = None):
        """``start``: the instance round-robin picks first; ``table``: the first table
        (default: every instance here)."""
        self.table = RoutingTable.local(concurrency) if table is None else table
        self._next = itertools.count(start)
        self._lock = threading.Lock()

    @property
    def concurrency(self) -> int:
        return self.table.concurrency

    def choose(self, partition_key: str | None, table: RoutingTable | None = None) -> int:
        """The instance for one event, by ``table`` (default: the one published now)."""
        concurrency = (self.table if table is None else table).concurrency
        if partition_key is not None:
            return stable_hash(partition_key) % concurrency
        with self._lock:
            return next(self._next) % concurrency

    def split(
        self,
        count: int,
        partition_key: str | None,
        keys: Sequence[str | None] | None = None,
        table: RoutingTable | None = None,
    ) -> dict[int, Positions]:
        """Positions ``0..count-1`` of a batch grouped by instance, in first-seen order.

        Round-robin gives instance ``i`` every ``concurrency``-th position, as a range.
        With ``keys`` (each position's dedup key, or None), a position whose key an earlier
        one has goes to that one's instance: there, in one transaction, it is its duplicate.
        """
        step = (self.table if table is None else table).concurrency
        if partition_key is not None:
            return {stable_hash(partition_key) % step: range(count)}
        with self._lock:
            start = next(self._next)
            # Claim the whole batch's turns at once, so batches from threads never interleave.
            self._next = itertools.count(start + count)
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
