"""The end-to-end workload in the least Python that keeps dopool's guarantees.

The e2e scenario asks this of dopool: producer threads enqueue one event per call,
and each enqueue is durable before it returns; each instance commits an event's
start before it runs the handler, and its outcome before the next start (one
transaction holds an outcome and the next start). Here the same is written
directly on dopool's store, with one plain thread per queue: no actors, no
validation, counters, retries, alarms, events or recovery. What remains is the cost
of the design itself, in CPython threads, on this disk. Two shapes:

- **via worker**: a producer hands its event to the queue's thread, which writes
  it in its next transaction and answers after the commit. This is dopool's
  shape: a call waits while the instance's handler runs (docs/api.md, "Methods").
- **direct**: a producer commits its event itself, then wakes the queue's thread.

Transactions go through ``Store.transact``, so they commit as dopool's do: group
commit in ``sync`` mode, a transaction per body in turn in ``async`` mode.
"""

from __future__ import annotations

import itertools
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from benchmarks.harness import TIMEOUT, Case, Reading, Sizes, rate, run_producers
from dopool._store.environment import Store
from dopool._store.txn import Txn

MODES = ("sync", "async")
SHAPES = ("via worker", "direct")
_U64 = struct.Struct(">Q")


def system(shape: str, mode: str) -> str:
    return f"Python ceiling {mode}, {shape}"


class _Queue:
    """One queue and the thread that runs it: the least that an instance must do.

    Its namespace holds a meta record (head, tail), one key per pending event, and
    the sequence of the started event.
    """

    def __init__(self, store: Store, index: int, expected: int, *, direct: bool) -> None:
        prefix = f"Iceiling:{index}\0".encode()
        self._store = store
        self._meta_key = prefix + b"m"
        self._event_prefix = prefix + b"q"
        self._start_key = prefix + b"a"
        self._direct = direct
        self._arrived = threading.Condition(threading.Lock())
        self._handed: list[tuple[bytes, threading.Lock]] = []  # via worker: not yet written
        self._known = 0  # events sent to this queue, written or handed
        self.expected = expected
        self.done = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"ceiling-{index}", daemon=True)

    def _key(self, sequence: int) -> bytes:
        return self._event_prefix + _U64.pack(sequence)

    def _meta(self, txn: Txn) -> tuple[int, int]:
        raw = txn.get(self._meta_key)
        if raw is None:
            return 0, 0
        head, tail = msgpack.unpackb(raw)
        return head, tail

    def enqueue(self, record: bytes) -> None:
        """Return once ``record`` is durable in this queue."""
        if self._direct:

            def body(txn: Txn) -> None:
                head, tail = self._meta(txn)
                txn.put(self._key(tail), record)
                txn.put(self._meta_key, msgpack.packb((head, tail + 1)))

            self._store.transact(body)
            with self._arrived:
                self._known += 1
                self._arrived.notify()
            return
        answered = threading.Lock()
        answered.acquire()
        with self._arrived:
            self._handed.append((record, answered))
            self._known += 1
            self._arrived.notify()
        if not answered.acquire(timeout=TIMEOUT):
            raise RuntimeError(f"{self.thread.name} did not commit an event in {TIMEOUT:g} s")

    def _step(self, current: int | None) -> Callable[[Txn], Any]:
        """The transaction: handed events, the current event's outcome, the next one's start."""

        def body(txn: Txn) -> tuple[int | None, bytes | None, list[tuple[bytes, threading.Lock]]]:
            head, tail = self._meta(txn)
            with self._arrived:  # taken as the body runs, so late senders share this commit
                taken, self._handed = self._handed, []
            for handed, _ in taken:
                txn.put(self._key(tail), handed)
                tail += 1
            if current is not None:
                txn.delete(self._key(current))
                head = current + 1
            started, record = None, None
            if head < tail:
                started, record = head, txn.get(self._key(head))
                txn.put(self._start_key, _U64.pack(head))
            txn.put(self._meta_key, msgpack.packb((head, tail)))
            return started, record, taken

        return body

    def _run(self) -> None:
        try:
            current: int | None = None
            while True:
                finished = current is not None
                current, record, taken = self._store.transact(self._step(current))
                for _, answered in taken:
                    answered.release()
                if finished:
                    self.done += 1
                if current is not None:
                    event, _, _, _ = msgpack.unpackb(record)
                    msgpack.unpackb(event)  # the handler: a no-op on the decoded event
                    continue
                if self.done == self.expected:
                    return
                with self._arrived:
                    self._arrived.wait_for(lambda: self._known > self.done, TIMEOUT)
        except BaseException as exc:
            self.error = exc

    def check(self, txn: Txn) -> None:
        head, tail = self._meta(txn)
        if (head, tail, self.done) != (self.expected,) * 3:
            raise RuntimeError(
                f"{self.thread.name}: head {head}, tail {tail}, done {self.done}, "
                f"expected {self.expected}"
            )
        cursor = txn.cursor()
        if cursor.set_range(self._event_prefix) and cursor.key().startswith(self._event_prefix):
            raise RuntimeError(f"{self.thread.name}: an event is still queued")


def end_to_end(shape: str, mode: str, sizes: Sizes) -> Case:
    """The e2e scenario's producers, on ``concurrency`` queues of this module."""

    def run(directory: Path) -> list[Reading]:
        store = Store(directory, durability=mode)
        try:
            count = sizes.concurrency
            queues = [
                _Queue(store, i, len(range(i, sizes.events, count)), direct=shape == "direct")
                for i in range(count)
            ]
            for queue in queues:
                queue.thread.start()
            turns = itertools.count()

            def enqueue(event: Any) -> None:
                # What dopool stores for an event: (encoded event, enqueued at, key, priority).
                encoded = msgpack.packb(event, use_bin_type=True)
                record = msgpack.packb((encoded, time.time(), None, 0), use_bin_type=True)
                queues[next(turns) % count].enqueue(record)

            start, _ = run_producers(enqueue, sizes.events, sizes.producers)
            for queue in queues:
                queue.thread.join(TIMEOUT)
            finished = time.perf_counter()
            for queue in queues:
                if queue.error is not None:
                    raise queue.error
                if queue.thread.is_alive():
                    raise RuntimeError(f"{queue.thread.name} did not finish in {TIMEOUT:g} s")
            with store.read() as txn:
                for queue in queues:
                    queue.check(txn)
        finally:
            store.close()
        return [Reading("end-to-end", "events/s", rate(sizes.events, finished - start))]

    return Case("e2e", system(shape, mode), run)


def cases(sizes: Sizes) -> list[Case]:
    return [end_to_end(shape, mode, sizes) for mode in MODES for shape in SHAPES]
