"""Choosing an instance for an event.

The router is an object, not an actor: its choice is one hash or one counter
step, so the caller's own thread makes it and sends straight to the instance.
A router actor in between would cost every enqueue a second thread hop.
"""

from __future__ import annotations

import hashlib
import itertools
import threading


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

    def split(self, count: int, partition_key: str | None) -> dict[int, range]:
        """Positions ``0..count-1`` of a batch grouped by instance, in first-seen order.

        Round-robin gives instance ``i`` every ``concurrency``-th position, as a range.
        """
        if partition_key is not None:
            return {self.choose(partition_key): range(count)}
        with self._lock:
            start = next(self._next)
            # Claim the whole batch's turns at once, so batches from threads never interleave.
            self._next = itertools.count(start + count)
        step = self.concurrency
        return {
            (start + first) % step: range(first, count, step) for first in range(min(step, count))
        }
