"""Reading a real store from outside its runtime, and acting on its dead letters.

:class:`StoreView` opens a store's LMDB environment read-only, without taking
the store lock, so it works beside a live runtime (in this process or
another): LMDB readers see the last committed state and never block the
writer. It decodes the same records the engine writes (through
:mod:`dopool._store.layout`), so ``dopool status`` shows what ``pool.status()``
would, and also which follow-ups for a pool still wait in outboxes, its own
pool's or another's (:meth:`StoreView.follow_ups_to`). A store of format 1 is
refused (``StoreFormatError``): read-only, it cannot be migrated; a runtime
migrates it when it opens it.

Acting on dead letters (:func:`redrive` and :func:`purge`) goes through a producer's
connection (``ProducerPool.redrive``, ``purge_dead_letters``): one write transaction per
instance, its owner woken to run what was re-enqueued, live beside a runtime holding the
store or without one (the events then run when a runtime next opens it).

Both listing and acting take the dead-letter filters (:class:`~dopool._handles.filters.Filters`)
and an instance; ages are measured from the wall clock (the stand-in runtime's clock
stands at the wall-clock time it was opened).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb

from dopool._clock.clocks import RealClock
from dopool._engine.storage import ReadOnlyStorage
from dopool._errors import StorageError
from dopool._handles.connection import connect
from dopool._handles.filters import Filters, listed
from dopool._handles.schedules import read_schedules
from dopool._machine.status import Listing, read_pool_status
from dopool._ops.check import CheckReport, check_store
from dopool._store.environment import check_store_path, open_readonly
from dopool._store.layout import (
    LeaseRecord,
    Namespace,
    all_leases,
    follow_ups_to,
    pool_records,
    used_instances,
)
from dopool._types import DeadLetter, PoolStatus, ScheduleInfo

_ANY = Filters()
#: Which dead letters to act on: one instance's (an index) or every instance's (None),
#: and the filters (``where`` is the API's only: a command line passes no code).
Selection = tuple[int | None, Filters]


class StoreView:
    """A read-only window on a store; see the module docstring.

    What it returns is checked, not trusted: a record that fails its checksum or
    layout raises :class:`~dopool.DamagedRecordError` naming its key (a damaged
    dead letter is listed as such instead).
    """

    def __init__(self, env: Any, path: Path) -> None:
        self._env = env
        self.path = path

    @contextmanager
    def _read(self) -> Iterator[Any]:
        try:
            with self._env.begin(write=False, buffers=False) as txn:
                yield txn
        except lmdb.Error as exc:
            raise StorageError(f"cannot read store {str(self.path)!r}: {exc}") from exc

    def pools(self) -> dict[str, int]:
        """Every pool the store knows, by name, with its stored concurrency."""
        with self._read() as txn:
            return pool_records(txn)

    def leases(self) -> dict[tuple[str, int], LeaseRecord]:
        """Every lease, by ``(pool, unit)``: which worker serves the instances of that lease
        unit (:mod:`dopool._cluster.units`), until when."""
        with self._read() as txn:
            return {(pool, index): record for pool, index, record in all_leases(txn)}

    def status(self, name: str, concurrency: int, listing: Listing = Listing()) -> PoolStatus:  # noqa: B008
        """The same figures as ``pool.status()``, read from committed state."""
        with self._read() as txn:
            return read_pool_status(txn, name, concurrency, listing.check(concurrency))

    def dead_letters(
        self, name: str, index: int | None = None, filters: Filters = _ANY
    ) -> list[DeadLetter]:
        """The pool's dead letters (or instance ``index``'s) that match ``filters``, by
        instance then sequence (damaged ones marked so); ages are on the wall clock."""
        return listed(self._read, name, self._indices(name, index), filters, RealClock().now())

    def count_dead_letters(self, name: str, index: int | None = None) -> int:
        """How many dead letters the pool (or instance ``index``) holds."""
        with self._read() as txn:
            indices = [index] if index is not None else used_instances(txn, name)
            return sum(Namespace(name, i).count_dead_letters(txn) for i in indices)

    def _indices(self, name: str, index: int | None) -> list[int]:
        """``[index]``, or (None) every instance of pool ``name`` ever used."""
        if index is not None:
            return [index]
        with self._read() as txn:
            return used_instances(txn, name)

    def schedules(self, name: str) -> list[ScheduleInfo]:
        """The pool's recurring schedules, sorted by name."""
        with self._read() as txn:
            return read_schedules(txn, name)

    def storage(
        self, name: str, concurrency: int, partition_key: str | None, instance: int | None
    ) -> ReadOnlyStorage:
        """One instance's own stored values (``ctx.storage``), read-only: the one
        ``partition_key`` routes to, or ``instance``, as ``pool.storage(...)`` names it."""
        return ReadOnlyStorage.of(self._read, name, concurrency, partition_key, instance)

    def follow_ups_to(self, name: str) -> dict[str, int]:
        """The follow-ups for pool ``name`` still in an outbox, counted by instance id."""
        with self._read() as txn:
            return follow_ups_to(txn, name)

    def check(self) -> CheckReport:
        """Every record's checksum and layout, and every instance's counters (``dopool check``)."""
        with self._read() as txn:
            return check_store(txn)


@contextmanager
def open_view(path: str | os.PathLike[str]) -> Iterator[StoreView]:
    """Open a store read-only, beside any runtime that holds it."""
    where = check_store_path(path)
    env = open_readonly(where)
    try:
        yield StoreView(env, where)
    finally:
        env.close()


def _act(
    path: str | os.PathLike[str], pools: dict[str, int], action: str, selection: Selection
) -> dict[str, tuple[int, int]]:
    index, filters = selection
    chosen: dict[str, Any] = {
        "error": filters.error,
        "older_than": filters.older_than,
        "partition_key": filters.partition_key,
    }
    done: dict[str, tuple[int, int]] = {}
    with connect(path) as connection:
        for name in pools:
            pool = connection.pool(name)
            matched = len(pool.dead_letters(index, **chosen))
            act = pool.redrive if action == "redrive" else pool.purge_dead_letters
            done[name] = matched, act(index=index, **chosen)
    return done


def redrive(
    path: str | os.PathLike[str], pools: dict[str, int], selection: Selection = (None, _ANY)
) -> dict[str, tuple[int, int]]:
    """Re-enqueue the dead letters of the given pools that match ``selection`` (an
    instance index or None, and the filters), live beside a runtime owning the store or
    without one. Returns, by pool, how many matched and how many were redriven (a
    damaged one never is; a dead letter a runtime redrives meanwhile matched but is not
    redriven again)."""
    return _act(path, pools, "redrive", selection)


def purge(
    path: str | os.PathLike[str], pools: dict[str, int], selection: Selection = (None, _ANY)
) -> dict[str, tuple[int, int]]:
    """Delete the dead letters of the given pools that match ``selection``, as
    :func:`redrive` does. Returns how many matched and were deleted."""
    return _act(path, pools, "purge", selection)
