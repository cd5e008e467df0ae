"""Starting a pool's instances before a test needs them running."""

from __future__ import annotations

import threading
from pathlib import Path

from dopool import EventContext, Runtime, WorkerPool
from dopool._engine.direct import DirectEnqueue


def activate(pool: WorkerPool, *indices: int) -> None:
    """Start instances ``indices`` of ``pool`` (every one if none given) and wait for their
    first recoveries, as a message or a due alarm would start them: a test of what a
    running instance does (a caller's direct enqueue, say) starts from one."""
    cells = pool._instances.cells
    for index in indices or range(pool.concurrency):
        _, reply = cells.open(index)
        if reply is not None:
            reply.get()


def leave_an_interrupted_attempt(path: Path, pool: str) -> None:
    """Leave instance 0 of ``pool`` in the store at ``path`` with an attempt that was still
    running when its runtime closed: the next ``define`` starts that instance, and its
    first recovery writes (it settles the attempt), so a storage fault can hit it."""
    running, release = threading.Event(), threading.Event()

    def hang(_ctx: EventContext) -> None:
        running.set()
        release.wait(60.0)

    runtime = Runtime(path, durability="async")  # the real clock: nothing drives the handler
    try:
        runtime.define(pool, execute=hang).enqueue("interrupted")
        assert running.wait(60.0)
    finally:
        runtime.close(timeout=0)  # abandoned: the next open counts its attempt as interrupted
        release.set()  # its outcome can no longer commit: the store is closed


def direct_path(pool: WorkerPool, index: int) -> DirectEnqueue:
    """Instance ``index``'s direct enqueue path (the instance started if it was not), for a
    test that reaches into it; the instance must not be waiting for a slot."""
    direct = pool._direct_to(index)
    assert direct is not None, f"instance {index} waits for a slot"
    return direct
