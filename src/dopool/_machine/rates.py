"""The queue machine's rate limits: tokens taken in the transaction that starts an attempt.

A pool's bucket (``rate_limit``) is one store-wide record (``R <pool>``), not an
instance's: the limit spans the pool's instances, and every process that serves them.
It costs no lock of its own, since every start is a write transaction and LMDB runs one
at a time; it costs a read and a write of one small record per start, and the record's
page is shared by the pool's instances. A partition key's bucket (``rate_limit_per_key``)
is in the namespace of the one instance that starts its key's events
(:class:`~dopool._store.layout.KeyBuckets`), so it costs no more than its records.

A start takes a token from each bucket that applies, or from none: an instance that
finds one empty starts nothing, notes when to try again (``Meta.throttled_until``), which
keeps its alarm from being set sooner (:func:`dopool._machine.alarm.rearm`), and tries
then. The event waits; it never fails for it. Every start checks the buckets at its own
clock reading, so the bound of each limit holds whatever the order of those readings
(docs/guarantees.md, "Rate limits").

Instances waiting for the pool's tokens take turns, first come first served: one that
finds no token, or finds others waiting, **books** the next turn (the bucket's
``booked_until`` moves on by a token's interval) and tries at its turn, before which
nobody new may take a token. So each token goes to the instance that waited longest,
and each waiter wakes once for it, not all of them for every token. A turn is only a
time to try: the token is still checked then, and one an instance misses (it was busy
or paused, say) goes to whoever asks after. A partition key's bucket has one waiter at
most, its instance, so it needs no turns.
"""

from __future__ import annotations

import logging

from dopool._errors import DamagedRecordError
from dopool._rates import RateLimit
from dopool._store.layout import KeyBuckets, Meta, Namespace, RateRecord, get_rate, put_rate
from dopool._store.txn import Txn

logger = logging.getLogger("dopool")


class Throttle:
    """Takes the tokens a start needs of a pool's rate limits, or says when they come."""

    __slots__ = ("_buckets", "_per_key", "_pool", "_pool_limit")

    def __init__(
        self,
        pool: str,
        namespace: Namespace,
        limit: RateLimit | None,
        per_key: RateLimit | None,
    ) -> None:
        self._pool = pool
        self._pool_limit = limit
        self._per_key = per_key
        self._buckets = KeyBuckets(namespace)

    def take(self, txn: Txn, meta: Meta, now: float, partition_key: str | None) -> bool:
        """Take the tokens a start at ``now`` of an event of ``partition_key`` needs;
        whether there were. If not, nothing is taken (a turn may be booked), and the
        meta's ``throttled_until`` says when to try again."""
        waits: list[float] = []
        pool: RateRecord | None = None
        key_tat = key_was = None
        limit = self._pool_limit
        if limit is not None:
            pool, wait = self._take_pool(txn, limit, meta, now)
            if wait is not None:
                waits.append(wait)
        per_key = self._per_key
        if per_key is not None and partition_key is not None:
            self._buckets.sweep(txn, now)
            key_was = self._key_bucket(txn, partition_key)
            key_tat, wait = per_key.take(key_was, now)
            if wait is not None:
                waits.append(wait)
        if waits:
            meta.throttled_until = max(waits)
            return False
        if pool is not None:
            put_rate(txn, self._pool, pool)
        if key_tat is not None and partition_key is not None:
            self._buckets.put(txn, partition_key, key_tat, key_was)
        meta.throttled_until = None
        return True

    def _take_pool(
        self, txn: Txn, limit: RateLimit, meta: Meta, now: float
    ) -> tuple[RateRecord | None, float | None]:
        """The pool's bucket after a start at ``now`` and None, or, if it must wait, when
        to try again (its turn, booked and stored here, or the next token)."""
        turn = meta.throttled_until
        if turn is not None and turn > now:  # woken before its turn (a schedule's fire,
            return None, turn  # say): it keeps the turn it has, and books none after it
        found = self._pool_bucket(txn)
        tat, booked = (None, None) if found is None else found
        its_turn = turn is not None  # it booked, and its turn has come
        new_tat, wait = limit.take(tat, now)
        others_first = booked is not None and booked > now and not its_turn
        if wait is None and not others_first:
            return RateRecord(new_tat, booked), None
        if its_turn and wait is not None:  # a late turn: the next token, still ahead
            return None, wait
        slot = max(now if wait is None else wait, now if booked is None else booked)
        put_rate(txn, self._pool, RateRecord(tat, slot + limit.interval))
        return None, slot

    def _pool_bucket(self, txn: Txn) -> RateRecord | None:
        try:
            return get_rate(txn, self._pool)
        except DamagedRecordError as damage:
            # A bucket cannot be rebuilt: taken as full and with nobody booked (at most
            # ``burst`` starts more than the limit lets, once), and written sound again.
            logger.error("%s; taken as full", damage)
            return None

    def _key_bucket(self, txn: Txn, partition_key: str) -> float | None:
        try:
            return self._buckets.get(txn, partition_key)
        except DamagedRecordError as damage:  # as the pool's; its old expiry is swept
            logger.error("%s; taken as full", damage)
            return None
