"""The calls a chaos step makes into a pool, and what the history learns from each.

:class:`Calls` is a part of :class:`~dopool._chaos.runner.Runner`: enqueues and
their acknowledgements (the stored part of a failed batch too), drains, redrives
and purges, each recorded in the runner's history with its instances numbered in
one row across the scenario's pools (``Scenario.flat``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Any

from dopool._chaos.clockdriver import ClockDriver
from dopool._chaos.history import (
    Ack,
    Cancelled,
    Dup,
    Ev,
    History,
    PoolPaused,
    Purged,
    Redriven,
    Resumed,
)
from dopool._chaos.scenario import When, when_args
from dopool._chaos.snapshot import InstanceSnapshot
from dopool._errors import InstanceCrashedError, QueueFullError
from dopool._handles.pool import WorkerPool
from dopool._store.layout import DedupIndex, DedupRecord
from dopool._store.txn import Txn
from dopool._types import DeadLetter


class Calls(ABC):
    """The runner's calls into its pools (see the module docstring); the runner gives
    them its history, its clock driver and the three methods below."""

    history: History
    driver: ClockDriver
    enqueued: list[tuple[str, int, int]]  # (pool, index, sequence) of each acknowledged event
    # A drain is under way: an event enqueued meanwhile (a schedule's fire, due while its
    # instance waited for a slot, that the drain started) is named from storage at once,
    # since the drain may remove it before anything else can read it.
    draining = False

    @abstractmethod
    def _committed(self) -> AbstractContextManager[Txn]:
        """A read transaction of committed storage."""

    @abstractmethod
    def _dedup_window(self) -> float:
        """The pools' ``dedup_window``."""

    @abstractmethod
    def _flat(self, pool: str, index: int) -> int:
        """Instance ``index`` of ``pool`` as the history numbers it."""

    @abstractmethod
    def _span(self, pool: str) -> tuple[int, int]:
        """The history's numbers of ``pool``'s instances: ``first`` to ``end - 1``."""

    def _numbers(self, pool: WorkerPool, index: int | None) -> tuple[int, int]:
        """The history's numbers of instance ``index`` of ``pool``, or of all its instances
        (None): ``first`` to ``end - 1``."""
        if index is None:
            return self._span(pool.name)
        first = self._flat(pool.name, index)
        return first, first + 1

    def _whole(self, pool: WorkerPool, *, paused: bool) -> None:
        """Say in the history that ``pool`` is paused (or resumed) as a whole now."""
        self.history.add(PoolPaused(*self._span(pool.name), paused))

    @abstractmethod
    def _read_store(self) -> dict[int, InstanceSnapshot]:
        """Committed storage, by the history's numbers: every instance ever used, and every
        one the history names."""

    @abstractmethod
    def _snapshot(self) -> dict[int, InstanceSnapshot]:
        """Committed storage, each queued and dead entry named in the history."""

    def _enqueue(
        self,
        pool: WorkerPool,
        events: list[dict[str, Any]],
        pk: str | None,
        prio: int,
        many: bool,
        when: When | None = None,
        ttl: float | None = None,
    ) -> None:
        history = self.history
        for event in events:
            history.contents[event["id"]] = event
        args, due = when_args(when, self.driver.clock.now())
        keys = [event.get("dedup") for event in events]
        if any(keys):
            args.update({"dedup_keys": keys} if many else {"dedup_key": keys[0]})
        ttl = ttl if many else events[0].get("ttl")
        if ttl is not None and due is not None and self.driver.clock.now() + ttl <= due:
            ttl = None  # it would end before the event is due: refused
        if ttl is not None:
            args["ttl"] = ttl
        try:
            if many:
                results = pool.enqueue_many(events, partition_key=pk, priority=prio, **args)
            else:
                results = [pool.enqueue(events[0], partition_key=pk, priority=prio, **args)]
        except (InstanceCrashedError, QueueFullError) as exc:
            if isinstance(exc, InstanceCrashedError):
                self.driver.after_crash()
            self._acknowledge_stored(pool, list(exc.stored), due, ttl)
            return
        for event, result in zip(events, results, strict=True):
            entry = (self._flat(pool.name, result.instance_index), result.sequence)
            if result.duplicate:  # nothing stored: the entry holds another event of its key
                history.add(Dup(event["id"], *entry))
                continue
            history.name(entry, event["id"], "enqueue's result")
            history.add(Ack(event["id"], *entry, due, ttl))
            self.enqueued.append((pool.name, result.instance_index, result.sequence))

    def _acknowledge_stored(
        self,
        pool: WorkerPool,
        stored: list[Any],
        due: float | None = None,
        ttl: float | None = None,
    ) -> None:
        """A batch failed part-way: acknowledge the parts its error says were stored."""
        if not stored:
            return
        snapshots = self._read_store()
        for result in stored:
            if result.duplicate:  # nothing of it stored (its event is not known here)
                continue
            inst = self._flat(pool.name, result.instance_index)
            snapshot = snapshots.get(inst)
            queued = None if snapshot is None else snapshot.queue.get(result.sequence)
            if queued is None or queued[1] is None:
                self.history.problem(f"enqueue_many reported {result} stored, but it is not")
                continue
            entry = (inst, result.sequence)
            self.history.name(entry, queued[1], "storage")
            self.history.add(Ack(queued[1], *entry, due, ttl))

    def _cancel(self, pool: WorkerPool, back: int) -> None:
        """Cancel one of the last events enqueued into ``pool`` (running, finished or not)."""
        mine = [(index, seq) for name, index, seq in self.enqueued if name == pool.name]
        if len(mine) <= back:
            return
        index, seq = mine[-1 - back]
        answer = pool.cancel(f"{pool.name}:{index}:{seq}")  # a crash raises: nothing answered
        self.history.add(Cancelled(self._flat(pool.name, index), seq, answer))

    def _drain(self, pool: WorkerPool, index: int | None) -> None:
        before = self._snapshot()
        first, end = self._numbers(pool, index)
        expected = sum(len(snap.queue) for n, snap in before.items() if first <= n < end)
        records = self.history.records
        seen = len(records)
        self.draining = True
        try:
            removed = pool.drain(index)
        finally:
            self.draining = False
        arrived = sum(
            isinstance(r, Ev) and r.kind == "enqueued" and first <= r.inst < end
            for r in records[seen:]
        )
        if not expected <= removed <= expected + arrived:
            self.history.problem(
                f"drain({index}) returned {removed}, {expected} were pending and {arrived} "
                "arrived during it"
            )

    def _letters(self, pool: WorkerPool) -> dict[tuple[int, int], DeadLetter]:
        """The pool's dead letters by entry, each named in the history."""
        letters = {}
        for dead in pool.dead_letters():
            entry = (self._flat(pool.name, dead.instance_index), dead.sequence)
            self.history.name(entry, _id(dead), "dead_letters()")
            letters[entry] = dead
        return letters

    def _redrive(self, pool: WorkerPool, which: str) -> None:
        by_entry = self._letters(pool)
        letters = list(by_entry.values())
        chosen = letters if which == "all" else [d for d in letters if d.sequence % 2]
        holders = self._holders(pool, [d.dedup_key for d in chosen if d.dedup_key is not None])
        now = self.driver.clock.now()
        try:
            count = pool.redrive(None if which == "all" else chosen)
        except InstanceCrashedError:
            self.driver.after_crash()
            count = None
        finally:
            after = self._letters(pool)
            gone = [entry for entry in by_entry if entry not in after]
            dups = [
                (self._flat(pool.name, index), seq)
                for index, seq in _redrive_duplicates(
                    [by_entry[entry] for entry in gone],
                    holders,
                    self._pending(pool),
                    now,
                    self._dedup_window(),
                )
            ]
            redriven = [entry for entry in gone if entry not in dups]
            self.history.add(Redriven(tuple((i, s, _id(by_entry[(i, s)])) for i, s in redriven)))
            self.history.add(Purged(tuple(dups)))  # duplicates of events that hold their keys
        if count is not None and count != len(chosen) - len(dups):
            self.history.problem(
                f"redrive returned {count}, {len(chosen)} were chosen, {len(dups)} duplicates"
            )
        if count is not None and count != len(redriven):
            self.history.problem(f"redrive returned {count}, {len(redriven)} were stored again")

    def _holders(self, pool: WorkerPool, keys: list[str]) -> dict[str, DedupRecord | None]:
        """Each dedup key's index entry in committed storage, before a redrive."""
        if not keys:
            return {}
        index = DedupIndex(pool.name)
        with self._committed() as txn:
            return {key: index.get(txn, key) for key in keys}

    def _pending(self, pool: WorkerPool) -> set[tuple[int, int]]:
        """The pool's pending events as (index, sequence), from the last snapshot read."""
        snapshots = self._read_store()
        first, end = self._span(pool.name)
        return {
            (number - first, seq)
            for number, snap in snapshots.items()
            if first <= number < end
            for seq in snap.queue
        }

    def _purge(self, pool: WorkerPool) -> None:
        letters = self._letters(pool)
        try:
            pool.purge_dead_letters()
        except InstanceCrashedError:
            self.driver.after_crash()
            raise
        finally:
            after = self._letters(pool)
            self.history.add(Purged(tuple(entry for entry in letters if entry not in after)))

    def _pause(self, pool: WorkerPool, index: int | None) -> None:
        """``pool.pause(index)``; of the whole pool, the history says so first."""
        if index is None:
            self._whole(pool, paused=True)
        pool.pause(index)

    def _resume(self, pool: WorkerPool, index: int | None) -> None:
        """``pool.resume(index)``, which also wakes a stalled instance; the history says so."""
        if index is None:
            self._whole(pool, paused=False)
        try:
            pool.resume(index)
        finally:
            self.history.add(Resumed(*self._numbers(pool, index)))


def _redrive_duplicates(
    gone: list[DeadLetter],
    holders: dict[str, DedupRecord | None],
    pending: set[tuple[int, int]],
    now: float,
    window: float,
) -> list[tuple[int, int]]:
    """Which dead letters a redrive removed as duplicates (docs/api.md, "Dedup keys"),
    as (index, sequence): the model of the machine's rule, in the order the instances
    redrive (by instance, then sequence).

    A key is held against a dead letter by another event that held it before the
    redrive, unfinished (and still stored before it) or finished within the window,
    or by a letter redriven before it in the same call.
    """
    claimed: set[str] = set()
    dups = []
    for dead in sorted(gone, key=lambda d: (d.instance_index, d.sequence)):
        key = dead.dedup_key
        if key is None:
            continue
        holder = holders.get(key)
        own = holder is not None and (holder.instance, holder.sequence) == (
            dead.instance_index,
            dead.sequence,
        )
        held = key in claimed or (
            holder is not None
            and not own
            and (
                (holder.instance, holder.sequence) in pending
                if holder.finished_at is None
                else now - holder.finished_at < window
            )
        )
        if held:
            dups.append((dead.instance_index, dead.sequence))
        else:
            claimed.add(key)
    return dups


def _id(dead: DeadLetter) -> str:
    event = dead.event
    return str(event.get("id")) if isinstance(event, dict) else repr(event)
