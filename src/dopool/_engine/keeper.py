"""The lease keeper: the threads of a real-clock runtime that renew its leases, and start
and stop its instances as they are taken, lost and released (:mod:`dopool._cluster.leases`).

Every ``ttl / 3`` seconds its renewal thread runs one renewal transaction for all the
runtime's leases, and does nothing after it that could make the next one late, whatever
the number of instances: it hands on what the renewal decided. A lease covers a *unit*
of a pool's instances (:mod:`dopool._cluster.units`; one instance per unit in a pool of
up to 4,096). In a shared runtime:

- the instances of a unit whose lease it **took** are served from then on
  (:meth:`Cells.serve`): each starts when first needed, as in an exclusive runtime, and
  is evicted when idle. The starter thread starts at once those the store's work and
  alarm indexes name in the unit (each recovers as after a crash; one taken over after
  its holder's lease expired counts a restart), without waiting for them, or puts them in
  line for one of the runtime's slots; ``define`` waits for those it started;
- those of a unit whose lease it **lost** (another worker took it over while this one
  hung) are stopped, not restarted: their transactions were already refused (fencing);
- those of the units it must **release** (more than its fair share) stop gracefully on a
  helper thread, one per renewal: their mailboxes close, their running handlers finish,
  then their leases are deleted, together, and the next renewal of another worker takes
  them. Their slots go back once their actors have stopped.

So what a worker keeps in memory and starts grows with the instances that have work, not
with the size of its units (a per-key pool's unit spans 2**52 instances). Losing a unit
is losing its instances: one retaken by another worker before its instances started
here, or while they recover, is passed over, and the others start.

An instance not served here is *vacant*: its mailbox has no actor, and a caller's
message to it fails with :class:`~dopool._errors.NotLeasedError` (an enqueue, pause,
resume or drain is then made in the store instead, see :mod:`dopool._cluster.remote`). An
exclusive runtime serves every instance, each started when first used
(:mod:`dopool._engine.cells`); its keeper only writes and renews the leases of every
unit, at most 4,096 per pool whatever its size.

After a renewal or a stop that changed what this process serves, or whom a lease
names, the keeper tells each pool's router actor (:mod:`dopool._engine.router`), which
publishes the new routing table; it does not wait for it.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import pykka

from dopool._clock.clocks import Clock
from dopool._clock.turn import Turn
from dopool._cluster.leases import RENEWALS, LeaseBook, Taken, Where, Worker, unit_owner
from dopool._cluster.units import named, unit_of, units
from dopool._engine.cells import Cell, Cells
from dopool._engine.messages import Reply
from dopool._engine.router import Placement
from dopool._engine.slots import Slots
from dopool._engine.supervisor import Supervisor, await_recovery
from dopool._engine.wakeups import Notifier, worker_socket
from dopool._errors import ConfigurationError, NotLeasedError, PoolClosedError
from dopool._store.environment import Store
from dopool._store.layout import all_presences, instances_waiting
from dopool._store.txn import Txn

logger = logging.getLogger("dopool")

_STOP_WAIT = 3600.0  # seconds a released instance's handler may take to finish
_SETTLE_EVERY = 0.05  # seconds between two looks at which stopping actors have stopped


@dataclass(slots=True)
class _Starts:
    """Leases one renewal took, for the starter thread: each started instance's
    recovery reply, once all are sent (``sent``)."""

    taken: list[Taken]
    replies: list[tuple[Supervisor, Reply]] = field(default_factory=list)
    sent: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class _Stop:
    """A lease unit's instances stopping here: each one's cell and actor (None: none
    running), how many slots they hold, and whether the lease is to be released once they
    have stopped (lost: not)."""

    where: Where
    actors: tuple[tuple[Cell, pykka.ActorRef[Any] | None], ...]
    slots: int
    release: bool


class LeaseKeeper:
    """Renews a runtime's leases on a daemon thread, and acts on what each renewal says.

    Args:
        store: the runtime's store (renewals are write transactions under its writer lock,
            and leases expire by its lease clock).
        book: the runtime's :class:`LeaseBook`.
        clock: the runtime's clock: its alarms are cleared for the instances that stop here.
        slots: the runtime's slots, which the actors that stop here give back.
    """

    def __init__(self, store: Store, book: LeaseBook, clock: Clock, slots: Slots) -> None:
        self.book = book
        self._store = store
        self._clock = clock
        self._slots = slots
        self._pools: dict[str, Cells] = {}  # a shared runtime's pools, by name
        self._placements: dict[str, Placement] = {}  # each pool's router actor
        self._owners: dict[str, tuple[str | None, ...]] = {}  # as the last renewal read
        self._told: dict[str, tuple[frozenset[int], tuple[str | None, ...]]] = {}
        # One renewal (and what it decides) at a time. First come, first served: the
        # starter and the stopping threads take it once per instance, and a plain lock
        # would let them take it again and again while a renewal waits for it.
        self._lock = Turn()
        self._stop = threading.Event()
        self._serving = True  # False once the runtime closes: nothing more starts
        # Units taken but whose instances the starter has not started yet.
        self._starting: dict[Where, Taken] = {}
        # Units whose instances' actors are stopping here: not taken again until they have
        # stopped, so that an instance never has two actors in this process.
        self._stopping: dict[Where, _Stop] = {}
        self._stoppers: list[threading.Thread] = []  # the threads that stop them
        self._starts: queue.SimpleQueue[_Starts | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="dopool-leases", daemon=True)
        self._starter = threading.Thread(target=self._start_loop, name="dopool-starts", daemon=True)
        self._started = False
        # Wakes the worker serving an instance this runtime delivered a follow-up into.
        self._notifier = Notifier(store.path) if self.shared else None

    def wake(self, pool: str, index: int, owner: str | None) -> None:
        """Tell the worker serving ``pool:index`` (``owner``) to wake it; never raises."""
        if self._notifier is not None:
            self._notifier.wake(pool, index, owner)

    @property
    def shared(self) -> bool:
        return not self.book.exclusive

    def others(self, txn: Txn) -> list[str]:
        """The other live workers on the store (presences not expired), for an error; in a
        write transaction of the store."""
        me, now = self.book.worker.owner, self._store.lease_time()
        return [
            f"pid {presence.pid} on {presence.host}"
            for owner, presence in all_presences(txn)
            if owner != me and presence.expires_at > now
        ]

    def add_pool(
        self,
        name: str,
        pool: Cells | None,
        concurrency: int,
        placement: Placement | None = None,
    ) -> None:
        """Serve ``name`` from now on: take its leases (a shared runtime's fair share of its
        units) and, with ``pool`` (shared), start the instances of the units taken and wait
        for their recoveries;
        tell ``placement`` (its router actor) where they are served. Starts the threads
        first, so that renewals stay on time while the instances start."""
        with self._lock:
            if pool is not None:
                self._pools[name] = pool
            if placement is not None:
                self._placements[name] = placement
            self.book.add_pool(name, concurrency)
            try:
                starts = self._renew_now()
            except BaseException:  # the pool is not defined: take none of its leases
                self._pools.pop(name, None)
                self._placements.pop(name, None)
                self._told.pop(name, None)
                self.book.remove_pool(name)
                raise
            if not self._started:
                self._started = True
                self._thread.start()
                self._starter.start()
        if starts is not None:
            starts.sent.wait()
            for supervisor, reply in starts.replies:
                with suppress(NotLeasedError, PoolClosedError):  # lost or closed meanwhile
                    await_recovery(supervisor, reply)

    def _run(self) -> None:
        interval = self.book.ttl / RENEWALS
        next_at = time.monotonic() + interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at = time.monotonic() + interval
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    self._renew_now()
                except Exception:  # the store closing under it, a full disk: next time
                    logger.warning("renewing the leases failed", exc_info=True)

    def _renew_now(self) -> _Starts | None:
        """One renewal, then hand on what it says (the lock held): the leases taken to
        the starter thread (returned, if any), those lost and released to a stopping
        thread. Nothing here waits for an actor."""
        before = self.book.snapshot()
        try:
            with self._store.write() as txn:
                now = self._store.lease_time()
                renewal = self.book.renew(txn, now, frozenset(self._stopping))
                # (An exclusive runtime serves every instance: it wakes nobody.)
                self._owners = self._read_owners(txn) if self.shared else {}
        except BaseException:
            self.book.restore(before)  # rolled back: what it held before, it still holds
            raise
        logger.debug(
            "renewed %d leases: %d taken, %d lost, %d to release; %d live workers",
            len(self.book.held),
            len(renewal.taken),
            len(renewal.lost),
            len(renewal.release),
            renewal.live,
        )
        for pool, unit in renewal.lost:
            logger.warning(
                "the lease of %s:%s was taken over by another worker (this one did not "
                "renew it in time): its instances stop here",
                pool,
                self._shown(pool, unit),
            )
        stops = self._retire(renewal.lost, release=False) + self._retire(
            renewal.release, release=True
        )
        if stops:
            stopper = threading.Thread(
                target=self._stop_all, args=(stops,), name="dopool-release", daemon=True
            )
            self._stoppers = [t for t in self._stoppers if t.is_alive()] + [stopper]
            stopper.start()
        taken = [t for t in renewal.taken if t.pool in self._pools]
        starts = None
        if taken:
            for t in taken:
                self._starting[(t.pool, t.unit)] = t
            starts = _Starts(taken)
            self._starts.put(starts)
        for owner, presence in renewal.gone:
            self._forget(owner, presence.pid, presence.host)
        for error in renewal.damaged:
            logger.error("%s: treated as an expired one", error)
        self._place()
        return starts

    def _read_owners(self, txn: Txn) -> dict[str, tuple[str | None, ...]]:
        """Whom each lease of each pool names, read in the renewal's transaction."""
        return {
            name: tuple(unit_owner(txn, name, u) for u in range(units(placement.concurrency)))
            for name, placement in self._placements.items()
        }

    def _place(self) -> None:
        """Tell each pool's router actor where its instances are served, if that changed:
        here, those of the units whose lease this worker holds and whose actors are not
        stopping (all of them in an exclusive runtime). One still to start is here
        already: a call that finds its mailbox vacant meanwhile stores its enqueue through
        the store, which the instance's recovery then finds. A tell: the keeper never waits
        for the actor. Called with the lock."""
        held = self.book.held
        for name, placement in self._placements.items():
            every = range(units(placement.concurrency))
            if self.shared:
                here = frozenset(
                    u for u in every if (name, u) in held and (name, u) not in self._stopping
                )
            else:
                here = frozenset(every)
            told = (here, self._owners.get(name, (None,) * len(every)))
            if self._told.get(name) != told:
                self._told[name] = told
                placement.placed(*told)

    def _forget(self, owner: str, pid: int, host: str) -> None:
        """Remove the wake-up socket a dead worker of this host left (a hung one keeps it)."""
        if host != self.book.worker.host or _alive(pid):
            return
        with suppress(OSError):
            os.unlink(self._store.path / worker_socket(owner))

    # -- starting --------------------------------------------------------------------------

    def _start_loop(self) -> None:
        """The starter thread: start the instances of each renewal's leases, in turn."""
        while (starts := self._starts.get()) is not None:
            try:
                self._start_all(starts)
            except Exception:  # an instance's start failing must not stop the others'
                logger.exception("starting the instances of the leases taken failed")
            finally:
                starts.sent.set()

    def _start_all(self, starts: _Starts) -> None:
        """Serve the instances of each unit taken that is still to start here, then start
        those with work or an alarm (found from the store's indexes after the units are
        served: what a caller stored meanwhile is found, or its wake-up starts it). The
        lock is taken for one unit at a time: a renewal never waits for a batch."""
        # Read before: which instances a unit taken after its expiry had work for, each
        # owed a restart whoever starts it first (the poll may, once the unit is served).
        expired = {taken.pool for taken in starts.taken if taken.expired}
        before = {
            name: self._by_unit(self._pools[name], waiting)
            for name, waiting in self._waiting(expired).items()
        }
        served: dict[str, set[int]] = {}
        for taken in starts.taken:
            where = (taken.pool, taken.unit)
            with self._lock:
                if self._starting.get(where) is not taken:
                    continue  # lost or released before it started: passed over
                del self._starting[where]
                if not self._serving:
                    self._release_now(where)
                    continue
                restarted = before.get(taken.pool, {}).get(taken.unit, []) if taken.expired else []
                self._pools[taken.pool].serve(taken.unit, restarted)
                served.setdefault(taken.pool, set()).add(taken.unit)
                logger.info(
                    "took the lease of %s:%s (epoch %d%s)",
                    taken.pool,
                    self._shown(taken.pool, taken.unit),
                    taken.epoch,
                    ", after its holder's expired" if taken.expired else "",
                )
        for name, waiting in self._waiting(set(served)).items():
            cells = self._pools[name]
            for index in waiting:
                # (One lost since is left alone by the calls below.)
                if unit_of(index, cells.concurrency) in served[name]:
                    self._start_one(cells, index, starts)

    def _waiting(self, pools: set[str]) -> dict[str, list[int]]:
        """The instances with work or an alarm of each of ``pools``, from the indexes."""
        if not pools:
            return {}
        with self._store.read() as txn:
            return {name: instances_waiting(txn, name) for name in sorted(pools)}

    @staticmethod
    def _by_unit(cells: Cells, indexes: list[int]) -> dict[int, list[int]]:
        """``indexes`` of ``cells``' pool by lease unit (a stray one past the pool's end is
        of no unit it has)."""
        grouped: dict[int, list[int]] = {}
        for index in indexes:
            grouped.setdefault(unit_of(index, cells.concurrency), []).append(index)
        return grouped

    @staticmethod
    def _start_one(cells: Cells, index: int, starts: _Starts) -> None:
        """Start instance ``index`` now, its recovery's reply kept for ``define`` to wait
        for, or put it in line for a slot."""
        started = cells.start(index)
        if started is None:
            cells.ready(index)
        elif started[1] is not None:
            starts.replies.append((started[0].supervisor, started[1]))

    def _shown(self, name: str, unit: int) -> str:
        """A lease unit as a log line names it: its instance, or its range of them."""
        placement = self._placements.get(name)
        return str(unit) if placement is None else named(unit, placement.concurrency)

    def _release_now(self, where: Where) -> None:
        """Give up a lease taken while the runtime began to close (the lock held)."""
        try:
            with self._store.write() as txn:
                self.book.release(txn, *where)
        except Exception:  # its expiry frees it instead
            logger.debug("releasing %s:%s", where[0], self._shown(*where), exc_info=True)

    # -- stopping --------------------------------------------------------------------------

    def _retire(self, wheres: list[Where], *, release: bool) -> list[_Stop]:
        """Stop the instances of the units ``wheres`` here: vacant at once; their actors are
        stopped by :meth:`_stop_all` (a handler may take a while). Called with the lock."""
        by_pool: dict[str, set[int]] = {}
        for name, unit in wheres:
            if name in self._pools:
                self._starting.pop((name, unit), None)  # not started yet: they never will be
                by_pool.setdefault(name, set()).add(unit)
        stops = []
        for name, pool_units in by_pool.items():
            # Vacant at once: a caller is told another worker serves them, and a follow-up
            # for one is delivered into its namespace (its actor may finish a handler).
            dropped = self._pools[name].unserve(pool_units)
            for unit in sorted(pool_units):
                cells = dropped.get(unit, [])
                # Each started one holds a slot (one restarting after a backoff too); one
                # held in line holds none.
                slots = sum(not cell.mailbox.held for cell in cells)
                actors = tuple((cell, cell.supervisor.close(vacant=True)) for cell in cells)
                where = (name, unit)
                if where in self._stopping:  # a stop on its way already (lost while released;
                    continue  # its cells were dropped then: none here)
                stop = self._stopping[where] = _Stop(where, actors, slots, release)
                stops.append(stop)
        return stops

    def _stop_all(self, stops: list[_Stop]) -> None:
        """Stop the actors of ``stops`` together, and settle each unit once its actors have
        stopped, those done so far in one transaction (a helper thread's work)."""
        futures: list[tuple[_Stop, list[pykka.Future[Any]]]] = []
        for stop in stops:
            pending = []
            for _, ref in stop.actors:
                if ref is not None:
                    with suppress(pykka.ActorDeadError):
                        pending.append(ref.stop(block=False))
            futures.append((stop, pending))
        deadline = time.monotonic() + _STOP_WAIT
        while futures:
            done: list[tuple[_Stop, list[pykka.Future[Any]]]] = []
            waiting: list[tuple[_Stop, list[pykka.Future[Any]]]] = []
            for stop, pending in futures:
                pending[:] = [future for future in pending if not _finished(future, 0.0)]
                (waiting if pending else done).append((stop, pending))
            if not done:
                left = deadline - time.monotonic()
                if left > 0:  # a long handler must not hold the others' releases up
                    _finished(waiting[0][1][0], min(left, _SETTLE_EVERY))
                    continue
                done, waiting = waiting, []  # hung: their leases expire meanwhile
            futures = waiting
            self._settle([stop for stop, _ in done])

    def _settle(self, stops: list[_Stop]) -> None:
        """Their actors have stopped: clear their alarms, give their slots back, and release
        the leases to release (in one transaction)."""
        for stop in stops:
            for cell, _ in stop.actors:
                self._clock.set_alarm(cell.mailbox, None)
                self._clock.set_alarm(cell.idle_timer, None)
            for _ in range(stop.slots):
                self._slots.give_back()
        with self._lock:
            releasing = [stop.where for stop in stops if stop.release]
            if releasing and not self._stop.is_set():
                try:
                    with self._store.write() as txn:
                        for pool, unit in releasing:
                            self.book.release(txn, pool, unit)
                except Exception:  # the store closed meanwhile: the leases expire
                    logger.debug("releasing %s", releasing, exc_info=True)
                else:
                    for pool, unit in releasing:
                        shown = self._shown(pool, unit)
                        logger.info("released the lease of %s:%s (fair share)", pool, shown)
            for stop in stops:
                self._stopping.pop(stop.where, None)
            self._place()

    def stop_serving(self) -> None:
        """The runtime is closing: take and start nothing more (renewals go on until
        :meth:`close`)."""
        with self._lock:
            self._serving = False
            self.book.stop_taking()

    def close(
        self, keep: Iterable[tuple[str, int]] = (), deadline: float | None = None
    ) -> list[Cell]:
        """Stop renewing; wait until ``deadline`` (``time.monotonic()``; None: as long as
        they take) for the instances stopping here (leases lost or released) to finish
        their handlers; delete the leases held (but those of the instances ``keep``, ``(pool,
        index)``, and of those still stopping, left to expire) and the presence, so other
        workers take them at once. Returns the cells whose actors are still running: the
        caller abandons them with its own."""
        self._stop.set()
        self._starts.put(None)
        if self._started:
            self._thread.join()
            self._starter.join()
        if self._notifier is not None:
            self._notifier.close()
        # No renewal starts a stop now. A released unit's lease is deleted only once its
        # actors have stopped: another worker taking it sooner would run an instance twice.
        for stopper in self._stoppers:
            stopper.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._lock:
            still = [
                cell
                for stop in self._stopping.values()
                for cell, ref in stop.actors
                if ref is not None and ref.is_alive()
            ]
            kept = [*keep, *(cell.mailbox.order for cell in still)]
            try:
                with self._store.write() as txn:
                    self.book.leave(txn, kept)
            except Exception:  # their expiry frees them instead
                logger.warning("removing the leases at close failed", exc_info=True)
        return still


def _finished(future: pykka.Future[Any], timeout: float) -> bool:
    """Whether an actor's stop ``future`` is done, waiting at most ``timeout`` seconds."""
    try:
        future.get(timeout=timeout)
    except pykka.Timeout:
        return False
    except Exception:  # dead already (fenced): stopped all the same
        return True
    return True


def check_shared(shared: object, clock: Clock) -> bool:
    """``shared``, if a runtime on ``clock`` may open its store shared (a real clock).

    Raises:
        ConfigurationError: not a bool, or ``True`` under a clock that does not watch
            the store (a simulated one: no other process can run beside it).
    """
    if not isinstance(shared, bool):
        raise ConfigurationError(f"shared must be True or False, got {shared!r}")
    if shared and not clock.watches_store:
        raise ConfigurationError(
            "shared=True needs a real clock: workers sharing a store run in real time"
        )
    return shared


def keep_leases(
    clock: Clock, store: Store, ttl: float, slots: Slots, *, shared: bool
) -> LeaseKeeper | None:
    """A real-clock runtime's keeper (its thread starts with the first pool); None under
    a simulated clock, which holds no leases."""
    if not clock.watches_store:
        return None
    book = LeaseBook(Worker.this_process(), ttl, exclusive=not shared)
    return LeaseKeeper(store, book, clock, slots)


#: Seconds ``define`` in a shared worker waits for its pool's first routing table.
PUBLISHED_WAIT = 10.0


def serve_pool(
    keeper: LeaseKeeper | None, store: Store, cells: Cells, placement: Placement
) -> None:
    """Serve a newly defined pool: an exclusive runtime's keeper writes its leases, and the
    instances that left work or an alarm in the store start now (the rest start when
    first used, :mod:`dopool._engine.cells`); a shared one's keeper starts those whose
    leases it takes. Either tells ``placement`` where they are served."""
    if keeper is not None and keeper.shared:
        keeper.add_pool(cells.name, cells, cells.concurrency, placement)
        # The table that routes to the instances just leased is published before
        # ``define`` returns, so its caller's first enqueues reach them (and are theirs:
        # emitted, counted), not the store as a producer's write. Bounded: a router that
        # does not answer only delays that.
        with suppress(pykka.Timeout, pykka.ActorDeadError):
            placement.current(timeout=PUBLISHED_WAIT)
        return
    if keeper is not None:
        keeper.add_pool(cells.name, None, cells.concurrency, placement)
    with store.read() as txn:
        waiting = instances_waiting(txn, cells.name)
    # One instance at a time, in index order, so a simulated run's trace is deterministic;
    # those beyond the runtime's slots wait in line (``max_active``).
    for index in waiting:
        if index < cells.concurrency:  # (``define`` refused a concurrency that strands work)
            started = cells.start(index)
            if started is None:
                cells.ready(index)
            elif started[1] is not None:
                await_recovery(started[0].supervisor, started[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True
