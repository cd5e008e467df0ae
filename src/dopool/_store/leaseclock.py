"""The host's lease clock, and who holds the writer lock, kept in the writer lock's file.

Leases (docs/deployment.md, "Several workers on one store") expire by this clock, which
every process of a store reads the same way, rather than by the wall clock:

- it advances with ``CLOCK_MONOTONIC``, so a step of the wall clock (NTP, an operator's
  ``date``) expires nothing;
- it nearly stands still while the writer lock is **stalled**: of a hold of the lock,
  or of a wait for it, that lasts longer than :data:`STALL_GRACE`, only the grace counts.
  A worker cannot renew its leases while another process holds the lock (frozen by
  SIGSTOP, a debugger, a cgroup freezer; or in a huge transaction), so that time must
  not count against them. A worker frozen while it does *not* hold the lock keeps
  nothing: the clock runs on, and its leases expire;
- at the first write after a boot (the boot id in the file is not this boot's) it
  starts again from the wall clock, or from where it stood if that is later, so it
  never goes back and a lease of the last boot expires within its ttl.

The clock is ``CLOCK_MONOTONIC + offset``; the offset lives in the file (``writer.lock``,
:data:`RECORD` at its start, memory-mapped), written only by the holder of the lock. A
stall is an interval of monotonic time; ``settled`` is the time up to which stalls were
taken off, or the clock read, so an interval counts only past it: never twice, and the
clock never goes back. Three kinds of interval count:

- a hold longer than the grace, at its release, from the grace on;
- a wait longer than the grace, once the lock is taken, from the grace on: that covers
  a holder that writes no record (another program's ``flock``, a process frozen
  between taking the lock and writing its record);
- a hold whose holder died before its release (the record still says held), from its
  start plus the grace until the next holder took the lock.

The record also names the holder (pid, since when), for the error of a producer that
gave up waiting (:class:`~dopool._errors.StoreBusyError`). Taking and releasing the lock
write three fields and read one byte: no system call but the two clock reads.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
import uuid
from pathlib import Path
from typing import NamedTuple

from dopool._clock.clocks import wall_time

#: Seconds of a hold of (or a wait for) the writer lock that count on the lease clock;
#: the rest of a longer one is a stall, during which the clock stands still.
STALL_GRACE = 0.1

#: The file that holds the record: the writer lock's (:mod:`dopool._store.writerlock`).
LOCK_FILE = "writer.lock"
_MAGIC = b"DPWL"
_VERSION = 1
# magic, version, held, pid, taken_at, offset, settled, boot id
RECORD = struct.Struct("<4sBB2xi4xddd16s")
_HELD_AT = 5  # the byte that says whether the lock is held
_TAKEN = struct.Struct("<B2xi4xd")  # held, pid, taken_at: from _HELD_AT
_FILE_SIZE = 64


class Holder(NamedTuple):
    """Who holds the writer lock, as its record says: the pid, and since when (monotonic)."""

    pid: int
    since: float


class _Fields(NamedTuple):
    magic: bytes
    version: int
    held: int
    pid: int
    taken_at: float  # monotonic
    offset: float  # the lease clock less the monotonic clock
    settled: float  # monotonic: no stall before it is taken off any more
    boot: bytes


class LockRecord:
    """The record at the start of the writer lock's file, mapped into this process.

    Every method but :meth:`holder` and :meth:`estimate` must be called by the thread
    that holds the writer lock (the lock's :class:`~dopool._store.writerlock.WriterLock` does).
    """

    __slots__ = ("_boot", "_map", "_pid", "_taken_at")

    def __init__(self, fd: int) -> None:
        if os.fstat(fd).st_size < _FILE_SIZE:
            os.ftruncate(fd, _FILE_SIZE)  # zeros: no record yet (read as none)
        self._map = mmap.mmap(fd, _FILE_SIZE)
        self._pid = os.getpid()
        self._boot = boot_id()
        self._taken_at = 0.0

    def taken(self, now: float, since: float) -> None:
        """The lock was taken at ``now``, after waiting since ``since`` (monotonic)."""
        record = self._map
        if record[_HELD_AT] or now - since > STALL_GRACE:  # a dead holder's, or a wait
            self._settle_taking(now, since)
        _TAKEN.pack_into(record, _HELD_AT, 1, self._pid, now)
        self._taken_at = now

    def released(self, now: float) -> None:
        """The lock is released at ``now`` (before the ``flock`` is)."""
        taken_at = self._taken_at
        if now - taken_at > STALL_GRACE:
            fields = self._valid()
            if fields is not None:
                self._stall(fields, taken_at + STALL_GRACE, now)
        self._map[_HELD_AT] = 0

    def lease_time(self, now: float) -> float:
        """The lease clock at monotonic ``now``; it never goes back from here on."""
        fields = self._valid() or self._anchor(now)
        if now > fields.settled:
            self._write(fields.offset, now)
        return now + fields.offset

    def holder(self) -> Holder | None:
        """The holder the record names, if it says the lock is held (read without it)."""
        fields = self._valid()
        if fields is None or not fields.held:
            return None
        return Holder(fields.pid, fields.taken_at)

    def close(self) -> None:
        self._map.close()

    def _settle_taking(self, now: float, since: float) -> None:
        fields = self._valid()
        if fields is None:
            self._anchor(now)
            return
        starts = []
        if now - since > STALL_GRACE:
            starts.append(since + STALL_GRACE)
        if fields.held:  # its holder died holding it
            starts.append(fields.taken_at + STALL_GRACE)
        self._stall(fields, min(starts), now)

    def _stall(self, fields: _Fields, start: float, end: float) -> None:
        """Take the stall from ``start`` to ``end`` off the clock, but what was settled."""
        start = max(start, fields.settled)
        if end > start:
            self._write(fields.offset - (end - start), end)

    def _read(self) -> _Fields:
        return _Fields(*RECORD.unpack_from(self._map))

    def _valid(self) -> _Fields | None:
        return _valid(self._read(), self._boot)

    def _anchor(self, now: float) -> _Fields:
        """Start the clock for this boot (or after a damaged record): from the wall
        clock, or from where the last boot's clock stood if that is later."""
        old = self._read()
        start = wall_time()
        was = old.settled + old.offset
        if old.magic == _MAGIC and math.isfinite(was) and was > start:
            start = was
        taken_at = old.taken_at if math.isfinite(old.taken_at) else now
        offset = start - now
        fields = _Fields(_MAGIC, _VERSION, old.held, old.pid, taken_at, offset, now, self._boot)
        RECORD.pack_into(self._map, 0, *fields)
        return fields

    def _write(self, offset: float, settled: float) -> None:
        """Write the clock's fields (the holder's stay as they are)."""
        record = self._map
        held, pid, taken_at = _TAKEN.unpack_from(record, _HELD_AT)
        RECORD.pack_into(
            record, 0, _MAGIC, _VERSION, held, pid, taken_at, offset, settled, self._boot
        )


def _valid(fields: _Fields, boot: bytes) -> _Fields | None:
    """``fields``, if they are a record of boot ``boot`` with finite times."""
    if fields.magic != _MAGIC or fields.version != _VERSION or fields.boot != boot:
        return None
    if not all(math.isfinite(t) for t in (fields.taken_at, fields.offset, fields.settled)):
        return None
    return fields


def estimate_lease_time(directory: Path) -> float:
    """The lease clock now, for a reader that does not hold the writer lock (``dopool
    status``): a stall under way counts as one. The wall clock where the store's lock
    file holds no record of this boot yet (no worker wrote since it booted)."""
    now, wall = time.monotonic(), wall_time()
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.pread(fd, RECORD.size, 0)
        finally:
            os.close(fd)
    except OSError:
        return wall
    if len(raw) < RECORD.size:
        return wall
    fields = _valid(_Fields(*RECORD.unpack(raw)), boot_id())
    if fields is None:
        return wall
    stalled = now - fields.taken_at - STALL_GRACE if fields.held else 0.0
    return now + fields.offset - max(0.0, stalled)


def boot_id() -> bytes:
    """This boot's id (Linux's ``/proc/sys/kernel/random/boot_id``), 16 bytes.

    Elsewhere, the wall-clock time of the boot to the minute stands for it: a machine
    that slept, or whose wall clock stepped, then counts as booted again, which starts
    the lease clock anew from the wall clock (expiring leases, as the wall clock would).
    """
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return uuid.UUID(text).bytes
    except (OSError, ValueError):
        booted = round((wall_time() - time.monotonic()) / 60)
        return booted.to_bytes(16, "big", signed=True)
