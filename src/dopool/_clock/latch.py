"""A latch: what one wait waits on, whichever backend runs the waiter."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class Latch(Protocol):
    """A one-shot gate: made closed, opened once by ``release``; ``acquire`` waits for it.

    A ``threading.Lock`` acquired at creation is one, for OS threads.
    """

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...

    def release(self) -> None: ...


# What makes a latch for one wait (``Backend.waiter``'s answer).
Waiter = Callable[[], Latch]


def closed_lock(what: str = "") -> threading.Lock:
    """A latch for OS threads: a lock, held from the start, released by the answer."""
    lock = threading.Lock()
    lock.acquire()
    return lock
