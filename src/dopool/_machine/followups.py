"""The follow-ups of one instance: where each goes when its parent's outcome commits, and
which deliveries it takes. Part of the queue machine (:mod:`dopool._machine.machine`).

A handler's follow-ups (``ctx.enqueue``) commit with its success; a delayed one's due
time is that commit's time plus its delay, and travels with it (it is scheduled where
it lands, or due at once if delivered after its time). One for this
pool that routes to this instance is appended to its queue at once. Any other,
for another instance of this pool or for an instance of another pool, is parked
in the outbox with the next *link* from this instance to that target (``meta.links``,
keyed by the target's id ``"<pool>:<index>"``), and delivered after the commit.

A target takes link ``k`` from a source only if it is the next one it expects
(its delivery mark for that source, keyed by the source's pool and index), so a
resent duplicate is ignored and nothing is taken out of order; it then
acknowledges it, and the source drops it from its outbox. Recovery resends the
whole outbox, and so does a source asked again by a target that got a link early
(``Redeliver``: an earlier one was lost on the way).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from dopool._errors import DamagedRecordError
from dopool._machine.types import Item
from dopool._store.layout import Meta, Namespace, OutboxRecord
from dopool._store.txn import Txn

logger = logging.getLogger("dopool")

#: The last time a delayed follow-up can be due at: a later one (a clock near the largest
#: float, plus a long delay) would be stored as infinity, which no record takes.
_LAST_TIME = sys.float_info.max


class Target(Protocol):
    """Another pool a follow-up goes to (a :class:`~dopool._engine.directory.PoolAddress`)."""

    @property
    def name(self) -> str: ...

    @property
    def prepare(self) -> Callable[[Any, str | None, int], Item]: ...

    @property
    def route(self) -> Callable[[str | None], int]: ...


# A validated follow-up and its pool: None for this one, or another's Target. A plain
# tuple, not a named one: one is made per ctx.enqueue.
FollowUp = tuple[Item, Target | None]


# machine.append: store items as new pending events on this instance.
Append = Callable[[Txn, Meta, tuple[Item, ...], float, Any], Any]


class FollowUps:
    """One instance's follow-ups and deliveries (see the module docstring).

    Args:
        pool, index: whose.
        namespace: the instance's namespace.
        route: its own pool's router.
        append: stores items on this instance's queue (the machine's ``append``).
    """

    __slots__ = ("_append", "_id", "_index", "_ns", "_pool", "_route")

    def __init__(
        self,
        *,
        pool: str,
        index: int,
        namespace: Namespace,
        route: Callable[[str | None], int],
        append: Append,
    ) -> None:
        self._pool = pool
        self._index = index
        self._id = f"{pool}:{index}"
        self._ns = namespace
        self._route = route
        self._append = append

    def commit(
        self, txn: Txn, meta: Meta, follow_ups: Iterable[FollowUp], now: float, fx: Any
    ) -> None:
        """Store a success's follow-ups, in the order they were made: here, or in the outbox.

        Each is routed now, by its pool's router. ``fx.deliveries`` gets the parked
        ones, to deliver once the transaction has committed.
        """
        for made, target in follow_ups:
            # A delay counts from this commit; past the largest float, it is due at that.
            due = None if made.delay is None else min(now + made.delay, _LAST_TIME)
            item = made if due is None else made._replace(due=due, delay=None)
            if target is None:
                pool, index = self._pool, self._route(item.partition_key)
                if index == self._index:
                    self._append(txn, meta, (item,), now, fx)
                    continue
            else:
                pool, index = target.name, target.route(item.partition_key)
            # Another instance's queue is its own: park the follow-up in our outbox,
            # committed with this outcome, and deliver it after the commit.
            oseq = meta.outbox_next
            meta.outbox_next = oseq + 1
            meta.outbox += 1
            ident = f"{pool}:{index}"
            link = meta.links.get(ident, 0)
            meta.links[ident] = link + 1
            record = OutboxRecord(
                pool,
                index,
                link,
                item.event,
                now,
                item.partition_key,
                item.priority,
                item.due,
                item.trace,
            )
            self._ns.put_outbox(txn, oseq, record)
            fx.deliveries.append((oseq, record))

    def resend(self, txn: Txn, meta: Meta, fx: Any) -> None:
        """After a restart: deliver the whole outbox again, in order.

        A damaged entry names no target: it cannot be delivered, only reported and dropped.
        """
        for oseq, entry in list(self._ns.iter_outbox(txn)):
            if isinstance(entry, DamagedRecordError):
                logger.error("instance %s: follow-up %d dropped: %s", self._id, oseq, entry)
                self._ns.delete_outbox(txn, oseq)
                meta.outbox -= 1
            else:
                fx.deliveries.append((oseq, entry))

    def accept(
        self,
        txn: Txn,
        meta: Meta,
        source_pool: str,
        source: int,
        record: OutboxRecord,
        now: float,
        fx: Any,
    ) -> int:
        """Take follow-up ``record.link`` from instance ``source`` of ``source_pool`` if it
        is the next one; returns the link expected.

        Links from one source arrive in order, so an older one is a resent
        duplicate (ignored) and a newer one means an earlier one went missing
        (not stored: it stays in the source's outbox).
        """
        expected = self._ns.last_delivered(txn, source_pool, source) + 1
        if record.link == expected:
            item = Item(
                record.event, record.partition_key, record.priority, record.due, trace=record.trace
            )
            self._append(txn, meta, (item,), now, fx)
            self._ns.set_delivered(txn, source_pool, source, record.link)
        return expected

    def acknowledged(self, txn: Txn, oseq: int) -> bool:
        """The target has follow-up ``oseq``: drop it from the outbox; whether it was there."""
        return self._ns.delete_outbox(txn, oseq)
