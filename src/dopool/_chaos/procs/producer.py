"""A producer process of a multi-process chaos run.

    python -m dopool._chaos.procs.producer STORE SEED PRODUCER ROOT

It connects to the store (``dopool.connect``) and sends producer ``PRODUCER``'s stream
of the plan of ``SEED`` (:mod:`.plan`), one call after another: it records each id it
is about to send, then each answer, in ``ROOT/producer-<PRODUCER>.log``
(:mod:`.records`) before it counts it, and only then writes one byte per
acknowledged event to stdout, which the runner counts as progress. Exits 0 when the
stream is sent.

An enqueue that raises a :class:`~dopool.DopoolError` stored nothing: its events are
recorded as refused (not acknowledged), with when the call began and raised, and the
stream goes on. The plan sends nothing a pool would refuse, but a producer gives up
waiting for the store's writer lock after its ``lock_timeout`` (``StoreBusyError``)
while a frozen process holds it: the checker excuses that refusal, and no other. An
``enqueue_many`` that raised after storing part of its batch (``stored``) cannot say
which of its events were stored: it ends the process with its traceback, as any
other exception does.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
from pathlib import Path

from dopool._chaos.procs.app import DUMP, die_with
from dopool._chaos.procs.plan import POOL, Send, draw
from dopool._chaos.procs.records import Record, producer_log
from dopool._errors import DopoolError
from dopool._handles.connection import DEFAULT_LOCK_TIMEOUT, ProducerPool, connect
from dopool._types import EnqueueResult

ACKNOWLEDGED = b"a"


def produce(store: Path, seed: int, producer: int, root: Path) -> None:
    plan = draw(seed)
    record = Record(producer_log(root, producer))
    lock_timeout = DEFAULT_LOCK_TIMEOUT if plan.lock_timeout is None else plan.lock_timeout
    with connect(
        store, durability=plan.durability, lock_timeout=lock_timeout, via_owner=plan.via_owner
    ) as connection:
        pool = connection.pool(POOL, dedup_window=plan.dedup_window)
        for send in plan.streams[producer]:
            for ident in send.ids:
                record.line("T", ident)
            called = time.monotonic_ns()
            try:
                results = _send(pool, send)
            except DopoolError as exc:
                raised = time.monotonic_ns()
                error = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                for ident in send.ids:
                    record.line("R", ident, called, raised, error)
                if exc.stored:
                    raise
                continue
            for ident, result in zip(send.ids, results, strict=True):
                duplicate = int(result.duplicate)
                record.line("A", ident, result.instance_index, result.sequence, duplicate)
            os.write(sys.stdout.fileno(), ACKNOWLEDGED * len(results))
    record.close()


def _send(pool: ProducerPool, send: Send) -> list[EnqueueResult]:
    events = [{"id": ident} for ident in send.ids]
    if send.batch:
        return pool.enqueue_many(
            events,
            partition_key=send.partition_key,
            priority=send.priority,
            delay=send.delay,
            dedup_keys=send.dedup_keys,
        )
    return [
        pool.enqueue(
            events[0],
            partition_key=send.partition_key,
            priority=send.priority,
            delay=send.delay,
            dedup_key=send.dedup_keys[0],
        )
    ]


if __name__ == "__main__":
    die_with(int(os.environ["DOPOOL_CHAOS_PARENT"]))  # never left stopped, nor running
    faulthandler.register(DUMP, all_threads=True)  # a stuck run's stacks, in its .err file
    store, seed, producer, root = sys.argv[1:5]
    produce(Path(store), int(seed), int(producer), Path(root))
