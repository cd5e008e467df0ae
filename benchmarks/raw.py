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

from benchmarks.harness import Case, Reading, Sizes, make_event, rate, record_size

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


def _value() -> bytes:
    return b"v" * record_size(make_event(0))


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


SHAPES: tuple[Callable[[str, Sizes], Case], ...] = (single_puts, queue_steps, batched_puts)


def cases(sizes: Sizes) -> list[Case]:
    return [shape(mode, sizes) for shape in SHAPES for mode in MODES]
