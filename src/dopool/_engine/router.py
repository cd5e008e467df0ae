"""The router actor: one per pool in each runtime, the single writer of its routing table.

The pool's :class:`~dopool._cluster.routing.Router` holds the published
:class:`~dopool._cluster.routing.RoutingTable`; callers read it without a lock or a hop
(:mod:`dopool._cluster.routing`). A change of placement reaches the actor as a message, and the
actor alone builds the next table and publishes it:

- :class:`Placed`: the lease keeper's word after a renewal that changed what this
  process serves or whom a lease names (a worker joined, died, left), and at an
  exclusive runtime's start: which lease units' instances are served here, and whom
  each unit's lease names.
- :class:`Current`: asked, answers the table published once every message told
  before it is handled (tests and tools wait on it, with a timeout).

It waits for no one: the keeper tells it and goes on. The first table is the one the
router is made with: every instance here (an exclusive or simulated runtime), or none
(a shared worker, until its keeper's first renewal). Its loop runs on a thread of its
own, or as a greenlet under a simulated clock's greenlet backend, where no lease exists
and so it is never told anything: a simulated run is the same with it as without.
"""

from __future__ import annotations

import logging
import threading
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import pykka

from dopool._clock.threads import Backend, Future, Inbox
from dopool._cluster.routing import Router, RoutingTable

logger = logging.getLogger("dopool")


@dataclass(frozen=True, slots=True)
class Placed:
    """Where the pool's instances are served now, as the lease keeper knows it: the lease
    units served here, and per unit the owner its lease names."""

    here: frozenset[int]
    owners: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Current:
    """Asked: the table published once the messages before this one are handled."""


class RouterActor(pykka.ThreadingActor):
    """Owns a pool's routing table: builds each one from a :class:`Placed`, publishes it."""

    # Like the instances' threads: an open runtime's actors must not keep the
    # interpreter alive (atexit closes the runtime, stopping them).
    use_daemon_thread = True

    def __init__(self, name: str, router: Router, backend: Backend) -> None:
        self._backend = backend  # first: pykka's __init__ makes the inbox from it
        super().__init__()
        self._name = name
        self._router = router

    def _create_actor_inbox(self) -> Inbox:  # type: ignore[override]  # pykka's is static
        return self._backend.inbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return Future()  # a GreenInbox binds it to its scheduler

    def _start_actor_loop(self) -> None:
        runner = self._backend.runner
        if runner is not None:
            runner.spawn(self._actor_loop, f"router {self._name}")
        else:
            thread = threading.Thread(target=self._actor_loop, name=f"dopool-router-{self._name}")
            thread.daemon = True
            thread.start()

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Placed):
            self._publish(message)
            return None
        if isinstance(message, Current):
            return self._router.table
        logger.error("router of %r: unexpected message %r, ignored", self._name, message)
        return None

    def _publish(self, placed: Placed) -> None:
        table = self._router.table
        if (placed.here, placed.owners) == (table.here, table.owners):
            return  # nothing moved: the table stands, and its version
        self._router.table = RoutingTable(
            table.concurrency, placed.here, placed.owners, table.version + 1
        )


class Placement:
    """A pool's router actor, as its runtime and lease keeper use it. Nothing here waits,
    but :meth:`current`, from outside the actors."""

    __slots__ = ("_ref", "name", "router")

    def __init__(self, name: str, router: Router, backend: Backend) -> None:
        self.name = name
        self.router = router
        self._ref: pykka.ActorRef[Any] = RouterActor.start(name, router, backend)

    @property
    def concurrency(self) -> int:
        return self.router.table.concurrency

    def placed(self, here: frozenset[int], owners: tuple[str | None, ...]) -> None:
        """Tell the actor where the lease units' instances are served now (``here``: the
        units served here; ``owners``: whom each unit's lease names); never waits, never raises
        once the actor has stopped (the runtime is closing)."""
        with suppress(pykka.ActorDeadError):
            self._ref.tell(Placed(here, owners))

    def current(self, timeout: float | None = None) -> RoutingTable:
        """The table published once every message told before is handled."""
        table = self._ref.ask(Current(), timeout=timeout)
        assert isinstance(table, RoutingTable)
        return table

    def stop(self) -> pykka.Future[Any] | None:
        """Ask the actor to stop; its future (None if it had stopped)."""
        try:
            return self._ref.stop(block=False)
        except pykka.ActorDeadError:
            return None
