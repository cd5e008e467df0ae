"""The peers dopool is compared with, in the end-to-end scenario: SqliteHuey and persist-queue.

Both are imported inside the runs, so that the rest of the benchmarks works without the
``bench`` extra; :func:`cases` leaves out a peer that is not installed and says so.

- **SqliteHuey**, durable (``fsync=True``: ``PRAGMA synchronous=FULL`` on its WAL
  database, which fsyncs the WAL on every commit) and with ``fsync=False``
  (``synchronous=OFF``). The consumer runs in this process: ``Consumer.start()`` starts
  ``concurrency`` worker threads and the scheduler thread, ``Consumer.stop(graceful=True)`` sets the
  stop flag and joins them (how huey's own tests run it). Idle workers poll every 1 ms,
  backing off to 10 ms, instead of huey's default 100 ms backing off to 10 s, which
  would measure the poll interval rather than the queue.
- **persist-queue** ``SQLiteAckQueue`` (WAL, SQLite's default ``synchronous=FULL``): the
  producers ``put``, one consumer thread does ``get`` then ``ack``, and every 1,000 acks
  ``clear_acked_data()``, which a user has to call (persist-queue issue 77): ``ack``
  only marks a row, and ``get`` scans past every acked row from the start of the table,
  so without the clean-up each ``get`` costs O(events acked so far), and 20,000 events
  ran about 2.5x slower here.

Each run checks that the peer ran every event and left nothing queued.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    INSTALL_HINT,
    TIMEOUT,
    Case,
    Reading,
    Sizes,
    peer_missing,
    rate,
    run_producers,
)

HUEY_DURABLE = "SqliteHuey fsync"
HUEY_NO_FSYNC = "SqliteHuey no fsync"
PERSIST_QUEUE = "persist-queue ack"
# huey's polling of an empty queue: first wait, growth factor, longest wait (seconds).
HUEY_POLL = {"initial_delay": 0.001, "backoff": 1.15, "max_delay": 0.01}
# persist-queue's blocking get waits for a put on an Event it clears after looking at the
# queue, so a put in between is missed for up to 10 s; a short timeout bounds that.
PERSIST_QUEUE_GET_TIMEOUT = 0.01
# Delete the acked rows after this many acks (None: never); see the module docstring.
PERSIST_QUEUE_CLEAR_EVERY: int | None = 1_000


class _Countdown:
    """Counts completions from any thread; ``done`` is set at the expected number."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def tick(self) -> None:
        with self._lock:
            self.count += 1
            if self.count == self.expected:
                self.done.set()

    def wait(self, what: str) -> float:
        """Wait for the last completion; the time it was seen."""
        if not self.done.wait(TIMEOUT):
            raise RuntimeError(
                f"{what} completed {self.count:,} of {self.expected:,} events in {TIMEOUT:g} s"
            )
        return time.perf_counter()


def huey_end_to_end(fsync: bool, sizes: Sizes) -> Case:
    """SqliteHuey with an in-process consumer of thread workers, one task call per event."""

    def run(store: Path) -> list[Reading]:
        import huey  # noqa: PLC0415 - optional: the bench extra

        store.mkdir(parents=True)
        queue = huey.SqliteHuey(
            "bench", filename=str(store / "huey.db"), fsync=fsync, results=False
        )
        countdown = _Countdown(sizes.events)

        @queue.task()  # type: ignore[untyped-decorator]  # huey ships no type hints
        def no_op(event: dict[str, Any]) -> None:
            countdown.tick()

        synchronous = queue.storage.conn.execute("pragma synchronous").fetchone()[0]
        if synchronous != (2 if fsync else 0):
            raise RuntimeError(f"SqliteHuey fsync={fsync} runs with synchronous={synchronous}")
        consumer = queue.create_consumer(
            workers=sizes.concurrency,
            worker_type="thread",
            periodic=False,
            check_worker_health=False,
            **HUEY_POLL,
        )
        _start_without_signal_handlers(consumer)
        try:
            start, enqueued = run_producers(no_op, sizes.events, sizes.producers)
            finished = countdown.wait("SqliteHuey")
        finally:
            consumer.stop(graceful=True)
            left = queue.pending_count()
            queue.storage.close()
        if left or countdown.count != sizes.events:
            raise RuntimeError(f"SqliteHuey ran {countdown.count:,} events, {left:,} still queued")
        return [
            Reading("end-to-end", "events/s", rate(sizes.events, finished - start)),
            Reading("enqueue", "events/s", rate(sizes.events, enqueued - start)),
        ]

    return Case("e2e", HUEY_DURABLE if fsync else HUEY_NO_FSYNC, run)


def _start_without_signal_handlers(consumer: Any) -> None:
    """``Consumer.start()``, then put back the signal handlers it installs.

    ``start`` hooks SIGINT, SIGTERM and SIGHUP for ``Consumer.run``'s loop, which is
    not used here; left in place they would swallow a Ctrl-C of the benchmark.
    """
    signals = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    saved = {number: signal.getsignal(number) for number in signals}
    try:
        consumer.start()
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


def persist_queue_end_to_end(sizes: Sizes) -> Case:
    """persist-queue's SQLiteAckQueue: producers ``put``, one consumer ``get`` + ``ack``."""

    def run(store: Path) -> list[Reading]:
        from persistqueue import SQLiteAckQueue  # noqa: PLC0415 - optional: the bench extra
        from persistqueue.exceptions import Empty  # noqa: PLC0415

        queue = SQLiteAckQueue(str(store), multithreading=True, auto_commit=True)
        countdown = _Countdown(sizes.events)
        stop = threading.Event()
        errors: list[Exception] = []

        def consume() -> None:
            try:
                while not stop.is_set() and countdown.count < sizes.events:
                    try:
                        item = queue.get(raw=True, timeout=PERSIST_QUEUE_GET_TIMEOUT)
                    except Empty:
                        continue
                    queue.ack(id=item["pqid"])
                    countdown.tick()
                    if (
                        PERSIST_QUEUE_CLEAR_EVERY
                        and countdown.count % PERSIST_QUEUE_CLEAR_EVERY == 0
                    ):
                        queue.clear_acked_data(max_delete=None, keep_latest=None)
            except Exception as exc:  # reported by the main thread
                errors.append(exc)
                countdown.done.set()  # stop waiting

        consumer = threading.Thread(target=consume, name="persist-queue consumer", daemon=True)
        consumer.start()
        try:
            start, enqueued = run_producers(queue.put, sizes.events, sizes.producers)
            finished = countdown.wait("persist-queue")
        finally:
            stop.set()
            consumer.join(TIMEOUT)
        try:
            if errors:
                raise RuntimeError(f"persist-queue consumer failed: {errors[0]!r}") from errors[0]
            waiting = queue.ready_count() + queue.unack_count() + queue.ack_failed_count()
        finally:
            queue.close()
        if countdown.count != sizes.events or waiting:
            raise RuntimeError(f"persist-queue acked {countdown.count:,} events, {waiting:,} left")
        return [
            Reading("end-to-end", "events/s", rate(sizes.events, finished - start)),
            Reading("enqueue", "events/s", rate(sizes.events, enqueued - start)),
        ]

    return Case("e2e", PERSIST_QUEUE, run)


def cases(sizes: Sizes) -> tuple[list[Case], dict[str, str]]:
    """The peers' cases, and the peers left out because they are not installed."""
    found, skipped = [], {}
    if peer_missing("huey"):
        skipped["SqliteHuey"] = f"skipped: {INSTALL_HINT}"
    else:
        found += [huey_end_to_end(True, sizes), huey_end_to_end(False, sizes)]
    if peer_missing("persistqueue"):
        skipped["persist-queue"] = f"skipped: {INSTALL_HINT}"
    else:
        found.append(persist_queue_end_to_end(sizes))
    return found, skipped
