"""Jobs from many threads done in batches (:class:`Gather`): a shard host's concurrent Ray
calls stored in one transaction (``_ray/host.py``), a producer's concurrent calls to one
host sent in one Ray call (``_ray/producer.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

J = TypeVar("J")
R = TypeVar("R")


class Gather(Generic[J, R]):
    """Jobs from many threads done in batches, one batch at a time: a thread that comes
    while a batch is being done queues its job, and the first queued does all the queued
    ones next (as group commit gathers writers). Thread-safe."""

    def __init__(self, work: Callable[[list[J]], list[R]]) -> None:
        self._work = work  # each job's result, in order
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Slot[J, R]] = []
        self._busy = False

    def submit(self, job: J) -> R:
        """``job`` done in a batch; its result (what the batch raised, raised)."""
        slot = _Slot[J, R](job)
        with self._cond:
            self._queue.append(slot)
            if self._busy:
                self._cond.wait_for(lambda: slot.done or slot.lead)
            if not slot.done:
                self._busy = True
                batch, self._queue = self._queue, []
        if not slot.done:
            self._run(batch)
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _run(self, batch: list[_Slot[J, R]]) -> None:
        results: list[R] | None = None
        error: BaseException | None = None
        try:
            results = self._work([slot.job for slot in batch])
        except BaseException as exc:  # each caller raises it; none waits on
            error = exc
        finally:
            with self._cond:
                for position, slot in enumerate(batch):
                    if results is None:
                        slot.error = error or RuntimeError("the batch was abandoned")
                    else:
                        slot.result = results[position]
                    slot.done = True
                if self._queue:
                    self._queue[0].lead = True
                else:
                    self._busy = False
                self._cond.notify_all()


class _Slot(Generic[J, R]):
    __slots__ = ("done", "error", "job", "lead", "result")

    def __init__(self, job: J) -> None:
        self.job = job
        self.result: R | None = None
        self.error: BaseException | None = None
        self.done = False
        self.lead = False
