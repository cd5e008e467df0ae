"""Choosing an instance for an event, and the router actor that forwards enqueues."""

from __future__ import annotations

import hashlib
import itertools
import threading
from typing import TYPE_CHECKING, Any

import pykka

from dopool._messages import Enqueue, Route

if TYPE_CHECKING:
    from dopool._mailbox import Mailbox


def stable_hash(partition_key: str) -> int:
    """BLAKE2b (8-byte digest) of the key's UTF-8, read big-endian.

    Unlike Python's salted string hashing, it is the same in every process and on every
    Python version, so a partition always maps to the same instance.
    """
    digest = hashlib.blake2b(partition_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Router:
    """Round-robin, or ``stable_hash(partition_key) % concurrency``. Thread-safe."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._next = itertools.count()
        self._lock = threading.Lock()

    def choose(self, partition_key: str | None) -> int:
        if partition_key is not None:
            return stable_hash(partition_key) % self.concurrency
        with self._lock:
            return next(self._next) % self.concurrency


class RouterActor(pykka.ThreadingActor):
    """One per pool: splits a batch by instance and forwards each part, without waiting.

    The caller's reply future gets one ``(index, future, positions)`` triple per
    instance; the instances answer those futures directly. When the route is
    only planned (``forward=False``) the futures are None.
    """

    def __init__(self, router: Router, instances: list[Mailbox], mailbox: Mailbox) -> None:
        super().__init__()
        self._router = router
        self._instances = instances
        self._mailbox = mailbox

    def on_receive(self, message: Any) -> None:
        try:
            if isinstance(message, Route):
                self._route(message)
        finally:
            self._mailbox.finished()

    def _route(self, message: Route) -> None:
        groups: dict[int, list[int]] = {}
        for position in range(len(message.items)):
            index = self._router.choose(message.partition_key)
            groups.setdefault(index, []).append(position)
        parts: list[tuple[int, pykka.Future[Any] | None, list[int]]] = []
        for index, positions in groups.items():
            if not message.forward:
                parts.append((index, None, positions))
                continue
            reply: pykka.Future[Any] = pykka.ThreadingFuture()
            items = tuple(message.items[p] for p in positions)
            self._instances[index].send(Enqueue(items, reply))
            parts.append((index, reply, positions))
        message.reply.set(parts)
