"""Producers' calls stored by the owner of their instances, in one transaction.

The owner of a store's instances takes producers' enqueues (owner_wire ``Request``s)
from two places: its call socket (``_engine/owner_calls.py``), where local producers
send them, and a Ray shard host (``_ray/host.py``), where producers anywhere in a Ray
cluster do. Both hand each batch of requests to a :class:`CallStore`, which stores
their calls in one write transaction of the runtime's committer, each with its call
record (:mod:`dopool._store.layout.calls`), and answers them once that is durable.

A call into an instance that runs here and is free is made by the instance's own
enqueue body (:meth:`DirectEnqueue.take`, its turn held), nested in that transaction:
its event starts in the same commit, as an enqueue made in this process does, with no
alarm and no second commit. Any other call (its instance busy or not running, or its
body rolled back: the instance then crashes, as a failed enqueue crashes it) is stored
as a producer stores it (:meth:`StoredCalls.store_in`, the meta read anew), and its
instance is told once the commit is made.

A call already recorded (stored before: by its producer, or by this owner for a try
whose answer never arrived) is answered from its record and not stored again. A call
is answered nil when its pool is not defined here, its instance is not served here, its
share is refused (a full queue: the refusal is handed back to a caller that asks), or
the transaction fails.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from functools import partial

from dopool._clock.clocks import Clock
from dopool._cluster.owner_wire import Call, Request, Results
from dopool._cluster.remote import Share
from dopool._engine.direct import DirectBody, DirectEnqueue
from dopool._engine.messages import CallMark
from dopool._engine.stored import StoredCalls
from dopool._errors import DopoolError
from dopool._machine.types import Item, Started
from dopool._store.environment import Store
from dopool._store.layout import (
    CALL_RETAIN,
    Meta,
    forget_calls,
    record_call,
    stored_call,
    sweep_calls,
)
from dopool._store.txn import Txn
from dopool._types import EnqueueResult, PoolEvent

logger = logging.getLogger("dopool")

#: Seconds between two sweeps of the call records that dead producers left.
SWEEP_EVERY = 60.0
#: The producers whose answered calls a CallStore remembers (``CallStore._stale``).
_PRODUCERS_KEPT = 65_536

# A call taken by a running, free instance of a pool, its turn held: the instance's own
# enqueue body, which starts the first due event in the same commit, run nested in the
# owner's transaction (``WorkerPool.take_call``); None if it cannot be made so.
Take = Callable[[int, tuple[Item, ...], CallMark], tuple[DirectEnqueue, DirectBody] | None]

#: Each request's answers: its calls' numbers and results (None: not stored here).
Answers = list[list[tuple[int, Results]]]
#: The refused calls, by (the request's position in the batch, the call's number).
Refusals = dict[tuple[int, int], DopoolError]


class Served:
    """What the owner needs of one of the runtime's pools."""

    __slots__ = ("serves", "stored", "take")

    def __init__(self, stored: StoredCalls, serves: Callable[[int], bool], take: Take) -> None:
        self.stored = stored
        self.serves = serves  # whether an instance (in range) is served here
        self.take = take


class CallStore:
    """Stores batches of producers' requests (see the module docstring). Thread-safe:
    each batch is its own transaction, and batches from several threads share the
    committer's group commit."""

    def __init__(self, clock: Clock, store: Store, pools: Callable[[str], Served | None]) -> None:
        self._clock = clock
        self._store = store
        self._pools = pools
        self._swept = time.monotonic()
        self._lock = threading.Lock()
        # Each producer's highest ``done_below`` seen, most recent last: a call numbered
        # below it was answered already (see :meth:`_stale`).
        self._answered: dict[bytes, int] = {}

    def store(self, requests: list[Request], refused: Refusals | None = None) -> Answers:
        """Store the requests' calls in one transaction; each request's answers, in order.

        ``refused``, if given, receives the error of each call whose share was refused
        (answered nil, nothing stored)."""
        answers: list[dict[int, Results]] = [
            dict.fromkeys(c.number for c in r.calls) for r in requests
        ]
        stale = self._stale(requests)
        todo = [
            (number, request, call, served)
            for number, request in enumerate(requests)
            for call in request.calls
            if (request.producer, call.number) not in stale
            and (served := self._target(call)) is not None
        ]
        if todo:
            self._commit(requests, todo, answers, refused)
        elif self._sweep_due():
            with suppress(Exception):  # the next sweep tries again
                self._store.transact(partial(sweep_calls, before=self._clock.now() - CALL_RETAIN))
        return [list(found.items()) for found in answers]

    def _commit(
        self,
        requests: list[Request],
        todo: list[tuple[int, Request, Call, Served]],
        answers: list[dict[int, Results]],
        refused: Refusals | None,
    ) -> None:
        now = self._clock.now()
        stored: list[tuple[Served, Share]] = []
        events: dict[StoredCalls, list[PoolEvent]] = {}
        refusals: Refusals = {}
        sweep = self._sweep_due()
        # A call into an instance running here and free is made by the instance's own
        # enqueue body, nested in this transaction: its event starts in this commit (no
        # alarm, no second commit). Any other is stored as a producer stores it, and its
        # instance told once this commits; so is one whose body raised (rolled back alone).
        taken: dict[tuple[int, int], tuple[DirectEnqueue, DirectBody]] = {}
        made: dict[tuple[int, int], tuple[Meta, Started | None] | Exception] = {}
        for number, request, call, served in todo:
            mark = CallMark(request.producer, call.number, request.done_below)
            if (pair := served.take(call.instance, call.items, mark)) is not None:
                taken[number, call.number] = pair

        def body(txn: Txn) -> None:
            for request in requests:
                forget_calls(txn, request.producer, request.done_below)
            if sweep:
                sweep_calls(txn, now - CALL_RETAIN)
            for number, request, call, served in todo:
                pair = taken.get((number, call.number))
                if pair is not None:
                    try:
                        made[number, call.number] = self._store.nested(txn, pair[1])
                        continue  # its body answered from the call's record, if any
                    except Exception as exc:
                        made[number, call.number] = exc
                record = stored_call(txn, request.producer, call.number)
                if record is not None:  # stored before: by the producer, or an earlier try
                    answers[number][call.number] = record.results
                    continue
                pool = served.stored
                share = pool.store_in(txn, call.instance, call.items, now, events[pool])
                if isinstance(share.answer, DopoolError):
                    refusals[number, call.number] = share.answer
                    continue  # refused, nothing stored: the producer's own call says why
                record_call(txn, request.producer, call.number, now, share.answer)
                answers[number][call.number] = _fields(share.answer)
                stored.append((served, share))

        try:
            # Each pool's events published once committed, one writer at a time while
            # anybody listens (so in the order of the commits); the pools in one order.
            with ExitStack() as publishing:
                for pool in sorted({served.stored for *_, served in todo}, key=id):
                    events[pool] = publishing.enter_context(pool.publishing())
                self._store.transact(body)
        except BaseException as exc:
            for direct, _ in taken.values():  # nothing of theirs committed
                with suppress(BaseException):  # (``exc`` is raised or logged below)
                    direct.failed(exc)
            if not isinstance(exc, Exception):
                raise
            self._failed(answers)
            return
        for key, (direct, _) in taken.items():
            result = made[key]
            number, call_number = key
            if isinstance(result, Exception):
                # Its body raised: the call was stored as a producer's above; the turn goes
                # back, and the instance crashes if it must.
                with suppress(Exception):
                    direct.failed(result)
                continue
            try:
                answers[number][call_number] = _fields(direct.committed(result))
            except DopoolError as error:  # the call's refusal (a full queue): nothing stored
                refusals[key] = error
            except Exception:  # a publication that raised: nil, its producer finds its record
                logger.exception("a producer's call stored here could not be published")
        try:
            if any(request.sync for request in requests) and not self._store.durable:
                self._store.flush()
        except Exception:
            self._failed(answers)
            return
        if refused is not None:
            refused.update(refusals)
        for served, share in stored:
            served.stored.written(share.instance, share.alarm, now, share.owner)

    @staticmethod
    def _failed(answers: list[dict[int, Results]]) -> None:
        """The calls may not be stored here: every one answered nil (the producers store
        them, answered from their records if they were)."""
        logger.exception("producers' calls could not be stored here; they store them")
        for found in answers:
            found.update(dict.fromkeys(found))

    def _stale(self, requests: list[Request]) -> set[tuple[bytes, int]]:
        """The calls of ``requests`` their producer was answered for already, by a try
        that overtook this one: numbered below a ``done_below`` it sent since, which it
        only raises past a call once that call is answered, and beneath which its
        records may be gone. Answered nil, never stored again. (A try that lingered in
        Ray's queue while the producer's next try was answered, say.) Kept in memory
        for the last :data:`_PRODUCERS_KEPT` producers: a try from before this process
        started died with the one it was sent to."""
        with self._lock:
            answered = self._answered
            for request in requests:  # (a request's own calls are never below its own)
                below = max(request.done_below, answered.pop(request.producer, 0))
                answered[request.producer] = below
            while len(answered) > _PRODUCERS_KEPT:
                del answered[next(iter(answered))]
            return {
                (request.producer, call.number)
                for request in requests
                for call in request.calls
                if call.number < answered.get(request.producer, 0)
            }

    def _target(self, call: Call) -> Served | None:
        served = self._pools(call.pool)
        if served is None or not served.serves(call.instance):
            return None
        return served

    def _sweep_due(self) -> bool:
        now = time.monotonic()
        if now - self._swept < SWEEP_EVERY:
            return False
        self._swept = now
        return True


def _fields(results: list[EnqueueResult]) -> list[tuple[int, int, int, bool]]:
    """Results as an answer carries them."""
    return [(r.instance_index, r.sequence, r.position, r.duplicate) for r in results]
