"""The pools a runtime has defined, by name: where a follow-up into another pool goes.

A handler's follow-up may go to another pool of its runtime (``ctx.enqueue(...,
pool=...)``). Its context finds that pool here when it is called: the pool's
check validates the event at once, and the pool's router picks the instance when
the parent's outcome commits. After the commit the source instance finds the
target's instances here to deliver it (starting it if it is not running), and the
target finds the source's to acknowledge it.

A pool is listed once ``define`` has started and recovered its instances, and
stays listed until the runtime closes. A follow-up whose pool is not listed (the
store was reopened and that pool is not defined yet) waits in its source's outbox:
the source asks to be told (:meth:`Directory.address_or_wait`), and when the pool
is defined each instance that asked is sent a :class:`~dopool._engine.messages.Resend`,
through the clock like any delivery.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from dopool._clock.clocks import Clock
from dopool._engine.cells import Cells
from dopool._engine.mailbox import Mailbox
from dopool._engine.messages import Resend
from dopool._engine.options import PoolOptions
from dopool._errors import ConfigurationError, shown
from dopool._machine.types import Item
from dopool._pools import Pool


@dataclass(frozen=True, slots=True, eq=False)
class PoolAddress:
    """A defined pool, as a follow-up into it needs it.

    Attributes:
        name: the pool's name.
        prepare: checks and encodes an event with the pool's schema and the limits
            (``event, partition_key, priority -> Item``); raises as ``enqueue`` does.
        route: the pool's router: the instance a partition key (or round-robin) picks.
        cells: its instances, by index, each made when first used.
        handle: the :class:`~dopool.WorkerPool` that ``define`` returned for it, weakly:
            what its instances hold must not keep it alive (see :mod:`dopool._handles.tools`).
        options: its options (a follow-up delivered into an instance that another
            worker process serves is stored with them, as a producer stores an event).
    """

    name: str
    prepare: Callable[[Any, str | None, int], Item]
    route: Callable[[str | None], int]
    cells: Cells
    handle: weakref.ref[Pool]
    options: PoolOptions


class Directory:
    """A runtime's defined pools by name, and the instances waiting for one to be defined.

    ``handles`` is the class of the handles ``define`` returns (``WorkerPool``): besides a
    name, ``ctx.enqueue(pool=...)`` takes one of those, when it is this runtime's.
    """

    def __init__(self, clock: Clock, handles: type[Pool]) -> None:
        self._clock = clock
        self._handles = handles
        self._lock = threading.Lock()
        self._pools: dict[str, PoolAddress] = {}
        # pool name -> the instances (by mailbox key) holding follow-ups for it
        self._waiting: dict[str, dict[str, Mailbox]] = {}

    def add(self, address: PoolAddress) -> None:
        """List a defined pool, and have every instance waiting for it resend its follow-ups."""
        with self._lock:
            self._pools[address.name] = address
            waiting = self._waiting.pop(address.name, {})
        for mailbox in waiting.values():
            self._clock.deliver(mailbox.order, partial(mailbox.send, Resend(address.name)))

    def get(self, name: str) -> PoolAddress | None:
        """The pool ``name``, if this runtime defined it."""
        return self._pools.get(name)

    def address_or_wait(self, name: str, waiter: Mailbox) -> PoolAddress | None:
        """The pool ``name``; if it is not defined, None, and ``waiter`` gets a
        ``Resend`` when it is."""
        with self._lock:
            address = self._pools.get(name)
            if address is None:
                self._waiting.setdefault(name, {})[waiter.key] = waiter
            return address

    def resolve(self, pool: object, own: str) -> PoolAddress | None:
        """The pool a handler of pool ``own`` names in ``ctx.enqueue``; None for its own.

        Raises:
            ConfigurationError: no pool of that name is defined in this runtime, the
                handle is another runtime's (not the one listed under its name), or
                ``pool`` is neither a name nor a handle (a ``ProducerPool`` is not one).
        """
        if isinstance(pool, str):
            if pool == own:
                return None
            address = self.get(pool)
            if address is None:
                raise ConfigurationError(
                    f"ctx.enqueue: no pool named {shown(pool)} is defined in this runtime; "
                    "define it before a handler sends follow-ups into it"
                )
            return address
        if isinstance(pool, self._handles):
            address = self.get(pool.name)
            if address is None or address.handle() is not pool:
                raise ConfigurationError(
                    f"ctx.enqueue: {shown(pool)} belongs to another runtime; a follow-up goes "
                    "to a pool of its handler's own runtime"
                )
            return None if pool.name == own else address
        raise ConfigurationError(
            f"ctx.enqueue: pool must be None, a pool name or a WorkerPool, got {shown(pool)}"
        )
