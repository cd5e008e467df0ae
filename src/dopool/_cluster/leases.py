"""Leases: which worker process serves which instance, decided in the store.

Several worker processes may serve one store (``Runtime(path, shared=True)``); each
instance is served by the one whose **lease** names it (``L <pool>:<index>`` →
owner id, pid, host, epoch, expires_at), and each live worker keeps a **presence**
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
3. per pool, with ``fair`` its share (:func:`fair_share`: the instances split as
   evenly as they go among the live workers): holding more than ``fair``, it names
   the excess to **release** (its instances stop gracefully, then
   :meth:`LeaseBook.release` deletes the lease); holding fewer, it **takes** free
   leases and expired ones, up to ``fair``. A lease taken over from another
   worker after it expired gets ``epoch + 1``, and its instance's recovery counts a
   restart.

An exclusive runtime (the default ``Runtime(path)``) holds the store's exclusive lock,
so no other worker lives: it takes every lease of its pools at once, stale ones too.

**Fencing**: every write transaction of a shared worker's instance first checks
(:meth:`LeaseBook.holds`) that the lease still names this worker and the epoch it
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
from dopool._errors import ConfigurationError, DamagedRecordError
from dopool._store.layout import (
    LeaseRecord,
    PresenceRecord,
    all_presences,
    damaged_presences,
    delete_lease,
    delete_presence,
    get_lease,
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
    """The owner id ``pool:index``'s lease names, for a wake-up; None if none (or damaged:
    ``dopool check`` reports it, and the poll wakes the instance)."""
    try:
        record = get_lease(txn, pool, index)
    except DamagedRecordError:
        return None
    return None if record is None else record.owner


Where = tuple[str, int]  # (pool, index)


@dataclass(frozen=True, slots=True)
class Taken:
    """A lease taken at a renewal: its instance starts here, recovering from the store."""

    pool: str
    index: int
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
    """This worker's leases: what it holds (and each one's epoch), decided in transactions.

    ``exclusive``: the runtime holds the store exclusively, so it takes every lease
    of its pools whoever's record is there. Its methods run in a write transaction
    the caller gives; :meth:`holds` may run on any thread (it reads a dict).
    """

    def __init__(self, worker: Worker, ttl: float, *, exclusive: bool) -> None:
        self.worker = worker
        self.ttl = ttl
        self.exclusive = exclusive
        self._pools: dict[str, int] = {}  # concurrency, by pool
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

    @property
    def held(self) -> dict[Where, int]:
        """The leases held, by instance: each one's epoch."""
        return {where: lease.epoch for where, lease in self._held.items()}

    def snapshot(self) -> Held:
        """What is held now, for :meth:`restore`."""
        return self._held

    def restore(self, held: Held) -> None:
        """A renewal's transaction rolled back: the leases held are ``held`` again."""
        with self._lock:
            self._held = held

    def holds(self, txn: Txn, pool: str, index: int) -> bool:
        """Whether the store's lease of ``pool:index`` names this worker at the epoch it took.

        An expired lease nobody took yet still does: its renewal extends it.
        """
        lease = self._held.get((pool, index))
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
        for (pool, index), lease in sorted(held.items()):
            if self.holds(txn, pool, index):
                record = LeaseRecord(me.owner, me.pid, me.host, lease.epoch, until)
                held[(pool, index)] = lease._replace(sealed=put_lease(txn, pool, index, record))
            else:
                renewal.lost.append((pool, index))
                del held[(pool, index)]
                self._releasing.discard((pool, index))
        busy = busy.union(renewal.lost)  # (a damaged lease is lost and free at once)
        for pool, concurrency in sorted(self._pools.items()):
            fair = concurrency if self.exclusive else fair_share(pool, concurrency, live, rank)
            mine = sorted(index for p, index in held if p == pool)
            staying = [i for i in mine if (pool, i) not in self._releasing]
            if len(staying) > fair:
                for index in staying[fair:]:
                    self._releasing.add((pool, index))
                    renewal.release.append((pool, index))
                continue
            wanted = fair - len(mine) if self._taking else 0
            for index in range(concurrency):
                if wanted <= 0:
                    break
                if (pool, index) in held or (pool, index) in busy:
                    continue
                taken = self._take(txn, pool, index, now, until, renewal.damaged)
                if taken is not None:
                    held[(pool, index)] = taken[1]
                    renewal.taken.append(taken[0])
                    wanted -= 1
        self._held = held
        return renewal

    def _take(
        self,
        txn: Txn,
        pool: str,
        index: int,
        now: float,
        until: float,
        damage: list[DamagedRecordError],
    ) -> tuple[Taken, _Held] | None:
        """Take ``pool:index``'s lease if it is free or expired (any, if exclusive).

        A damaged lease is taken as an expired one of an unknown worker: its bytes
        are no worker's any more, so whoever held it commits nothing through it.
        """
        me = self.worker
        try:
            record = get_lease(txn, pool, index)
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
        sealed = put_lease(txn, pool, index, record)
        return Taken(pool, index, epoch, expired), _Held(epoch, lease_key(pool, index), sealed)

    def release(self, txn: Txn, pool: str, index: int) -> None:
        """Give up ``pool:index``'s lease (its instance has stopped): deleted if still ours."""
        with self._lock:
            if self.holds(txn, pool, index):
                delete_lease(txn, pool, index)
            held = dict(self._held)
            held.pop((pool, index), None)
            self._held = held
            self._releasing.discard((pool, index))

    def leave(self, txn: Txn, keep: Iterable[Where] = ()) -> None:
        """Delete every lease held but those in ``keep`` (left to expire), and the presence."""
        kept = set(keep)
        with self._lock:
            for pool, index in sorted(self._held):
                if (pool, index) not in kept and self.holds(txn, pool, index):
                    delete_lease(txn, pool, index)
            self._held = {where: h for where, h in self._held.items() if where in kept}
            self._releasing.clear()
            delete_presence(txn, self.worker.owner)


def fair_share(pool: str, concurrency: int, live: int, rank: int) -> int:
    """How many of ``pool``'s instances the live worker ``rank`` (its place among the
    live workers' owner ids, sorted) aims at: ``concurrency // live``, and one more for
    ``concurrency % live`` of the workers, so that the shares add up to ``concurrency``
    (3 workers on 4 instances serve 2, 1 and 1). Which workers take one more turns with
    the pool (a stable hash of its name), so that over several pools they even out."""
    base, extra = divmod(concurrency, live)
    return base + int((rank - stable_hash(pool)) % live < extra)
