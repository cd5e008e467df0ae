"""The lease keeper: one thread per real-clock runtime that renews its leases and starts
and stops its instances as they are taken, lost and released (:mod:`dopool._leases`).

Every ``ttl / 3`` seconds it runs one renewal transaction for all the runtime's leases.
Then, in a shared runtime:

- an instance whose lease it **took** is started and recovers from its namespace as
  after a crash (a lease taken over after it expired counts a restart);
- one whose lease it **lost** (another worker took it over while this one hung) is
  stopped, not restarted: its transactions were already refused (fencing);
- one it must **release** (more than its fair share) stops gracefully on a helper
  thread: its mailbox closes, its running handler finishes, then the lease is deleted,
  and the next renewal of another worker takes it.

An instance not served here is *vacant*: its mailbox has no actor, and a caller's
message to it fails with :class:`~dopool._errors.NotLeasedError` (an enqueue, pause,
resume or drain is then made in the store instead, see :mod:`dopool._across`). An
exclusive runtime starts every instance itself; its keeper only writes and renews
their leases.

After a renewal that changed what this process serves, or whom a lease names, the
keeper tells each pool's router actor (:mod:`dopool._placement`), which publishes the
new routing table; it does not wait for it (a renewal must not be late).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dopool._errors import ConfigurationError
from dopool._layout import all_presences
from dopool._leases import RENEWALS, LeaseBook, Taken, Where, Worker, lease_owner
from dopool._supervisor import Supervisor, recover_first
from dopool._watch import Notifier, worker_socket

if TYPE_CHECKING:
    from dopool._clock import Clock
    from dopool._instance import InstanceMemory
    from dopool._placement import Placement
    from dopool._storage import Store, Txn

logger = logging.getLogger("dopool")

_STOP_WAIT = 3600.0  # seconds a released instance's handler may take to finish


@dataclass(frozen=True, slots=True)
class LeasedPool:
    """A shared runtime's pool, as the keeper starts and stops its instances."""

    supervisors: Sequence[Supervisor]
    memories: Sequence[InstanceMemory]


class LeaseKeeper:
    """Renews a runtime's leases on a daemon thread, and acts on what each renewal says.

    Args:
        store: the runtime's store (renewals are write transactions under its writer lock).
        book: the runtime's :class:`LeaseBook`.
        clock: the runtime's clock: its alarms are cleared for the instances that stop
            here (leases expire by the store's lease clock).
    """

    def __init__(self, store: Store, book: LeaseBook, clock: Clock) -> None:
        self.book = book
        self._store = store
        self._clock = clock
        self._pools: dict[str, LeasedPool] = {}
        self._placements: dict[str, Placement] = {}  # each pool's router actor
        self._told: dict[str, tuple[frozenset[int], tuple[str | None, ...]]] = {}
        self._lock = threading.Lock()  # one renewal (and what it starts) at a time
        self._stop = threading.Event()
        self._serving = True  # False once the runtime closes: nothing more starts
        # Instances whose actor is stopping here: not taken again until it has stopped,
        # so that an instance never has two actors in this process.
        self._stopping: set[Where] = set()
        self._thread = threading.Thread(target=self._run, name="dopool-leases", daemon=True)
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
        pool: LeasedPool | None,
        concurrency: int,
        placement: Placement | None = None,
    ) -> None:
        """Serve ``name`` from now on: take its leases (a shared runtime's fair share) and,
        with ``pool`` (shared), start the instances taken; tell ``placement`` (its router
        actor) where they are served. Starts the thread."""
        with self._lock:
            if pool is not None:
                self._pools[name] = pool
            if placement is not None:
                self._placements[name] = placement
            self.book.add_pool(name, concurrency)
            try:
                self._renew_now()
            except BaseException:  # the pool is not defined: take none of its leases
                self._pools.pop(name, None)
                self._placements.pop(name, None)
                self._told.pop(name, None)
                self.book.remove_pool(name)
                raise
            if not self._started:
                self._started = True
                self._thread.start()

    def _run(self) -> None:
        interval = self.book.ttl / RENEWALS
        while not self._stop.wait(interval):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    self._renew_now()
                except Exception:  # the store closing under it, a full disk: next time
                    logger.warning("renewing the leases failed", exc_info=True)

    def _renew_now(self) -> None:
        """One renewal, then start, stop and release what it says (the lock held)."""
        before = self.book.snapshot()
        try:
            with self._store.write() as txn:
                now = self._store.lease_time()
                renewal = self.book.renew(txn, now, frozenset(self._stopping))
                owners = self._owners(txn)
        except BaseException:
            self.book.restore(before)  # rolled back: what it held before, it still holds
            raise
        for pool, index in renewal.lost:
            logger.warning(
                "the lease of %s:%d was taken over by another worker (this one did not "
                "renew it in time): the instance stops here",
                pool,
                index,
            )
            self._retire(pool, index, release=False)
        for where in renewal.release:
            self._retire(*where, release=True)
        for taken in renewal.taken:
            self._start(taken)
        for owner, presence in renewal.gone:
            self._forget(owner, presence.pid, presence.host)
        for error in renewal.damaged:
            logger.error("%s: treated as an expired one", error)
        self._place(owners)

    def _owners(self, txn: Txn) -> dict[str, tuple[str | None, ...]]:
        """Whom each lease of each pool names, read in the renewal's transaction."""
        return {
            name: tuple(lease_owner(txn, name, index) for index in range(placement.concurrency))
            for name, placement in self._placements.items()
        }

    def _place(self, owners: dict[str, tuple[str | None, ...]]) -> None:
        """Tell each pool's router actor where its instances are served, if that changed:
        here, those whose lease this worker holds and whose actor is not stopping (all
        of them in an exclusive runtime). A tell: the keeper never waits for the actor."""
        held = self.book.held
        for name, placement in self._placements.items():
            every = range(placement.concurrency)
            if self.shared:
                here = frozenset(
                    i for i in every if (name, i) in held and (name, i) not in self._stopping
                )
            else:
                here = frozenset(every)
            told = (here, owners[name])
            if self._told.get(name) != told:
                self._told[name] = told
                placement.placed(*told)

    def _forget(self, owner: str, pid: int, host: str) -> None:
        """Remove the wake-up socket a dead worker of this host left (a hung one keeps it)."""
        if host != self.book.worker.host or _alive(pid):
            return
        with suppress(OSError):
            os.unlink(self._store.path / worker_socket(owner))

    def _start(self, taken: Taken) -> None:
        pool = self._pools.get(taken.pool)
        if pool is None:  # an exclusive runtime starts its instances itself
            return
        if not self._serving:
            with self._store.write() as txn:
                self.book.release(txn, taken.pool, taken.index)
            return
        supervisor = pool.supervisors[taken.index]
        pool.memories[taken.index].forget()
        supervisor.reopen()  # starts the actor
        logger.info(
            "took the lease of %s:%d (epoch %d%s)",
            taken.pool,
            taken.index,
            taken.epoch,
            ", after its holder's expired" if taken.expired else "",
        )
        recover_first(supervisor, restarts=1 if taken.expired else 0)

    def _retire(self, name: str, index: int, *, release: bool) -> None:
        """Stop an instance here, on a helper thread (its handler may take a while);
        with ``release``, delete its lease once it has stopped."""
        pool = self._pools.get(name)
        if pool is None:
            return
        supervisor = pool.supervisors[index]
        # Vacant at once: a caller is told another worker serves it, and a follow-up for it
        # is delivered into its namespace (its actor here may still finish a handler).
        ref = supervisor.close(vacant=True)
        where = (name, index)
        if where in self._stopping:  # a stop on its way already (lost while released)
            return
        self._stopping.add(where)

        def stop() -> None:
            if ref is not None:
                try:
                    ref.stop(block=True, timeout=_STOP_WAIT)
                except Exception:  # dead already (fenced), or hung: the lease expires
                    logger.debug("stopping %s:%d", name, index, exc_info=True)
            self._clock.set_alarm(supervisor.mailbox, None)
            with self._lock:
                if release and not self._stop.is_set():
                    try:
                        with self._store.write() as txn:
                            self.book.release(txn, name, index)
                    except Exception:  # the store closed meanwhile: the lease expires
                        logger.debug("releasing %s:%d", name, index, exc_info=True)
                    else:
                        logger.info("released the lease of %s:%d (fair share)", name, index)
                if self._serving:
                    supervisor.vacate()
                self._stopping.discard(where)

        threading.Thread(target=stop, name=f"dopool-release-{name}:{index}", daemon=True).start()

    def stop_serving(self) -> None:
        """The runtime is closing: start nothing more (renewals go on until :meth:`close`)."""
        with self._lock:
            self._serving = False

    def close(self, keep: Iterable[Where] = ()) -> None:
        """Stop renewing; delete the leases held (but ``keep``, left to expire) and the
        presence, so other workers take them at once."""
        self._stop.set()
        if self._started:
            self._thread.join()
        if self._notifier is not None:
            self._notifier.close()
        with self._lock:
            try:
                with self._store.write() as txn:
                    self.book.leave(txn, keep)
            except Exception:  # their expiry frees them instead
                logger.warning("removing the leases at close failed", exc_info=True)


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


def keep_leases(clock: Clock, store: Store, ttl: float, *, shared: bool) -> LeaseKeeper | None:
    """A real-clock runtime's keeper (its thread starts with the first pool); None under
    a simulated clock, which holds no leases."""
    if not clock.watches_store:
        return None
    return LeaseKeeper(store, LeaseBook(Worker.this_process(), ttl, exclusive=not shared), clock)


def serve_pool(
    keeper: LeaseKeeper | None,
    name: str,
    supervisors: Sequence[Supervisor],
    memories: Sequence[InstanceMemory],
    placement: Placement,
) -> None:
    """Start a newly defined pool's instances: all of them (an exclusive runtime, whose
    keeper writes their leases first), or those whose leases a shared one takes; its
    keeper tells ``placement`` where they are served."""
    concurrency = len(supervisors)
    if keeper is not None and keeper.shared:
        for supervisor in supervisors:
            supervisor.vacate()
        keeper.add_pool(name, LeasedPool(supervisors, memories), concurrency, placement)
        return
    if keeper is not None:
        keeper.add_pool(name, None, concurrency, placement)
    for supervisor in supervisors:
        supervisor.start()
    # One instance at a time, so a simulated run's trace is deterministic.
    for supervisor in supervisors:
        recover_first(supervisor)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True
