"""A producer's id and its call numbers, as it sends calls to the owners of its instances.

Every call a producer sends (to a worker's call socket, ``_handles/owner_link.py``, or a
Ray shard host, ``_ray/producer.py``) carries the producer's id and a number of its own,
so that a call tried again is answered from its record rather than stored twice
(``_store/layout/calls.py``). Each request also tells the owner the lowest number still
out, below which the producer needs no answer again and its records may go.
"""

from __future__ import annotations

import itertools
import secrets
import threading

from dopool._store.layout import PRODUCER_ID_BYTES


class CallNumbers:
    """A producer's id (16 random bytes) and its call numbers. Thread-safe: each call takes
    a number (:meth:`begin`) and gives it back once its caller has its answer, by
    whichever path (:meth:`end`)."""

    def __init__(self) -> None:
        self.producer = secrets.token_bytes(PRODUCER_ID_BYTES)
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._out: set[int] = set()  # call numbers not yet answered to their callers
        self._next = 0

    def begin(self) -> int:
        """A new call's number."""
        with self._lock:
            number = next(self._numbers)
            self._out.add(number)
            self._next = number + 1
            return number

    def end(self, number: int) -> None:
        """The call ``number`` is answered to its caller: its record may go."""
        with self._lock:
            self._out.discard(number)

    def done_below(self) -> int:
        """The lowest call number still out (every record below it may go)."""
        with self._lock:
            return min(self._out, default=self._next)
