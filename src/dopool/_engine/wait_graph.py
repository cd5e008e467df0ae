"""Which instance waits for which: a call that would close a cycle is refused, not made.

An instance's thread (its handler, or a hook or subscriber it calls) that calls
another instance and must wait for the answer registers the edge "X waits for
Y" first. One thread acts for one instance at a time, or for a few nested ones
(a handler whose enqueue stores directly into another instance, whose
subscriber calls a third): it waits for one answer at a time, so every instance
waits for at most one other and the graph is a set of chains. Registering an
edge follows the chain from Y under one lock; if it comes back to X, every
instance on it would wait for ever, and the caller that would close the cycle
gets :class:`~dopool.DeadlockError` instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from dopool._clock.threads import Local
from dopool._errors import DeadlockError

Node = tuple[str, int]  # (pool, index)


class _Answer(Protocol):
    @property
    def answered(self) -> bool: ...


class WaitGraph:
    """The waits between a runtime's instances (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # waiter -> (the instance it waits for, the answer it waits for)
        self._edges: dict[Node, tuple[Node, _Answer]] = {}

    @contextmanager
    def waiting(self, waiters: tuple[Node, ...], target: Node, answer: _Answer) -> Iterator[None]:
        """Record that ``waiters`` wait for ``target``'s ``answer`` while the block runs.

        Raises:
            DeadlockError: ``target`` already waits, through a chain, for one of
                ``waiters``; nothing is recorded.
        """
        with self._lock:
            chain = [target]
            node = target
            while node not in waiters:
                edge = self._edges.get(node)
                # An answered wait is over, even if its thread has not woken to say so.
                if edge is None or edge[1].answered:
                    break
                node = edge[0]
                chain.append(node)
            else:
                # ``node`` waits (through ``chain[:-1]``) for itself.
                cycle = (node, *chain[:-1])
                raise DeadlockError(tuple(f"{pool}:{index}" for pool, index in cycle))
            for waiter in waiters:
                self._edges[waiter] = (target, answer)
        try:
            yield
        finally:
            with self._lock:
                for waiter in waiters:
                    self._edges.pop(waiter, None)


def acting(local: Local) -> tuple[Node, ...]:
    """The instances the calling thread acts for, outermost first; () outside any."""
    current: Node | None = getattr(local, "instance", None)
    if current is None:
        return ()
    outer: tuple[Node, ...] = getattr(local, "outer", ())
    return (*outer, current)
