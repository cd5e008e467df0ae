"""The queue machine's dedup keys. Part of the queue machine (:mod:`dopool._machine.machine`).

An event enqueued with a ``dedup_key`` claims the key in its pool's index (one entry per
key, the pool's, not an instance's: :class:`~dopool._store.layout.DedupIndex`) in the
transaction that stores it. Before an enqueue stores anything, its keyed items are
looked up in the same transaction: an item whose key names an event that is not
finished, or one that finished less than the pool's ``dedup_window`` ago, is a
*duplicate*: nothing is stored for it, and its answer is that event's. One keyed event
alone (the usual keyed enqueue) is looked up by its claim: the entry is written only if
the key has none (:meth:`DedupIndex.claim_free`, one call into LMDB); if it has one,
nothing is written, and the entry is read and judged as a batch's would be. Every write
transaction of a store is serialized (a group commit runs its bodies one after another
in nested transactions of one), so the second of two enqueues with one key, from any
instance or thread, sees the first's entry.

When a keyed event finishes (it succeeds, is dead-lettered or drained) its entry is
removed, or, with a window, stamped with the finish time and queued by it for expiry.
Each finish then sweeps a few entries whose window has passed (:data:`SWEEP`), oldest
first: two for each one stamped, so the entries past their window never outnumber the
finishes that could remove them, and a lookup treats one past its window as absent. A
sweep remembers when the oldest entry it left finished: until that one's window has
passed, no finish reads the expiry keys.

An entry is hostile input like any record: one that fails its checks refuses the
enqueue that meets it (nothing stored; ``dopool check`` names it); one that names an
unfinished event no longer stored (its record was damaged and set aside, which cannot
read its key) is stale, and the key is claimed anew.
"""

from __future__ import annotations

import logging

from dopool._errors import DamagedRecordError
from dopool._machine.types import Item
from dopool._store.layout import DedupClaim, DedupIndex, Namespace, event_stored, keyed_events
from dopool._store.txn import Txn
from dopool._types import EnqueueResult

logger = logging.getLogger("dopool")

#: Entries past their window that each finish of a keyed event removes, at most.
SWEEP = 2

# A duplicate's answer, by the item's position: the existing event's result, or the
# position of an earlier item of the same batch that claims the key.
Duplicates = dict[int, EnqueueResult | int]


class Dedup:
    """A pool's dedup keys as one instance's queue machine uses them."""

    __slots__ = (
        "_entry_keys",
        "_index",
        "_namespaces",
        "_oldest",
        "_pool",
        "_swept",
        "claim_free",
        "window",
    )

    def __init__(self, pool: str, window: float) -> None:
        self._pool = pool
        self._index = DedupIndex(pool)
        # One keyed enqueue's claim, which is its lookup too (DedupIndex.claim_free): the
        # index's own method, so that the hot path makes one call.
        self.claim_free = self._index.claim_free
        # The entry keys of the last batch's keys looked up: their claims follow.
        self._entry_keys: dict[str, bytes] = {}
        self._namespaces: dict[int, Namespace] = {}
        self.window = window
        # Without a window no finish stamps an entry: once a sweep has found no expiry key
        # left (from a window this pool had before), the sweeps stop.
        self._swept = False
        # With one, when the oldest expiry key finished, as the last sweep read it: until
        # its window has passed, no other has (the others' finishes came later, from any
        # instance), and no sweep reads. None: not known; the next finish sweeps.
        self._oldest: float | None = None

    def resolve(
        self,
        txn: Txn,
        items: tuple[Item, ...],
        now: float,
        owners: list[tuple[int, int]] | None = None,
    ) -> Duplicates:
        """Which of ``items`` are duplicates (see :data:`Duplicates`); reads, writes nothing.

        ``owners`` (a redrive's): each item's dead letter, ``(instance, sequence)``,
        whose own finish does not make it a duplicate.

        Raises:
            DamagedRecordError: the entry of one of their keys is damaged.
        """
        keys = [item.dedup_key for item in items if item.dedup_key is not None]
        entry_keys = self._entry_keys = self._index.entry_keys(keys)
        held = self._index.held(txn, entry_keys.values())  # usually none of them
        if not held and len(entry_keys) == len(keys):  # and no key repeats: the usual batch
            return {}
        found: Duplicates = {}
        claimed: dict[str, int] = {}
        for position, item in enumerate(items):
            key = item.dedup_key
            if key is None:
                continue
            earlier = claimed.get(key)
            if earlier is not None:
                found[position] = earlier
                continue
            entry_key = entry_keys[key]
            existing = None
            if entry_key in held:
                owner = None if owners is None else owners[position]
                existing = self._existing(txn, key, now, owner, entry_key)
            if existing is None:
                claimed[key] = position
            else:
                found[position] = existing
        return found

    def screen(
        self, txn: Txn, items: tuple[Item, ...], now: float
    ) -> tuple[tuple[Item, ...], Duplicates | None]:
        """The items of a batch to store, and the duplicates (:meth:`resolve`).

        Raises:
            DamagedRecordError: the entry of one of their keys is damaged.
        """
        only = items[0].dedup_key
        if len(items) == 1 and only is not None:  # one enqueue: no batch to look across
            entry_key = self._index.entry_key(only)
            self._entry_keys = {only: entry_key}
            existing = self._existing(txn, only, now, None, entry_key)
            return (items, None) if existing is None else ((), {0: existing})
        duplicates = self.resolve(txn, items, now)
        if not duplicates:
            return items, None
        return tuple(item for n, item in enumerate(items) if n not in duplicates), duplicates

    def _existing(
        self,
        txn: Txn,
        key: str,
        now: float,
        owner: tuple[int, int] | None,
        entry_key: bytes | None = None,
    ) -> EnqueueResult | None:
        """The result of the event that holds ``key`` now, if one does."""
        entry = self._index.get(txn, key, entry_key)
        if entry is None or (entry.instance, entry.sequence) == owner:
            return None
        if entry.finished_at is None:
            ns = self._namespace(entry.instance)
            if not event_stored(txn, ns, entry):
                logger.warning(
                    "pool %s: dedup key %r named event %d of instance %d, which is not stored "
                    "(set aside as damaged?) or holds another key: claimed anew",
                    self._pool,
                    key,
                    entry.sequence,
                    entry.instance,
                )
                return None
            position = entry.position
        elif now - entry.finished_at < self.window:
            position = 0  # finished: nothing runs before it any more
        else:
            return None  # past its window: as if absent
        ident = f"{self._pool}:{entry.instance}"
        return EnqueueResult(entry.sequence, entry.instance, ident, position, True)

    def _namespace(self, index: int) -> Namespace:
        ns = self._namespaces.get(index)
        if ns is None:
            ns = self._namespaces[index] = Namespace(self._pool, index)
        return ns

    def claim(self, txn: Txn, claims: list[DedupClaim]) -> None:
        """The events of ``claims``, just stored, hold their keys (under the entry keys
        of the last lookup, the usual case)."""
        self._index.claim(txn, claims, self._entry_keys)

    def release(self, txn: Txn, key: str, index: int, sequence: int, now: float) -> None:
        """Event ``sequence`` of instance ``index``, holding ``key``, finished at ``now``."""
        window, oldest = self.window, self._oldest
        try:
            stamped = self._index.finish(txn, key, index, sequence, now, window)
        except DamagedRecordError as exc:  # left for ``dopool check``; the outcome commits
            logger.error("pool %s: the entry of dedup key %r: %s", self._pool, key, exc)
            stamped = False
        if window > 0:
            if stamped and oldest is not None and now < oldest:  # a clock stepped back
                oldest = self._oldest = now
            if oldest is None or now - window >= oldest:  # (else none is past its window)
                self._oldest = self._index.sweep(txn, now, window, SWEEP)[1]
        elif not self._swept:
            self._swept = self._index.sweep(txn, now, window, SWEEP)[0] < SWEEP

    def held_by(self, txn: Txn, index: int, sequences: set[int]) -> dict[int, str]:
        """The keys that events ``sequences`` of instance ``index`` hold, by sequence, as
        their entries say: for events whose records are lost (a scan of the pool's index:
        :meth:`DedupIndex.held_by`)."""
        return self._index.held_by(txn, index, sequences) if sequences else {}

    def readable(self, txn: Txn, key: str) -> bool:
        """Whether ``key``'s entry, if any, passes its checks (an error is logged)."""
        try:
            self._index.get(txn, key)
        except DamagedRecordError as exc:
            logger.error("pool %s: the entry of dedup key %r: %s", self._pool, key, exc)
            return False
        return True

    def release_pending(
        self, txn: Txn, ns: Namespace, index: int, now: float, keep: int | None = None
    ) -> None:
        """Every pending event of instance ``index`` (namespace ``ns``) but event ``keep``
        (a running attempt's, which a drain keeps) finishes now (a drain): release their
        keys. Their records are read only if the pool's index holds any entry (else none
        has a key)."""
        if next(iter(self._index.entries(txn)), None) is None:
            return
        for sequence, key in keyed_events(txn, ns):
            if sequence != keep:
                self.release(txn, key, index, sequence, now)


def keyed(items: tuple[Item, ...]) -> bool:
    """Whether any of ``items`` has a dedup key."""
    return any(item.dedup_key is not None for item in items)


def merge(count: int, stored: list[EnqueueResult], duplicates: Duplicates) -> list[EnqueueResult]:
    """A batch's answers in its order: ``stored`` for the items stored, in order, and each
    duplicate's."""
    results: list[EnqueueResult] = []
    fresh = iter(stored)
    for position in range(count):
        found = duplicates.get(position)
        if found is None:
            results.append(next(fresh))
        elif isinstance(found, int):
            first = results[found]
            results.append(
                EnqueueResult(
                    first.sequence, first.instance_index, first.instance_id, first.position, True
                )
            )
        else:
            results.append(found)
    return results
