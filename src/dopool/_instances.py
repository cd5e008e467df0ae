"""A pool's instances by index, and where its messages go (:class:`Instances`); its stored
concurrency (:func:`record_concurrency`); what a pool uses of its runtime (:class:`PoolContext`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from dopool._across import Away, Verb
from dopool._errors import (
    ConfigurationError,
    DopoolError,
    NotLeasedError,
    PoolClosedError,
    StorageError,
    shown,
)
from dopool._layout import Namespace, follow_ups_to
from dopool._mailbox import Mailbox
from dopool._messages import Enqueue, Item, Reply
from dopool._placement import Placement
from dopool._router import Positions, Router
from dopool._storage import Store
from dopool._supervisor import Supervisor

if TYPE_CHECKING:
    from dopool._backend import Local
    from dopool._clock import Clock
    from dopool._storage import Txn
    from dopool._waits import WaitGraph

T = TypeVar("T")


class Instances:
    """A pool's instances by index, and how an event is routed to one: where messages go.

    Its runtime keeps it (``Runtime.kill`` finds an instance through it), its pool
    sends through it, and so do the tools (:mod:`dopool._ports`). Nothing here waits.
    """

    __slots__ = ("away", "mailboxes", "name", "placement", "router", "supervisors")

    def __init__(
        self,
        name: str,
        supervisors: list[Supervisor],
        placement: Placement,
        away: Away | None = None,
    ) -> None:
        self.name = name
        self.supervisors = supervisors
        self.mailboxes: list[Mailbox] = [supervisor.mailbox for supervisor in supervisors]
        self.placement = placement  # the pool's router actor
        self.router: Router = placement.router  # its published table, read by the callers
        self.away = away  # a shared worker's enqueues into instances others serve

    def check(self, index: int) -> int:
        """``index``, if the pool has such an instance.

        Raises:
            ConfigurationError: not an int, or out of range.
        """
        if isinstance(index, bool) or not isinstance(index, int):
            raise ConfigurationError(f"instance index must be an int, got {shown(index)}")
        concurrency = len(self.mailboxes)
        if not 0 <= index < concurrency:
            raise ConfigurationError(
                f"pool {self.name!r} has no instance {index} (concurrency {concurrency})"
            )
        return index

    def supervisor(self, index: int) -> Supervisor:
        """Instance ``index``'s supervisor (checked as :meth:`check` does)."""
        return self.supervisors[self.check(index)]

    def send(self, index: int, message: Callable[[Reply], Any]) -> Reply:
        """Send instance ``index`` ``message(reply)``; returns the reply, not awaited."""
        mailbox = self.mailboxes[index]
        reply = mailbox.reply()
        mailbox.send(message(reply))
        return reply

    def store_away(
        self,
        groups: dict[int, Positions],
        items: tuple[Item, ...],
        results: list[Any],
        refused: NotLeasedError | None = None,
    ) -> DopoolError | None:
        """Store shares on instances other workers serve (:class:`Away`); the first
        refused. ``refused``: an instance here said so, the table is stale. Only a shared
        worker has any: elsewhere, ``refused`` is the answer."""
        if self.away is None:
            assert refused is not None, "an exclusive runtime serves every instance here"
            return refused
        return self.away.enqueue(items, groups, results)

    def control(self, verb: Verb, indices: Sequence[int], call: Callable[[int], Any]) -> list[Any]:
        """A shared worker's pause, resume or drain, each instance's answer: those another
        worker serves changed in the store (:meth:`Away.control`), then those here by
        ``call(index)``, one at a time (one released since the table was published: in
        the store too)."""
        assert self.away is not None, "only a shared worker has instances served elsewhere"
        away, table = self.away, self.router.table
        elsewhere = [i for i in indices if i not in table.here]
        answers = {c.index: c.drained for c in away.control(verb, elsewhere)} if elsewhere else {}
        for index in indices:
            if index in table.here:
                try:
                    answers[index] = call(index)
                except NotLeasedError:
                    answers[index] = away.control(verb, [index])[0].drained
        return [answers[index] for index in indices]

    def either(self, index: int, here: Callable[[int], T], away: Callable[[Away], T]) -> T:
        """``here(index)`` if instance ``index`` is served here, else ``away(self.away)``:
        the same change made in the store (a shared worker's, for an instance another
        worker serves or one released since the table was published)."""
        elsewhere = self.away
        if elsewhere is None or index in self.router.table.here:
            try:
                return here(index)
            except NotLeasedError:
                if elsewhere is None:
                    raise
        return away(elsewhere)

    def submit(self, item: Item, partition_key: str | None) -> tuple[int, Reply]:
        """Send one event to the instance it routes to: that instance's index, and the
        reply, which answers a result list."""
        index = self.router.choose(partition_key)
        # What send() does, inline: hot (a simulator submits every arrival this way).
        mailbox = self.mailboxes[index]
        reply = mailbox.reply()
        mailbox.send(Enqueue((item,), reply))
        return index, reply


def record_concurrency(
    store: Store, name: str, concurrency: int, others: Callable[[Txn], list[str]] | None = None
) -> None:
    """Store the pool's concurrency, refusing a change while old instances hold work,
    while any pool's outbox holds follow-ups routed to its old instances, or, for a shared
    worker, while ``others(txn)`` names other live workers (they route by the old one)."""
    with store.write() as txn:
        previous = store.get_pool(txn, name)
        if previous == concurrency:
            return
        live = [] if previous is None or others is None else others(txn)
        if live:
            raise ConfigurationError(
                f"pool {name!r} is served with concurrency {previous} by other live workers "
                f"({', '.join(live)}), which route by it; stop them before changing it to "
                f"{concurrency} (a dead worker's presence expires within its lease ttl)"
            )
        if previous is not None:
            for index in range(previous):
                meta = Namespace(name, index).load_meta(txn)
                held = meta.held_dead_letters
                if meta.pending or meta.outbox or held:
                    raise ConfigurationError(
                        f"pool {name!r} was stored with concurrency {previous}; changing it "
                        f"to {concurrency} would move instance {index}'s {meta.pending} "
                        f"pending events, {meta.outbox} follow-ups and {held} "
                        "dead letters to other partitions. Drain and purge it first, or "
                        f"keep concurrency={previous}"
                    )
            incoming = follow_ups_to(txn, name)
            if incoming:
                where = ", ".join(f"{count} in {ident}'s" for ident, count in incoming.items())
                raise ConfigurationError(
                    f"pool {name!r} was stored with concurrency {previous}; changing it to "
                    f"{concurrency} would deliver follow-ups routed to its old instances "
                    f"({where} outbox) to other partitions, or to none. Define it with "
                    f"concurrency={previous} until they are delivered (join the pools "
                    "that hold them), then change it"
                )
        store.put_pool(txn, name, concurrency)


@dataclass(frozen=True, slots=True)
class PoolContext:
    """What a pool uses of the runtime that defines it; one per runtime, shared by its pools.

    Attributes:
        read: a read-only snapshot of committed state (a context manager yielding the
            read transaction); never waits for writers.
        clock: the runtime's clock.
        in_handler: the thread-local naming the instance a thread acts for (see
            :func:`dopool._waits.acting`).
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
