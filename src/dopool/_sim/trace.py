"""``--trace``: a run's pool events and its arrivals, as JSON lines in time order.

The simulator writes the trace itself rather than through ``Runtime(trace=...)``:
it subscribes to the runtime and writes each :class:`~dopool.PoolEvent` as the
runtime would (``PoolEvent.to_json_dict()``, compact JSON), and adds one line of
its own per arrival, ``"kind": "arrived"``, with what the pool answered it. With
them, latency (``succeeded.time - arrived.time``) can be recomputed from the trace
alone (docs/simulate.md, "The trace").

An arrival's line is written where it happened, before the pool events that
followed it, but only once its enqueue is answered: until then the lines after it
are held. An enqueue is answered by the next quiescent point, unless its instance
is inside a handler; :meth:`Trace.flush` runs at each quiescent point, so the
lines held stay few. Under a simulated clock the driver and the instances act one
at a time, and the file is the same, byte for byte, for the same scenario and seed.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from typing import IO, Any

from dopool._engine.messages import Reply
from dopool._errors import ConfigurationError, DopoolError, QueueFullError
from dopool._sim.measure import answer
from dopool._sim.workload import Arrival
from dopool._types import PoolEvent

#: What became of an arrival: stored, a duplicate (its dedup key was held: the sequence
#: is the holding event's), refused (queue full), failed (its instance
#: crashed during the enqueue, nothing stored), or unanswered when the run stopped.
OUTCOMES = ("enqueued", "duplicate", "rejected", "failed", "waiting")


def _line(document: dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":")) + "\n"  # as Runtime(trace=...) writes


class _Arrival:
    """An arrival's place in the trace, filled once its enqueue is answered."""

    __slots__ = ("arrival", "index", "reply")

    def __init__(self, arrival: Arrival) -> None:
        self.arrival = arrival
        self.index: int | None = None
        self.reply: Reply | None = None

    def sent(self, index: int, reply: Reply) -> None:
        """The enqueue went to instance ``index``; ``reply`` will answer it."""
        self.index, self.reply = index, reply

    def line(self, final: bool) -> str | None:
        """The arrival's line, or None while unanswered (unless ``final``: "waiting")."""
        answered = None if self.reply is None else answer(self.reply)
        if answered is None and not final:
            return None
        arrival = self.arrival
        sequence = None
        error = None
        if answered is None:
            outcome = "waiting"
        elif isinstance(answered, DopoolError):
            outcome = "rejected" if isinstance(answered, QueueFullError) else "failed"
            error = f"{type(answered).__name__}: {answered}"
        else:
            outcome = "duplicate" if answered.duplicate else "enqueued"
            sequence = answered.sequence
        return _line(
            {
                "kind": "arrived",
                "pool": arrival.pool,
                "instance_index": self.index,
                "sequence": sequence,
                "time": arrival.time,
                "event_id": arrival.event_id,
                "partition_key": arrival.partition_key,
                **({"delay": arrival.delay} if arrival.delay is not None else {}),
                "outcome": outcome,
                "error": error,
            }
        )


class Trace:
    """The trace file: subscribe it to the runtime, and tell it of each arrival.

    Raises:
        ConfigurationError: the file cannot be opened, or (at :meth:`finish`) written.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            self._file: IO[str] | None = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in finish() or abandon()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot open trace file {self.path!r}: {exc.strerror or exc}"
            ) from None
        self._lock = threading.Lock()
        self._held: deque[str | _Arrival] = deque()
        self._error: OSError | None = None

    def __call__(self, event: PoolEvent) -> None:
        """A subscriber: the event's line, now or after the arrivals still unanswered."""
        line = _line(event.to_json_dict())
        with self._lock:
            if self._held:
                self._held.append(line)
            else:
                self._write(line)

    def arriving(self, arrival: Arrival) -> _Arrival:
        """Mark the arrival's place, before it is sent; :meth:`_Arrival.sent` says where to."""
        place = _Arrival(arrival)
        with self._lock:
            self._held.append(place)
        return place

    def flush(self, *, final: bool = False) -> None:
        """Write what is held, up to the first arrival still unanswered (all, if ``final``)."""
        with self._lock:
            held = self._held
            while held:
                head = held[0]
                if isinstance(head, _Arrival):
                    line = head.line(final)
                    if line is None:
                        return
                    head = line
                held.popleft()
                self._write(head)

    def finish(self) -> None:
        """Write everything (arrivals unanswered as "waiting") and close the file.

        Raises:
            ConfigurationError: a write failed.
        """
        self.flush(final=True)
        self.abandon()
        if self._error is not None:
            raise ConfigurationError(
                f"cannot write trace file {self.path!r}: {self._error.strerror or self._error}"
            )

    def abandon(self) -> None:
        """Close the file as it is (a run that failed); later events are ignored."""
        with self._lock:
            self._held.clear()
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as exc:
                    self._error = self._error or exc
                self._file = None

    def _write(self, line: str) -> None:
        if self._file is None or self._error is not None:
            return
        try:
            self._file.write(line)
        except OSError as exc:
            self._error = exc
