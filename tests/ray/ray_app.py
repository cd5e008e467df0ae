"""The app the Ray tests deploy (``<this file>:build``): each event's run recorded.

Every attempt appends one line, ``<instance_id> <sequence> <producer> <n>``, to
``ran/<partition key>.log`` beside the host's store directory (one ``os.write`` on an
``O_APPEND`` file: a line is whole or absent, whichever process writes it), so a test
reads what ran, in each partition's order; an attempt interrupted by a kill may have
written its line, and its retry writes another.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dopool import EventContext, RetryPolicy, Runtime


def build(runtime: Runtime) -> None:
    ran = Path(runtime.path).parent / "ran"
    ran.mkdir(exist_ok=True)

    def record(ctx: EventContext) -> None:
        event: dict[str, Any] = ctx.event
        line = f"{ctx.instance_id} {ctx.sequence} {event['producer']} {event['n']}\n"
        name = ctx.partition_key or "none"
        fd = os.open(ran / f"{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    # An attempt a killed host interrupted counts as failed: retried, not dead-lettered.
    retry = RetryPolicy(max_attempts=10, initial_delay=0.05, max_delay=0.5)
    runtime.define("jobs", execute=record, concurrency=4, retry=retry)
    runtime.define("small", execute=record, concurrency=1, max_queue_depth=1)
