"""The child processes of ``test_connect.py``: producers, and a runtime that owns the store.

Usage::

    python _connect_child.py produce STORE POOL PRODUCER COUNT
    python _connect_child.py own STORE POOL CONCURRENCY EXPECTED

``produce`` connects to STORE and enqueues COUNT events ``{"p": PRODUCER, "k": k,
"key": KEY}`` into POOL, ``k`` counting up: a third round-robin one at a time, a third
with the partition key ``KEY = "key-<k % 5>"``, and a third round-robin in batches of
``enqueue_many``. It prints one JSON line per acknowledged event (``p``, ``k``,
``event_id``, ``index``), then ``done``.

``own`` opens ``Runtime(STORE)``, defines POOL with CONCURRENCY instances, prints
``ready``, and runs until its handler has run EXPECTED events (exit 2 if that takes
longer than ``WATCHDOG`` seconds); then it prints each execution as a JSON line
(``p``, ``k``, ``key``, ``index``, ``sequence``), closes the runtime, prints
``closed`` and exits 0.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import dopool
from dopool import EventContext, Runtime

WATCHDOG = 60.0
BATCH = 4


def produce(store: str, pool_name: str, producer: int, count: int) -> None:
    with dopool.connect(store) as connection:
        pool = connection.pool(pool_name)
        k = 0
        while k < count:
            kind = k % 3
            if kind == 2:  # a batch of round-robin events
                ks = list(range(k, min(k + BATCH, count)))
                key = None
                events = [{"p": producer, "k": n, "key": None} for n in ks]
                results = pool.enqueue_many(events)
            else:
                key = f"key-{k % 5}" if kind == 1 else None
                ks = [k]
                results = [pool.enqueue({"p": producer, "k": k, "key": key}, partition_key=key)]
            for n, result in zip(ks, results, strict=True):
                line = {"p": producer, "k": n, "key": key, "event_id": result.event_id}
                print(json.dumps({**line, "index": result.instance_index}), flush=True)
            k += len(ks)
    print("done", flush=True)


def own(store: str, pool_name: str, concurrency: int, expected: int) -> int:
    runs: list[dict[str, Any]] = []
    lock = threading.Lock()
    finished = threading.Event()

    def handler(ctx: EventContext) -> None:
        event = ctx.event
        with lock:
            runs.append(
                {
                    "p": event["p"],
                    "k": event["k"],
                    "key": event["key"],
                    "index": ctx.instance_index,
                    "sequence": ctx.sequence,
                }
            )
            if len(runs) >= expected:
                finished.set()

    with Runtime(store) as runtime:
        runtime.define(pool_name, execute=handler, concurrency=concurrency)
        print("ready", flush=True)
        if not finished.wait(WATCHDOG):
            return 2
    with lock:
        for run in runs:
            print(json.dumps(run), flush=True)
    print("closed", flush=True)
    return 0


def main(argv: list[str]) -> int:
    role, store, pool_name, first, second = argv
    if role == "produce":
        produce(store, pool_name, int(first), int(second))
        return 0
    return own(store, pool_name, int(first), int(second))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
