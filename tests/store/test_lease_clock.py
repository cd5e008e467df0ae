"""The host's lease clock in the writer lock's file (``dopool._store.leaseclock``), sans waiting:
each take, release and reading is given its monotonic time, so stalls are numbers.

Two :class:`LockRecord` on one file stand for two processes of one store.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dopool._store.leaseclock import (
    RECORD,
    STALL_GRACE,
    LockRecord,
    boot_id,
    estimate_lease_time,
)
from dopool._store.writerlock import WRITER_LOCK

G = STALL_GRACE


@pytest.fixture
def lock_file(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path / WRITER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    yield fd
    os.close(fd)


def _write(record: LockRecord, taken: float, released: float) -> float:
    """A write from ``taken`` to ``released`` that reads the clock; its reading."""
    record.taken(taken, taken)
    now = record.lease_time(taken)
    record.released(released)
    return now


def test_the_clock_starts_at_the_wall_clock_and_runs_with_the_monotonic_one(
    lock_file: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dopool._store.leaseclock.wall_time", lambda: 1_800_000_000.0)
    record = LockRecord(lock_file)
    assert _write(record, 50.0, 50.01) == 1_800_000_000.0
    # The wall clock steps an hour forward (NTP, an operator's date): nothing moves.
    monkeypatch.setattr("dopool._store.leaseclock.wall_time", lambda: 1_800_003_600.0)
    assert _write(record, 53.0, 53.01) == 1_800_000_003.0
    monkeypatch.setattr("dopool._store.leaseclock.wall_time", lambda: 1_700_000_000.0)  # and back
    assert _write(record, 60.0, 60.01) == 1_800_000_010.0


def test_a_hold_longer_than_the_grace_counts_only_the_grace(lock_file: int) -> None:
    holder, other = LockRecord(lock_file), LockRecord(lock_file)
    start = _write(holder, 100.0, 100.01)
    holder.taken(101.0, 101.0)
    holder.released(109.0)  # eight seconds with the lock: a frozen holder
    assert _write(other, 109.0, 109.01) == start + 1.0 + G
    assert _write(other, 112.0, 112.01) == start + 4.0 + G  # and on from there


def test_a_wait_longer_than_the_grace_counts_only_the_grace(lock_file: int) -> None:
    """A holder that writes no record (another program's flock, a process frozen between
    its flock and its record) is seen by its waiters."""
    record = LockRecord(lock_file)
    start = _write(record, 100.0, 100.01)
    record.taken(110.0, since=102.0)  # waited eight seconds for the lock
    assert record.lease_time(110.0) == start + 2.0 + G
    record.released(110.01)


def test_a_holder_that_died_holding_the_lock_stalled_the_clock_from_its_take(
    lock_file: int,
) -> None:
    dead, other = LockRecord(lock_file), LockRecord(lock_file)
    start = _write(dead, 100.0, 100.01)
    dead.taken(101.0, 101.0)  # then killed: it never releases, the kernel does
    holder = dead.holder()
    assert holder is not None
    assert (holder.pid, holder.since) == (os.getpid(), 101.0)
    other.taken(108.0, 108.0)  # took it at once after the kill
    assert other.lease_time(108.0) == start + 1.0 + G
    other.released(108.01)
    assert other.holder() is None


def test_overlapping_stalls_count_once_and_the_clock_never_goes_back(lock_file: int) -> None:
    holder, waiter = LockRecord(lock_file), LockRecord(lock_file)
    start = _write(holder, 100.0, 100.01)
    holder.taken(101.0, 101.0)
    late = holder.lease_time(105.0)  # read late in its own long hold
    assert late == start + 5.0
    holder.released(109.0)
    waiter.taken(109.0, since=102.0)  # waited through the same hold
    now = waiter.lease_time(109.0)
    assert now == late  # the stall after the reading, counted once
    waiter.released(109.01)
    assert _write(waiter, 110.0, 110.01) == late + 1.0


def test_a_record_of_another_boot_or_a_damaged_one_starts_the_clock_again(
    lock_file: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dopool._store.leaseclock.wall_time", lambda: 1_800_000_000.0)
    record = LockRecord(lock_file)
    before = _write(record, 50.0, 50.01)
    # Rebooted: monotonic time starts again low, and the file is the last boot's.
    monkeypatch.setattr("dopool._store.leaseclock.boot_id", lambda: b"another boot id!")
    rebooted = LockRecord(lock_file)
    monkeypatch.setattr("dopool._store.leaseclock.wall_time", lambda: 1_800_000_100.0)
    assert _write(rebooted, 3.0, 3.01) == 1_800_000_100.0
    # A boot whose wall clock is behind where the clock was last read: on from there.
    monkeypatch.setattr("dopool._store.leaseclock.boot_id", lambda: b"a third boot id!")
    third = LockRecord(lock_file)
    monkeypatch.setattr("dopool._store.leaseclock.wall_time", lambda: 1_700_000_000.0)
    assert _write(third, 1.0, 1.01) == 1_800_000_100.0
    assert before < 1_800_000_100.0
    # Damaged bytes: started again from where it stood, or the wall clock.
    os.pwrite(lock_file, b"\xff" * RECORD.size, 0)
    assert _write(third, 2.0, 2.01) == 1_700_000_000.0
    os.pwrite(lock_file, RECORD.pack(b"DPWL", 1, 0, 0, math.nan, math.inf, 0.0, boot_id()), 0)
    fresh = LockRecord(lock_file)
    reading = _write(fresh, 3.0, 3.01)
    assert math.isfinite(reading)
    assert _write(fresh, 4.0, 4.01) == reading + 1.0


def test_a_reader_without_the_lock_estimates_the_clock(tmp_path: Path, lock_file: int) -> None:
    record = LockRecord(lock_file)
    record.taken(0.0, 0.0)
    record.lease_time(0.0)
    record.released(0.01)
    estimate = estimate_lease_time(tmp_path)
    assert abs(estimate - record.lease_time(_monotonic())) < 1.0
    os.pwrite(lock_file, b"\0" * RECORD.size, 0)  # no record of this boot: the wall clock
    wall = estimate_lease_time(tmp_path)
    assert abs(wall - _wall()) < 60.0
    assert estimate_lease_time(tmp_path / "missing") > 0


def test_the_record_has_its_documented_layout(lock_file: int) -> None:
    record = LockRecord(lock_file)
    record.taken(7.0, 7.0)
    now = record.lease_time(7.0)
    raw = os.pread(lock_file, 64, 0)
    assert (len(raw), RECORD.size) == (64, 56)
    magic, version, held, pid, taken_at, offset, settled, boot = RECORD.unpack(raw[:56])
    assert (magic, version, held, pid, taken_at, settled) == (b"DPWL", 1, 1, os.getpid(), 7.0, 7.0)
    assert (offset + 7.0, boot) == (now, boot_id())
    record.released(7.01)
    assert struct.unpack_from("<B", os.pread(lock_file, 64, 0), 5) == (0,)


def _monotonic() -> float:
    return time.monotonic()


def _wall() -> float:
    return time.time()
