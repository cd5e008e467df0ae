"""A producer process of a multi-process chaos run.

    python -m dopool._chaos.procs.producer STORE SEED PRODUCER ROOT

It connects to the store (``dopool.connect``) and sends producer ``PRODUCER``'s stream
of the plan of ``SEED`` (:mod:`.plan`), one call after another: it records each id it
is about to send, then each answer, in ``ROOT/producer-<PRODUCER>.log``
(:mod:`.records`) before it counts it, and only then writes one byte per
acknowledged event to stdout, which the runner counts as progress. Exits 0 when the
stream is sent; an enqueue that raises (the plan sends nothing a pool would refuse)
is recorded and ends the process with its traceback.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

from dopool._chaos.procs.app import DUMP
from dopool._chaos.procs.plan import POOL, Send, draw
from dopool._chaos.procs.records import Record, producer_log
from dopool._connect import ProducerPool, connect
from dopool._errors import DopoolError
from dopool._types import EnqueueResult

ACKNOWLEDGED = b"a"


def produce(store: Path, seed: int, producer: int, root: Path) -> None:
    plan = draw(seed)
    record = Record(producer_log(root, producer))
    with connect(store, durability=plan.durability) as connection:
        pool = connection.pool(POOL, dedup_window=plan.dedup_window)
        for send in plan.streams[producer]:
            for ident in send.ids:
                record.line("T", ident)
            try:
                results = _send(pool, send)
            except DopoolError as exc:  # the plan sends nothing a pool refuses: a failure
                for ident in send.ids:
                    record.line("R", ident, type(exc).__name__)
                raise
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
    faulthandler.register(DUMP, all_threads=True)  # a stuck run's stacks, in its .err file
    store, seed, producer, root = sys.argv[1:5]
    produce(Path(store), int(seed), int(producer), Path(root))
