"""Starting a pool's instances before a test needs them running."""

from __future__ import annotations

from dopool import WorkerPool


def activate(pool: WorkerPool, *indices: int) -> None:
    """Start instances ``indices`` of ``pool`` (every one if none given) and wait for their
    first recoveries, as a message or a due alarm would start them: a test of what a
    running instance does (a caller's direct enqueue, say) starts from one."""
    cells = pool._instances.cells
    for index in indices or range(pool.concurrency):
        _, reply = cells.open(index)
        if reply is not None:
            reply.get()
