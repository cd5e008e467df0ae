"""Live control from another process: pause, resume and drain, and a producer's cancel.

``dopool pause``, ``resume`` and ``drain`` act on a store whether or not a runtime
owns it. Each instance's change is the queue machine's own transition
(:meth:`QueueMachine.set_paused`, :meth:`QueueMachine.drain`), made in one LMDB
write transaction of a :class:`~dopool.Connection`, like a producer's enqueue:
LMDB serialises it with the owner's transactions, so it lands in order with the
instance's other changes, and it is durable when the call returns. Then the owner
is woken (:mod:`dopool._watch`), whose next transaction on the instance reads the
changed meta anew (its cached one no longer matches the stored bytes).

A producer's :meth:`~dopool.ProducerPool.cancel` is the same: the queue machine's
:meth:`QueueMachine.cancel`, in one transaction of the connection, then the owner woken.
An event whose attempt is running is not cancelled: the meta's ``running`` is committed
before its handler starts, so it is seen here.

A drained or cancelled event's dedup key is released as the owner's own drain releases
it, stamped with the finish (:data:`STAMP_WINDOW`); a cancelled event is remembered the
same way, for the owner's ``keep_finished`` (its lookups and sweeps judge the age).

What the owner keeps in memory needs nothing more. Every start of an attempt is
decided inside one of its write transactions from the meta as committed, so none
starts on an instance paused before (an attempt already running finishes, and its
outcome starts nothing after it). An alarm the owner set for an older slot fires,
reads the meta and does only what it says. A resume sets the slot due now, and
the wake-up (or, if lost, the poll) has the owner start the due work at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dopool._across import Changed, Verb, cancel_in, producer_machine, transition
from dopool._errors import ConfigurationError, PoolNotFoundError
from dopool._layout import get_pool, pool_records
from dopool._lifecycle import parse_event_id
from dopool._options import PoolOptions
from dopool._storage import Txn

if TYPE_CHECKING:  # the connection's pools call in here
    from dopool._connect import Connection

#: The dedup window a drain here releases keys with. The owner's is not stored, so the
#: drained events' keys are stamped with their finish rather than removed (what a window
#: of 0 does): the owner's lookups then hold each for its own window, whatever it is, and
#: its sweeps remove them after. This window only keeps this drain from sweeping any.
#: A cancel remembers its event with it as ``keep_finished``, for the same reason: the
#: record's finish is stamped, the owner forgets it after its own ``keep_finished``, and
#: no record the owner remembers is swept from here.
STAMP_WINDOW = 1e9
VERBS: tuple[Verb, ...] = ("pause", "resume", "drain")


def control(
    connection: Connection, pool: str, verb: Verb, index: int | None = None
) -> list[Changed]:
    """Pause, resume or drain ``pool``'s instance ``index`` (all when None) of the store.

    One transaction for all of them, durable when this returns; then the owner, if
    one listens, is told to wake each instance changed.

    Raises:
        PoolNotFoundError: no runtime ever defined the pool in this store.
        ConfigurationError: a bad verb, or an index of no instance.
        PoolClosedError: the connection is closed.
    """
    if verb not in VERBS:
        raise ConfigurationError(f"verb must be one of {', '.join(VERBS)}, got {verb!r}")
    connection.pool(pool)  # PoolNotFoundError if never defined
    options = PoolOptions(execute=_no_handler, dedup_window=STAMP_WINDOW)
    now = connection.now()

    def body(txn: Txn) -> list[Changed]:
        concurrency = get_pool(txn, pool) or 0
        indices = _chosen(pool, concurrency, index)
        answers = []
        for i in indices:
            answers.append(transition(txn, producer_machine(pool, i, options), i, verb, now))
        return answers

    answers = connection.write(pool, body)
    for answer in answers:
        if answer.changed:
            connection.notify(pool, answer.index)
    return answers


def cancel(connection: Connection, pool: str, event_id: str) -> bool:
    """Cancel event ``event_id`` of ``pool`` unless it is running or finished; whether it
    was. One transaction, durable when this returns; then the owner is woken.

    Raises:
        EventIdError: not an event id of this pool.
        PoolClosedError: the connection is closed.
    """
    options = PoolOptions(
        execute=_no_handler, dedup_window=STAMP_WINDOW, keep_finished=STAMP_WINDOW
    )
    now = connection.now()

    def body(txn: Txn) -> tuple[int, bool]:
        concurrency = get_pool(txn, pool)
        if concurrency is None:  # pool records are never removed: a store replaced
            known = sorted(pool_records(txn))
            raise PoolNotFoundError(path=str(connection.path), pool=pool, known=known)
        index, sequence = parse_event_id(event_id, pool, concurrency)
        return index, cancel_in(txn, producer_machine(pool, index, options), sequence, now)

    index, cancelled = connection.write(pool, body)
    if cancelled:
        connection.notify(pool, index)
    return cancelled


def _chosen(pool: str, concurrency: int, index: int | None) -> Sequence[int]:
    if index is None:
        return range(concurrency)
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigurationError(f"instance index must be an int, got {index!r}")
    if not 0 <= index < concurrency:
        raise ConfigurationError(
            f"pool {pool!r} has no instance {index} (concurrency {concurrency})"
        )
    return [index]


def _no_handler(_ctx: object) -> None:
    raise AssertionError("live control runs no handler")  # pragma: no cover
