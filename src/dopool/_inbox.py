"""An instance actor's inbox: pykka's FIFO of envelopes, plus what the engine needs of it.

Plugged into pykka through its extension point for an actor's inbox
(``_create_actor_inbox``). Besides ``put``, ``get`` and ``empty``, it can take
the enqueues waiting at its head in one step (so that they share one
transaction) and hand everything still waiting to a restarted actor. It is the
only module that reads pykka's envelopes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import pykka


class Inbox:
    """A first-in, first-out queue of pykka envelopes, for one actor."""

    __slots__ = ("_items", "_ready")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._ready = threading.Condition(threading.Lock())

    def put(self, envelope: Any, /) -> None:
        with self._ready:
            self._items.append(envelope)
            self._ready.notify_all()  # the actor, and anyone in wait_for

    def get(self) -> Any:
        """The next envelope, waiting for one if none is there."""
        with self._ready:
            while not self._items:
                self._ready.wait()
            return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def take_leading(self, kind: type) -> list[Any]:
        """Remove and return the messages of type ``kind`` at the head, in order.

        Only a run at the head is taken, so none overtakes a message of another
        kind sent before it. Meant for the actor itself, the only reader.
        """
        items = self._items
        # Others only append, so a head seen here stays the head: most calls find
        # none to take, and need no lock to say so.
        if not items or type(items[0].message) is not kind:
            return []
        taken = []
        with self._ready:
            while items and type(items[0].message) is kind:
                taken.append(items.popleft().message)
        return taken

    def drain(self) -> tuple[list[Any], list[pykka.Future[Any]]]:
        """Remove everything still waiting: the messages told, in order, and the futures
        of the requests asked (only ``close()`` asks: pykka's stop request)."""
        with self._ready:
            envelopes = list(self._items)
            self._items.clear()
        told = [envelope.message for envelope in envelopes if envelope.reply_to is None]
        asked = [envelope.reply_to for envelope in envelopes if envelope.reply_to is not None]
        return told, asked

    def wait_for(self, holds: Callable[[list[Any]], bool], timeout: float | None) -> bool:
        """Wait until ``holds(messages waiting)``; False on timeout (tests use it)."""
        with self._ready:
            return self._ready.wait_for(
                lambda: holds([envelope.message for envelope in self._items]), timeout
            )
