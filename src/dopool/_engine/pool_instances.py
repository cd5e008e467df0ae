"""A pool's instances by index, and where its messages go."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dopool._cluster.remote import Away, Verb
from dopool._cluster.routing import Positions, Router
from dopool._engine.cells import Cells
from dopool._engine.messages import Enqueue, Reply
from dopool._engine.router import Placement
from dopool._engine.stored import StoredCalls
from dopool._engine.supervisor import Supervisor
from dopool._errors import (
    ConfigurationError,
    DopoolError,
    NotLeasedError,
    shown,
)
from dopool._machine.types import Item

T = TypeVar("T")


class Instances:
    """A pool's instances by index, and how an event is routed to one: where messages go.

    Its runtime keeps it (``Runtime.kill`` finds an instance through it), its pool
    sends through it, and so do the tools (:mod:`dopool._handles.tools`). Nothing here waits.
    """

    __slots__ = ("away", "cells", "name", "placement", "router", "stored")

    def __init__(
        self,
        name: str,
        cells: Cells,
        placement: Placement,
        stored: StoredCalls,
        away: Away | None = None,
    ) -> None:
        self.name = name
        self.cells = cells  # each made when first used
        self.placement = placement  # the pool's router actor
        self.router: Router = placement.router  # its published table, read by the callers
        self.away = away  # a shared worker's enqueues into instances others serve
        self.stored = stored  # calls on instances waiting for a slot

    def check(self, index: int) -> int:
        """``index``, if the pool has such an instance.

        Raises:
            ConfigurationError: not an int, or out of range.
        """
        if isinstance(index, bool) or not isinstance(index, int):
            raise ConfigurationError(f"instance index must be an int, got {shown(index)}")
        concurrency = self.cells.concurrency
        if not 0 <= index < concurrency:
            raise ConfigurationError(
                f"pool {self.name!r} has no instance {index} (concurrency {concurrency})"
            )
        return index

    def supervisor(self, index: int) -> Supervisor:
        """Instance ``index``'s supervisor (checked as :meth:`check` does)."""
        return self.cells[self.check(index)].supervisor

    def send(self, index: int, message: Callable[[Reply], Any]) -> Reply:
        """Send instance ``index`` ``message(reply)``; returns the reply, not awaited."""
        mailbox = self.cells[index].mailbox
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
        elsewhere = [i for i in indices if not table.serves(i)]
        answers = {c.index: c.drained for c in away.control(verb, elsewhere)} if elsewhere else {}
        for index in indices:
            if table.serves(index):
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
        if elsewhere is None or self.router.table.serves(index):
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
        mailbox = self.cells[index].mailbox
        reply = mailbox.reply()
        mailbox.send(Enqueue((item,), reply))
        return index, reply
