"""Leases: which worker process serves which instance, decided in the store.

Several worker processes may serve one store (``Runtime(path, shared=True)``); each
instance is served by the one whose **lease** names it. A lease covers a *unit* of a
pool's instances (:mod:`dopool._cluster.units`: one instance per unit in a pool of up
to 4,096, a contiguous range of them in a larger one); its record (``L <pool>:<unit>``
→ owner id, pid, host, epoch, expires_at) names the worker serving every instance of
the unit, and each live worker keeps a **presence**
record (``W <owner>`` → pid, host, expires_at) so that workers can count each other.
Times are the host's lease clock's (:mod:`dopool._store.leaseclock`: epoch seconds that do
not step with the wall clock, nor run while the store's writer lock is stalled); a
lease lasts ``ttl`` seconds from its last renewal. This module is the bookkeeping,
sans I/O: :class:`LeaseBook` takes a write transaction and the time, and says what
changed; :mod:`dopool._engine.keeper` runs it on a thread and starts and stops the instances
it names.

At each renewal a worker (one transaction, under the store's writer lock):

1. writes its presence, and counts the live workers (presences not expired);
2. extends each lease it holds, if the record still names it and its epoch;
   one that names another (taken over while this worker hung) is **lost**;
3. per pool, with ``fair`` its share (:func:`fair_share`: the pool's units split as
   evenly as they go among the live workers): holding more than ``fair``, it names
   the excess to **release** (their instances stop gracefully, then
   :meth:`LeaseBook.release` deletes the lease); holding fewer, it **takes** free
   leases and expired ones, up to ``fair``. A lease taken over from another
   worker after it expired gets ``epoch + 1``, and its instances' recoveries count a
   restart.

An exclusive runtime (the default ``Runtime(path)``) holds the store's exclusive lock,
so no other worker lives: it takes every lease of its pools at once, stale ones too.

**Fencing**: every write transaction of a shared worker's instance first checks
(:meth:`LeaseBook.holds`) that its unit's lease still names this worker and the epoch it
took; if not, the transaction commits nothing and the instance stops here. The check
compares the stored record's bytes with those this worker last wrote (no decoding):
only this worker rewrites its own lease, and any other writer's record differs.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from dopool._cluster.routing import stable_hash
from dopool._cluster.units import unit_of, units
from dopool._errors import ConfigurationError, DamagedRecordError
from dopool._store.layout import (
    LeaseRecord,
    PresenceRecord,
    all_presences,
    damaged_presences,
    delete_lease,
    delete_presence,
    get_lease,
    get_pool,
    lease_key,
    put_lease,
    put_presence,
)
from dopool._store.txn import Txn

#: Seconds a lease lasts after its last renewal (``Runtime(lease_ttl=)``,
#: ``dopool worker --lease-ttl``); a worker renews every third of it.
DEFAULT_LEASE_TTL = 10.0
MAX_LEASE_TTL = 3600.0
#: Renewals per ttl.
RENEWALS = 3


def check_lease_ttl(seconds: object) -> float:
    """``seconds`` as a float, if it is a lease ttl: > 0 and <= ``MAX_LEASE_TTL``.

    Raises:
        ConfigurationError: anything else.
    """
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= MAX_LEASE_TTL
    ):
        raise ConfigurationError(
            f"lease_ttl must be seconds > 0 and <= {MAX_LEASE_TTL:g}, got {seconds!r}"
        )
    return float(seconds)


def new_owner_id() -> str:
    """A worker's id, unique per process: its host, its pid and a random part."""
    host = "".join(c if (c.isascii() and c.isalnum()) or c in "-._" else "_" for c in _host())
    return f"{host[:64] or 'host'}-{os.getpid()}-{secrets.token_hex(4)}"


def _host() -> str:
    return socket.gethostname()


def lease_owner(txn: Txn, pool: str, index: int) -> str | None:
    """The owner id the lease of instance ``pool:index``'s unit names, for a wake-up; None
    if none (or damaged: ``dopool check`` reports it, and the poll wakes the instance)."""
    try:
        concurrency = get_pool(txn, pool)
        if concurrency is None or not 0 <= index < concurrency:
            return None
        return unit_owner(txn, pool, unit_of(index, concurrency))
    except DamagedRecordError:
        return None


def unit_owner(txn: Txn, pool: str, unit: int) -> str | None:
    """The owner id lease ``unit`` of ``pool`` names; None if none (or damaged)."""
    try:
        record = get_lease(txn, pool, unit)
    except DamagedRecordError:
        return None
    return None if record is None else record.owner


Where = tuple[str, int]  # (pool, unit)


@dataclass(frozen=True, slots=True)
class Taken:
    """A lease taken at a renewal: its unit's instances start here, recovering from the
    store."""

    pool: str
    unit: int
    epoch: int
    expired: bool  # taken over from another worker whose lease expired: count a restart


@dataclass(slots=True)
class Renewal:
    """What a renewal changed: leases taken, lost, and to release."""

    taken: list[Taken] = field(default_factory=list)
    lost: list[Where] = field(default_factory=list)
    release: list[Where] = field(default_factory=list)
    live: int = 1
    gone: list[tuple[str, PresenceRecord]] = field(default_factory=list)  # presences deleted
    damaged: list[DamagedRecordError] = field(default_factory=list)  # leases, presences


class _Held(NamedTuple):
    """A lease this worker holds: its epoch, its key, and its bytes as last written here."""

    epoch: int
    key: bytes
    sealed: bytes


Held = dict[Where, _Held]  # replaced whole, never changed in place: a snapshot


@dataclass(frozen=True, slots=True)
class Worker:
    """Who this worker is, as its records name it."""

    owner: str
    pid: int
    host: str

    @classmethod
    def this_process(cls) -> Worker:
        return cls(new_owner_id(), os.getpid(), _host())


class LeaseBook:
    """This worker's leases: the units it holds (and each one's epoch), decided in
    transactions.

    ``exclusive``: the runtime holds the store exclusively, so it takes every lease
    of its pools whoever's record is there. Its methods run in a write transaction
    the caller gives; :meth:`holds` may run on any thread (it reads a dict).
    """

    def __init__(self, worker: Worker, ttl: float, *, exclusive: bool) -> None:
        self.worker = worker
        self.ttl = ttl
        self.exclusive = exclusive
        self._pools: dict[str, int] = {}  # concurrency, by pool (read without the lock)
        self._held: Held = {}
        self._releasing: set[Where] = set()
        self._taking = True  # False once the runtime closes: renewals take nothing
        self._lock = threading.Lock()

    def add_pool(self, pool: str, concurrency: int) -> None:
        with self._lock:
            self._pools[pool] = concurrency

    def stop_taking(self) -> None:
        """Take no lease any more (the runtime is closing); renew those held."""
        with self._lock:
            self._taking = False

    def remove_pool(self, pool: str) -> None:
        """Take no lease of ``pool`` any more (its definition failed)."""
        with self._lock:
            self._pools.pop(pool, None)

    def units(self, pool: str) -> int:
        """How many lease units ``pool`` has (0: not served here)."""
        concurrency = self._pools.get(pool)
        return 0 if concurrency is None else units(concurrency)

    @property
    def held(self) -> dict[Where, int]:
        """The leases held, by ``(pool, unit)``: each one's epoch."""
        return {where: lease.epoch for where, lease in self._held.items()}

    def snapshot(self) -> Held:
        """What is held now, for :meth:`restore`."""
        return self._held

    def restore(self, held: Held) -> None:
        """A renewal's transaction rolled back: the leases held are ``held`` again."""
        with self._lock:
            self._held = held

    def holds(self, txn: Txn, pool: str, index: int) -> bool:
        """Whether the store's lease of instance ``pool:index``'s unit names this worker at
        the epoch it took.

        An expired lease nobody took yet still does: its renewal extends it.
        """
        concurrency = self._pools.get(pool)
        if concurrency is None:
            return False
        return self.holds_unit(txn, pool, unit_of(index, concurrency))

    def holds_unit(self, txn: Txn, pool: str, unit: int) -> bool:
        """Whether the store's lease of ``pool``'s ``unit`` names this worker at its epoch."""
        lease = self._held.get((pool, unit))
        return lease is not None and txn.get(lease.key) == lease.sealed

    def renew(self, txn: Txn, now: float, busy: frozenset[Where] = frozenset()) -> Renewal:
        """One renewal at lease-clock time ``now`` (see the module's docstring). ``busy``: the
        instances not to take now (still stopping here since this worker lost them)."""
        with self._lock:
            return self._renew(txn, now, busy)

    def _renew(self, txn: Txn, now: float, busy: frozenset[Where]) -> Renewal:
        me = self.worker
        until = now + self.ttl
        put_presence(txn, me.owner, PresenceRecord(me.pid, me.host, until))
        owners = [me.owner]  # the live workers'
        gone = []
        for owner, presence in list(all_presences(txn)):
            if owner == me.owner:
                continue
            if presence.expires_at > now:
                owners.append(owner)
            else:  # a dead (or hung) worker's: it writes it again if it wakes
                delete_presence(txn, owner)
                gone.append((owner, presence))
        damage = damaged_presences(txn)
        for error in damage:  # whose, and until when, is unknown: as an expired one
            txn.delete(error.key)
        live, rank = len(owners), sorted(owners).index(me.owner)
        renewal = Renewal(live=live, gone=gone, damaged=damage)
        held = dict(self._held)
        for (pool, unit), lease in sorted(held.items()):
            if self.holds_unit(txn, pool, unit):
                record = LeaseRecord(me.owner, me.pid, me.host, lease.epoch, until)
                held[(pool, unit)] = lease._replace(sealed=put_lease(txn, pool, unit, record))
            else:
                renewal.lost.append((pool, unit))
                del held[(pool, unit)]
                self._releasing.discard((pool, unit))
        busy = busy.union(renewal.lost)  # (a damaged lease is lost and free at once)
        for pool, concurrency in sorted(self._pools.items()):
            count = units(concurrency)
            fair = count if self.exclusive else fair_share(pool, count, live, rank)
            mine = sorted(unit for p, unit in held if p == pool)
            staying = [u for u in mine if (pool, u) not in self._releasing]
            if len(staying) > fair:
                for unit in staying[fair:]:
                    self._releasing.add((pool, unit))
                    renewal.release.append((pool, unit))
                continue
            wanted = fair - len(mine) if self._taking else 0
            for unit in range(count):
                if wanted <= 0:
                    break
                if (pool, unit) in held or (pool, unit) in busy:
                    continue
                taken = self._take(txn, pool, unit, now, until, renewal.damaged)
                if taken is not None:
                    held[(pool, unit)] = taken[1]
                    renewal.taken.append(taken[0])
                    wanted -= 1
        self._held = held
        return renewal

    def _take(
        self,
        txn: Txn,
        pool: str,
        unit: int,
        now: float,
        until: float,
        damage: list[DamagedRecordError],
    ) -> tuple[Taken, _Held] | None:
        """Take the lease of ``pool``'s ``unit`` if it is free or expired (any, if exclusive).

        A damaged lease is taken as an expired one of an unknown worker: its bytes
        are no worker's any more, so whoever held it commits nothing through it.
        """
        me = self.worker
        try:
            record = get_lease(txn, pool, unit)
        except DamagedRecordError as error:
            damage.append(error)
            record = LeaseRecord("", 0, "", 0, now)
        if record is None:
            epoch, expired = 1, False
        elif self.exclusive:
            epoch, expired = record.epoch + 1, False
        elif record.expires_at <= now:
            epoch, expired = record.epoch + 1, record.owner != me.owner
        else:
            return None
        record = LeaseRecord(me.owner, me.pid, me.host, epoch, until)
        sealed = put_lease(txn, pool, unit, record)
        return Taken(pool, unit, epoch, expired), _Held(epoch, lease_key(pool, unit), sealed)

    def release(self, txn: Txn, pool: str, unit: int) -> None:
        """Give up the lease of ``pool``'s ``unit`` (its instances have stopped): deleted
        if still ours."""
        with self._lock:
            if self.holds_unit(txn, pool, unit):
                delete_lease(txn, pool, unit)
            held = dict(self._held)
            held.pop((pool, unit), None)
            self._held = held
            self._releasing.discard((pool, unit))

    def leave(self, txn: Txn, keep: Iterable[tuple[str, int]] = ()) -> None:
        """Delete every lease held but those of the units of the instances ``keep`` (``(pool,
        index)``: left to expire), and the presence."""
        with self._lock:
            kept = {
                (pool, unit_of(index, self._pools[pool]))
                for pool, index in keep
                if pool in self._pools
            }
            for pool, unit in sorted(self._held):
                if (pool, unit) not in kept and self.holds_unit(txn, pool, unit):
                    delete_lease(txn, pool, unit)
            self._held = {where: h for where, h in self._held.items() if where in kept}
            self._releasing.clear()
            delete_presence(txn, self.worker.owner)


def fair_share(pool: str, count: int, live: int, rank: int) -> int:
    """How many of ``pool``'s ``count`` lease units the live worker ``rank`` (its place
    among the live workers' owner ids, sorted) aims at: ``count // live``, and one more
    for ``count % live`` of the workers, so that the shares add up to ``count`` (3
    workers on 4 units serve 2, 1 and 1). Which workers take one more turns with the
    pool (a stable hash of its name), so that over several pools they even out."""
    base, extra = divmod(count, live)
    return base + int((rank - stable_hash(pool)) % live < extra)
