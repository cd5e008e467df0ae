"""Calls on instances waiting for a slot, made in the store from the caller's own thread.

An instance that waits for one of the runtime's slots (:mod:`dopool._engine.slots`) has
no actor to take a call, and its caller must not wait for one. An enqueue for it is
stored as a producer stores it (:func:`dopool._cluster.remote.store_shares`: the queue
machine's enqueue in the caller's write transaction, the meta read anew), and so is any
other request (a pause, a cancel, a redrive, a schedule: the machine's own transition,
as a shared worker makes it for an instance another worker serves). Then the instance
is told as its alarm slot now says: put in line if something is due, its alarm noted
with the runtime's timer of evicted instances if it is due later (a delayed event, a
schedule's next fire). An actor that started meanwhile is sent an alarm: its
transactions read the meta anew whenever another writer changed it
(``InstanceShell._load_meta``), so nothing is overwritten. In a shared worker, an
instance whose lease was lost or released meanwhile is the new holder's to start: it is
woken as a producer wakes it.

The pool events of what a call commits (``enqueued``, ``paused``, ...) are published
here, after the commit, as the actor would have; while anybody listens, one caller at a
time commits and publishes, so they come in the order of the commits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from dopool._clock.clocks import Clock
from dopool._cluster.leases import lease_owner
from dopool._cluster.remote import Share, producer_machine, settle, store_shares
from dopool._cluster.routing import Positions
from dopool._engine.cells import Cells
from dopool._engine.evicted import EvictedAlarms
from dopool._errors import DopoolError
from dopool._machine.types import Effects, Item, QueueRules, Request
from dopool._store.environment import Store
from dopool._store.txn import Txn
from dopool._types import PoolEvent


class StoredCalls:
    """A pool's calls on its instances that wait for a slot (see the module docstring).

    Args:
        store: the runtime's store.
        clock: the runtime's clock.
        cells: the pool's instances.
        rules: the pool's queue rules.
        evicted: the runtime's timer of evicted instances' alarms.
        listening: whether anybody takes pool events (else none are made).
        emit: publishes a pool event.
        wake: a shared worker's wake-up of the worker serving an instance, ``(index,
            owner)``; None in an exclusive runtime, which serves every instance.
    """

    __slots__ = (
        "_cells",
        "_clock",
        "_emit",
        "_evicted",
        "_listening",
        "_lock",
        "_machine",
        "_store",
        "_wake",
    )

    def __init__(
        self,
        store: Store,
        clock: Clock,
        cells: Cells,
        rules: QueueRules,
        evicted: EvictedAlarms,
        listening: Callable[[], bool],
        emit: Callable[[PoolEvent], None],
        wake: Callable[[int, str | None], None] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._cells = cells
        self._evicted = evicted
        self._listening = listening
        self._emit = emit
        self._wake = wake
        self._lock = threading.Lock()
        # (A machine per call: kept, one per instance of a per-key pool would add up.)
        self._machine = partial(producer_machine, cells.name, rules=rules, listening=listening)

    def enqueue(
        self, items: tuple[Item, ...], groups: dict[int, Positions], results: list[Any]
    ) -> DopoolError | None:
        """Store each group's items on its instance in one transaction; their results go in
        ``results``, at their positions. The first share refused, if any (it stored
        nothing)."""
        with self.publishing() as events:
            now = self._clock.now()
            with self._store.write() as txn:
                shares = store_shares(
                    txn,
                    self._cells.name,
                    self._machine,
                    items,
                    groups,
                    now,
                    events,
                    owners=self._wake is not None,
                )
        failure = settle(shares, results, _nobody)
        for share in shares:
            if not isinstance(share.answer, DopoolError):
                self.written(share.instance, share.alarm, now, share.owner)
        return failure

    def store_in(
        self, txn: Txn, index: int, items: tuple[Item, ...], now: float, events: list[PoolEvent]
    ) -> Share:
        """Store ``items`` on instance ``index`` in ``txn``, a transaction of the caller's
        that may store others' too (a producer's calls: ``_engine/owner_calls.py``), inside
        :meth:`publishing`; once it has committed, :meth:`written` tells the instance."""
        shares = store_shares(
            txn,
            self._cells.name,
            self._machine,
            items,
            {index: range(len(items))},
            now,
            events,
            owners=self._wake is not None,
        )
        return shares[0]

    def apply(self, index: int, request: Request) -> Any:
        """Make a caller's request's transition on instance ``index`` in the store, as its
        actor would; its answer."""
        machine = self._machine(index)
        with self.publishing() as events:
            now = self._clock.now()
            effects = Effects()
            with self._store.write() as txn:
                meta = machine.namespace.load_meta(txn)
                result = machine.control(txn, meta, request, now, effects)
                machine.namespace.save_meta(txn, meta)
                owner = lease_owner(txn, self._cells.name, index) if self._wake else None
            events.extend(effects.events)
        self.written(index, meta.alarm, now, owner)
        return result

    @contextmanager
    def publishing(self) -> Iterator[list[PoolEvent]]:
        """Collects the events of a transaction made in its body, and publishes them once it
        has committed; one caller at a time while anybody listens."""
        events: list[PoolEvent] = []
        if not self._listening():
            yield events
            return
        with self._lock:
            yield events
            for event in events:
                self._emit(event)

    def written(self, index: int, alarm: float | None, now: float, owner: str | None) -> None:
        """Instance ``index`` was written with its alarm slot at ``alarm``: in line for a
        slot if something is due now, its alarm noted if later (or any noted before
        forgotten if none: a drain emptied it, say); sent an alarm if running. One served
        here no more: ``owner``, whom its lease names, is woken."""
        cells = self._cells
        if self._wake is not None and not cells.serves(index):
            self._wake(index, owner)
        elif cells.get(index) is None and (alarm is None or alarm > now):
            self._evicted.note(cells.name, index, alarm)
        else:
            cells.ready(index)


def _nobody(_index: int, _owner: str | None) -> None:
    """Nobody to wake: :meth:`StoredCalls.written` tells each instance."""
