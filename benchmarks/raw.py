"""The ceiling: py-lmdb on the same disk, with dopool's store options and value size.

The environment is opened as dopool's store opens it (``subdir=True``,
``readahead=False``, the same map size; ``sync`` and ``metasync`` on in mode
``"sync"``, off in ``"async"``), and every value is as long as dopool's record of
one benchmark event. Keys follow dopool's queue key layout. Three shapes:

- **1 put/txn**: one put per write transaction, the floor of one durable enqueue;
- **queue step**: one transaction puts an event, a later one reads and deletes the
  head of the queue and rewrites a small meta record: what one event costs a minimal
  durable queue (two commits);
- **batched**: ``batch_size`` puts per transaction, the floor of ``enqueue_many``.

And in the depth scenario, the memory that LMDB itself costs for a deep queue: the
depth case's fill, done with plain puts (:func:`deep_fill`).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from benchmarks.harness import (
    Case,
    Reading,
    Sizes,
    body_for,
    make_event,
    memory_kib,
    rate,
    record_size,
)

MODES = ("sync", "async")
# dopool's store: virtual address space only, LMDB grows the file as pages are used.
MAP_SIZE = 1 << 36
PREFIX = b"Ibench:0\0"
QUEUE = PREFIX + b"q"
META = PREFIX + b"m"
_RANK = struct.pack(">I", 2**31 - 1)  # priority 0
_U64 = struct.Struct(">Q")


def system(shape: str, mode: str) -> str:
    return f"LMDB {mode}, {shape}"


def _key(sequence: int) -> bytes:
    return QUEUE + _RANK + _U64.pack(sequence)


def _value(body: str | None = None) -> bytes:
    event = make_event(0) if body is None else make_event(1 << 16, body)
    return b"v" * record_size(event)


def _meta(tail: int, done: int) -> bytes:
    """A meta record of dopool's shape: a short list of counters and flags."""
    fields: list[Any] = [tail, tail - done, tail, done, 0, 0, False, None, None, 0, False]
    fields += [None, None, 0, 0, 0, 0, {}, 0, {}]
    packed: bytes = msgpack.packb(fields, use_bin_type=True)
    return packed


@contextmanager
def _environment(store: Path, mode: str) -> Iterator[Any]:
    sync = mode == "sync"
    env = lmdb.open(
        str(store), map_size=MAP_SIZE, subdir=True, sync=sync, metasync=sync, readahead=False
    )
    try:
        yield env
    finally:
        env.close()


def _check_entries(env: Any, expected: int) -> None:
    entries = env.stat()["entries"]
    if entries != expected:
        raise RuntimeError(f"expected {expected:,} entries in the environment, found {entries:,}")


def single_puts(mode: str, sizes: Sizes) -> Case:
    """One put per write transaction."""

    def run(store: Path) -> list[Reading]:
        count, value = sizes.sequential, _value()
        keys = [_key(i) for i in range(count)]
        with _environment(store, mode) as env:
            start = time.perf_counter()
            for key in keys:
                with env.begin(write=True) as txn:
                    txn.put(key, value)
            finished = time.perf_counter()
            _check_entries(env, count)
        return [Reading("put", "puts/s", rate(count, finished - start))]

    return Case("raw", system("1 put/txn", mode), run)


def queue_steps(mode: str, sizes: Sizes) -> Case:
    """Per event: a transaction that puts it, then one that pops the head and updates meta."""

    def run(store: Path) -> list[Reading]:
        count, value = sizes.sequential, _value()
        with _environment(store, mode) as env:
            start = time.perf_counter()
            for sequence in range(count):
                with env.begin(write=True) as txn:
                    txn.put(_key(sequence), value)
                with env.begin(write=True) as txn:
                    cursor = txn.cursor()
                    if not cursor.set_range(QUEUE) or not cursor.key().startswith(QUEUE):
                        raise RuntimeError(f"event {sequence} is not in the queue")
                    if cursor.key() != _key(sequence) or len(cursor.value()) != len(value):
                        raise RuntimeError(f"the head is not event {sequence}")
                    cursor.delete()
                    txn.put(META, _meta(count, sequence + 1))
            finished = time.perf_counter()
            _check_entries(env, 1)  # only the meta record is left
        return [Reading("queue step", "steps/s", rate(count, finished - start))]

    return Case("raw", system("queue step", mode), run)


def batched_puts(mode: str, sizes: Sizes) -> Case:
    """``batch_size`` puts per write transaction, ``batches`` transactions."""

    def run(store: Path) -> list[Reading]:
        size, count, value = sizes.batch_size, sizes.batches, _value()
        keys = [[_key(b * size + i) for i in range(size)] for b in range(count)]
        with _environment(store, mode) as env:
            start = time.perf_counter()
            for batch in keys:
                with env.begin(write=True) as txn:
                    for key in batch:
                        txn.put(key, value)
            finished = time.perf_counter()
            _check_entries(env, size * count)
        return [Reading("put", "puts/s", rate(size * count, finished - start))]

    return Case("raw", system(f"{sizes.batch_size:,} puts/txn", mode), run)


def deep_fill(sizes: Sizes) -> Case:
    """The depth case's writes with plain puts, and how much resident memory they cost.

    Like dopool's depth case (sync): ``batch_size`` puts per transaction up to
    ``shallow`` entries, ``probe`` single puts, the same up to ``depth``, ``probe``
    single puts; values as long as dopool's record of a ``depth_event_bytes`` event.
    What this grows is what any queue kept in LMDB grows, before dopool adds anything.
    """

    def run(store: Path) -> list[Reading]:
        value = _value(body_for(sizes.depth_event_bytes))
        with _environment(store, "sync") as env:
            before = memory_kib()
            stored = 0

            def fill(to: int) -> None:
                nonlocal stored
                while stored < to:
                    chunk = min(sizes.batch_size, to - stored)
                    with env.begin(write=True) as txn:
                        for sequence in range(stored, stored + chunk):
                            txn.put(_key(sequence), value)
                    stored += chunk

            def probe() -> None:
                nonlocal stored
                for sequence in range(stored, stored + sizes.probe):
                    with env.begin(write=True) as txn:
                        txn.put(_key(sequence), value)
                stored += sizes.probe

            fill(sizes.shallow)
            probe()
            fill(sizes.depth)
            probe()
            after = memory_kib()
            _check_entries(env, stored)
        return [
            Reading("RSS growth", "MiB", (after["VmRSS"] - before["VmRSS"]) / 1024),
            Reading("anonymous RSS growth", "MiB", (after["RssAnon"] - before["RssAnon"]) / 1024),
            Reading("file-backed RSS growth", "MiB", (after["RssFile"] - before["RssFile"]) / 1024),
        ]

    return Case("depth", deep_fill_system(sizes), run, once=True)


def deep_fill_system(sizes: Sizes) -> str:
    return system(f"{sizes.depth:,} puts, as the depth case", "sync")


SHAPES: tuple[Callable[[str, Sizes], Case], ...] = (single_puts, queue_steps, batched_puts)


def cases(sizes: Sizes) -> list[Case]:
    return [shape(mode, sizes) for shape in SHAPES for mode in MODES] + [deep_fill(sizes)]
