"""The app every contract target runs (``contract_app:build``): each attempt recorded.

Every attempt appends one JSON line (the event, where it ran, and the wall-clock time
it started) to ``ran/<tag>.log`` beside the store's directory, ``tag`` being the
event's ``"tag"``: each test writes its own file, though a worker process or a Ray
deployment serves a whole module's tests, and a Ray deployment's hosts (one store
each, in one directory) share it. One ``os.write`` on an ``O_APPEND`` file: a line is
whole or absent, whichever process writes it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from dopool import EventContext, Runtime

#: The pool most contract tests feed, and its concurrency.
POOL = "jobs"
CONCURRENCY = 4
#: A small pool, whose instances refuse a third pending event.
SMALL = "small"
#: Each pool's define options that a producer's handle must be given too: the store does
#: not hold them, and a ``dopool.connect`` producer storing a call itself applies its own.
OPTIONS: dict[str, dict[str, Any]] = {
    POOL: {"dedup_window": 3600.0},  # a finished event's dedup key is held for an hour
    SMALL: {"max_queue_depth": 2},
}


def build(runtime: Runtime) -> None:
    ran = Path(runtime.path).parent / "ran"
    ran.mkdir(exist_ok=True)

    def record(ctx: EventContext) -> None:
        started = time.time()
        line = {
            "event": ctx.event,
            "instance": ctx.instance_index,
            "sequence": ctx.sequence,
            "partition_key": ctx.partition_key,
            "attempt": ctx.attempt,
            "started": started,
        }
        fd = os.open(ran / f"{ctx.event['tag']}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)

    runtime.define(POOL, execute=record, concurrency=CONCURRENCY, **OPTIONS[POOL])
    runtime.define(SMALL, execute=record, concurrency=2, **OPTIONS[SMALL])
