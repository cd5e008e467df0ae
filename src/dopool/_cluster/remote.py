"""Enqueues into instances this process does not serve, stored as a producer stores them.

A producer (:mod:`dopool._handles.connection`) has no instance at all; a shared worker has none
for the instances other workers hold the leases of. Both store an event for such an
instance the same way: the queue machine's enqueue transition
(:meth:`QueueMachine.enqueue`) made in the caller's own write transaction, the
instance's meta read anew from the store; once it is durable, the worker serving the
instance is woken. Nothing here waits for an actor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, NamedTuple

from dopool._clock.clocks import Clock
from dopool._cluster.leases import lease_owner
from dopool._cluster.routing import Positions, pick, place
from dopool._errors import DopoolError
from dopool._machine.machine import QueueMachine
from dopool._machine.types import Effects, Item, QueueRules, Request
from dopool._store.environment import Store
from dopool._store.txn import Txn
from dopool._types import EnqueueResult, PoolEvent
from dopool.chaos import FaultInjector

Verb = Literal["pause", "resume", "drain"]


class Share(NamedTuple):
    """One instance's share of a batch as stored."""

    instance: int
    positions: Positions  # in the batch
    answer: list[EnqueueResult] | DopoolError  # its results, or what refused it (storing nothing)
    owner: str | None  # whom to wake: the worker its lease names
    alarm: float | None  # its alarm slot as the transaction left it
    # An attempt was running (its start committed, its outcome not): the outcome's
    # commit, which reads the store anew and re-arms the alarm slot, takes the share's
    # events up, and a wake-up would cost the owner a message for nothing. Should that
    # attempt never end there (its process died), the instance's next recovery does.
    busy: bool


def store_shares(
    txn: Txn,
    pool: str,
    machine: Callable[[int], QueueMachine],
    items: tuple[Item, ...],
    groups: dict[int, Positions],
    now: float,
    events: list[PoolEvent] | None = None,
    *,
    owners: bool = True,
) -> list[Share]:
    """Store each instance's share of ``items`` in ``txn``, as its own runtime would, and
    read whom to wake from its lease in ``txn`` (unless not ``owners``: the caller's own
    runtime serves it). ``machine(index)``: instance ``index`` of ``pool``'s queue machine.
    ``events``: where the pool events of the shares stored go, to publish once committed
    (a machine that listens makes them)."""
    shares: list[Share] = []
    for index, positions in groups.items():
        queue = machine(index)
        meta = queue.namespace.load_meta(txn)
        effects = Effects()
        queue.enqueue(txn, meta, [(index, pick(items, positions))], now, effects)
        answer = effects.answers[0][1]
        if not isinstance(answer, DopoolError):  # a refused share changes nothing
            queue.namespace.save_meta(txn, meta)
            if events is not None:
                events.extend(effects.events)
        owner = lease_owner(txn, pool, index) if owners else None
        shares.append(Share(index, positions, answer, owner, meta.alarm, meta.running))
    return shares


def settle(
    shares: list[Share], results: list[Any], wake: Callable[[int, str | None], None]
) -> DopoolError | None:
    """Once the shares are durable: wake each instance written but one mid-attempt (see
    :class:`Share`), put its results in place; the first refusal, if any."""
    failure: DopoolError | None = None
    for index, positions, answer, owner, _alarm, busy in shares:
        if isinstance(answer, DopoolError):
            failure = failure or answer
            continue
        if not busy:
            wake(index, owner)
        place(results, positions, answer)
    return failure


class Away:
    """A shared worker's enqueues into its pool's instances that other workers serve.

    Their shares are stored in one write transaction of the runtime's store, under the
    store's writer lock, as a producer stores them; each worker serving one is woken,
    by the owner id the routing table names (read from the lease if it names none).
    """

    __slots__ = ("_clock", "_machines", "_pool", "_rules", "_store", "_wake")

    def __init__(
        self,
        store: Store,
        clock: Clock,
        pool: str,
        rules: QueueRules,
        wake: Callable[[str, int, str | None], None],
    ) -> None:
        self._store = store
        self._clock = clock
        self._pool = pool
        self._rules = rules
        self._wake = partial(wake, pool)
        self._machines: dict[int, QueueMachine] = {}

    def _machine(self, index: int) -> QueueMachine:
        machine = self._machines.get(index)
        if machine is None:
            machine = producer_machine(self._pool, index, self._rules)
            self._machines[index] = machine
        return machine

    def enqueue(
        self, items: tuple[Item, ...], groups: dict[int, Positions], results: list[Any]
    ) -> DopoolError | None:
        """Store each group's items on its instance; their results go in ``results``, at
        their positions. The first share refused, if any (it stored nothing). The worker
        woken for each is the one its lease names in the same transaction, not the
        routing table's: a table a moment old can name this worker, which just released
        the instance, and the wake-up would go nowhere until the next poll."""
        now = self._clock.now()
        with self._store.write() as txn:
            shares = store_shares(txn, self._pool, self._machine, items, groups, now)
        return settle(shares, results, self._wake)

    def control(self, verb: Verb, indices: list[int]) -> list[Changed]:
        """Pause, resume or drain these instances in one transaction (as ``dopool pause``
        does on a live store), then wake the worker serving each one changed."""
        now = self._clock.now()
        with self._store.write() as txn:
            answers = [transition(txn, self._machine(i), i, verb, now) for i in indices]
            owners = [lease_owner(txn, self._pool, answer.index) for answer in answers]
        for answer, owner in zip(answers, owners, strict=True):
            if answer.changed:
                self._wake(answer.index, owner)
        return answers

    def apply(self, index: int, request: Request) -> Any:
        """Make a caller's request's transition on instance ``index`` in the store, as a
        producer makes it (its pool events are the owner's to publish: none here), then
        wake the worker serving it, whose next transaction reads the meta anew."""
        machine = self._machine(index)
        with self._store.write() as txn:
            meta = machine.namespace.load_meta(txn)
            result = machine.control(txn, meta, request, self._clock.now(), Effects())
            machine.namespace.save_meta(txn, meta)
            owner = lease_owner(txn, self._pool, index)
        self._wake(index, owner)
        return result


@dataclass(frozen=True, slots=True)
class Changed:
    """What one instance's transaction did.

    Attributes:
        index: the instance.
        changed: whether its stored state changed (a pause of a paused one does not).
        drained: events a drain removed (0 for pause and resume).
        kept_running: a drain kept the event whose attempt was running.
    """

    index: int
    changed: bool
    drained: int = 0
    kept_running: bool = False


def transition(txn: Txn, machine: QueueMachine, index: int, verb: Verb, now: float) -> Changed:
    """Pause, resume or drain instance ``index`` (``machine``'s) in ``txn``, its meta read
    anew."""
    meta = machine.namespace.load_meta(txn)
    effects = Effects()  # its events are the owner's to publish: none here
    if verb == "drain":
        running = meta.running and meta.current is not None
        drained = machine.drain(txn, meta, now, effects)
        changed = Changed(index, True, drained, kept_running=running)
    else:
        paused = machine.set_paused(meta, verb == "pause", now, effects)
        changed = Changed(index, paused)
    if changed.changed:
        machine.namespace.save_meta(txn, meta)
    return changed


def cancel_in(txn: Txn, machine: QueueMachine, sequence: int, now: float) -> bool:
    """Cancel event ``sequence`` of ``machine``'s instance in ``txn``, its meta read anew
    (unless it is running or finished: its ``running`` flag is committed before its
    handler starts); whether it was. Its pool event is the owner's to publish: none here."""
    meta = machine.namespace.load_meta(txn)
    cancelled = machine.cancel(txn, meta, sequence, now, Effects())
    if cancelled:
        machine.namespace.save_meta(txn, meta)
    return cancelled


def producer_machine(
    pool: str, index: int, rules: QueueRules, listening: Callable[[], bool] | None = None
) -> QueueMachine:
    """The queue machine of instance ``index`` of ``pool``, for transactions made outside
    its actor: no retries, follow-ups nor faults; pool events only if ``listening()`` (a
    producer's has nobody subscribed)."""
    return QueueMachine(
        pool=pool,
        index=index,
        rules=rules,
        seed=None,
        route=_no_route,
        faults=FaultInjector(None, pool, index),
        fault_point=_no_fault,
        listening=_not_listening if listening is None else listening,
    )


def _no_route(_partition_key: str | None) -> int:
    raise AssertionError("a producer routes no follow-up")  # pragma: no cover


def _no_fault(_point: str, _fault: str | None = None) -> None:
    """A producer has no fault plan."""


def _not_listening() -> bool:
    return False
