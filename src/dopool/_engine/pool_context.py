"""What a pool uses of the runtime that defines it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from dopool._clock.clocks import Clock
from dopool._clock.threads import Local
from dopool._engine.wait_graph import WaitGraph
from dopool._errors import PoolClosedError, StorageError
from dopool._store.txn import Txn


@dataclass(frozen=True, slots=True)
class PoolContext:
    """What a pool uses of the runtime that defines it; one per runtime, shared by its pools.

    Attributes:
        read: a read-only snapshot of committed state (a context manager yielding the
            read transaction); never waits for writers.
        clock: the runtime's clock.
        in_handler: the thread-local naming the instance a thread acts for (see
            :func:`dopool._engine.wait_graph.acting`).
        waits: the runtime's wait-for graph, where a call from an instance's thread
            records its wait.
        closed: whether the runtime is closed.
        handler_running: ``(pool, index)`` if the calling thread is that instance's,
            inside a message (``Runtime.handler_running``).
    """

    read: Callable[[], AbstractContextManager[Txn]]
    clock: Clock
    in_handler: Local
    waits: WaitGraph
    closed: Callable[[], bool]
    handler_running: Callable[[], tuple[str, int] | None]

    @contextmanager
    def read_open(self, pool: str) -> Iterator[Txn]:
        """A read of committed state for ``pool``'s methods, the runtime checked open first.

        Raises:
            PoolClosedError: the runtime is closed, before the read or while it ran
                (another thread's ``close()`` closes the store under it: the read's
                own failure would be a ``StorageError`` saying nothing of the close).
        """
        if self.closed():
            raise PoolClosedError(pool)
        try:
            with self.read() as txn:
                yield txn
        except StorageError as exc:
            if self.closed():
                raise PoolClosedError(pool) from exc
            raise
