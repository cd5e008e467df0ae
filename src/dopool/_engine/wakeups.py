"""Wake-ups across processes: a producer tells the owning runtime which instance to wake.

A producer (:mod:`dopool._handles.connection`) commits an enqueue into an instance's namespace
from another process; the instance's actor, in the runtime that owns the store,
does not know until it is told. Two ways tell it:

- **The wake-up socket.** The owning runtime binds a UNIX datagram socket,
  ``<store>/wake.sock`` (an exclusive runtime's) or ``<store>/wake/<owner>.sock``
  (a shared worker's, named by its owner id), and a daemon thread reads it. After
  each commit a producer sends one datagram per instance it wrote, ``<pool> NUL
  <index>``, to the socket of the worker the instance's lease names (else, or if
  that one is not there, to ``wake.sock``), from a non-blocking socket, and never
  waits nor fails for it: with no owner, a dead owner's socket file or a full
  queue, the datagram is dropped. (A full queue is noticed: once the reader has read
  as many datagrams in a row as the kernel queues, it polls at once.)
- **The poll.** Every ``poll_interval`` seconds the same thread reads the store's
  work index (every instance with pending events or follow-ups) and wakes each
  instance there that is not running here yet, or whose stored meta is not what its
  last transaction left (``InstanceMemory.raw``): another process changed it. A lost
  datagram delays an event by at most that long; it never loses one.

Waking an instance sends it an alarm, which is harmless when early or stale:
its transaction reads the meta anew (``InstanceShell._load_meta``), starts the
event if one is due, and tells the clock of a later alarm slot. Only runtimes on
a real clock watch their store (``Clock.watches_store``): under a simulated
clock nothing polls and nothing listens.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import stat
import threading
import time
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import Any, Protocol

from dopool._clock.clocks import Clock
from dopool._engine.cells import Cells
from dopool._errors import ConfigurationError
from dopool._store.layout import POOL_NAME, Namespace, parse_work_entry, work_index

logger = logging.getLogger("dopool")

#: The wake-up socket's name in the store directory (an exclusive runtime's).
WAKE_SOCKET = "wake.sock"
#: The directory of shared workers' wake-up sockets, ``<owner>.sock`` each.
WAKE_DIRECTORY = "wake"
#: Seconds between a real-clock runtime's polls of its store (``Runtime(poll_interval=)``),
#: and the most it takes.
DEFAULT_POLL_INTERVAL = 1.0
MAX_POLL_INTERVAL = 3600.0
_MAX_ADDRESS = 107  # bytes of path a socket address holds (108 with its NUL)
_MAX_DATAGRAM = 128  # a pool name (64) and an index, with room to spare
_MAX_WORKERS = 64  # shared workers' socket addresses a producer keeps
_BURST = 256  # datagrams read in a row before the poll's turn is checked again


def _queue_limit() -> int:
    """How many datagrams the kernel queues on a UNIX socket before a sender's is refused
    (a non-blocking one's is then dropped): ``net.unix.max_dgram_qlen``, 10 by default."""
    try:
        with open("/proc/sys/net/unix/max_dgram_qlen", encoding="ascii") as limit:
            return max(1, int(limit.read()))
    except (OSError, ValueError):
        return 10


class WatchedStore(Protocol):
    """What the watcher needs of the runtime's store (:class:`dopool._store.environment.Store`)."""

    def read(self) -> AbstractContextManager[Any]: ...  # a read-only snapshot

    def clear_stale_readers(self) -> int: ...


def check_poll_interval(seconds: object) -> None:
    """Refuse a ``poll_interval`` that is not seconds > 0 and <= ``MAX_POLL_INTERVAL``."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= MAX_POLL_INTERVAL
    ):
        raise ConfigurationError(
            f"poll_interval must be seconds > 0 and <= {MAX_POLL_INTERVAL:g}, got {seconds!r}"
        )


def worker_socket(owner: str) -> str:
    """A shared worker's wake-up socket, relative to the store directory."""
    return f"{WAKE_DIRECTORY}/{owner}.sock"


def watch_store(
    clock: Clock,
    directory: Path,
    poll_interval: float,
    store: WatchedStore,
    owner: str | None = None,
) -> StoreWatcher | None:
    """A runtime's watcher, started; None under a clock that does not watch (simulated).
    ``owner``: a shared worker's id, whose socket it binds (else ``wake.sock``)."""
    if not clock.watches_store:
        return None
    name = WAKE_SOCKET if owner is None else worker_socket(owner)
    return StoreWatcher(directory, poll_interval, store, name)


def wake_message(pool: str, index: int) -> bytes:
    """The datagram that asks the owner to wake instance ``index`` of ``pool``."""
    return f"{pool}\0{index}".encode()


def parse_wake(data: bytes) -> tuple[str, int] | None:
    """``(pool, index)`` from a datagram, or None for anything that is not one."""
    pool, nul, digits = data.partition(b"\0")
    if not nul or not digits.isdigit() or len(digits) > 5:
        return None
    name = pool.decode("ascii", "replace")
    if not POOL_NAME.fullmatch(name):
        return None
    return name, int(digits)


class SocketAddress:
    """Where the wake-up socket is: its path, and the address to bind or send to.

    A socket address holds at most 107 bytes of path. A longer one is reached through a
    descriptor of the store directory, ``/proc/self/fd/<fd>/wake.sock`` (Linux), kept
    open until :meth:`close`; where that fails too, there is no socket (the poll stays).
    """

    __slots__ = ("_fd", "address", "path")

    def __init__(self, directory: Path, name: str = WAKE_SOCKET) -> None:
        self.path = str(directory / name)
        self.address = self.path
        self._fd: int | None = None
        if len(os.fsencode(self.path)) > _MAX_ADDRESS:
            flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
            with suppress(OSError):
                self._fd = os.open(directory, flags)
                self.address = f"/proc/self/fd/{self._fd}/{name}"

    def bind(self, kind: int) -> socket.socket:
        """A non-blocking UNIX socket of ``kind`` bound here, in place of a socket file a
        dead owner left (its caller's store lock, or owner id, says no live one uses it);
        anything else found there is left alone, and the bind fails.

        Raises:
            OSError: it cannot be made or bound.
        """
        path = self.path
        with suppress(OSError):  # a shared worker's: in a folder (if that fails, bind says)
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with suppress(OSError):  # none there (or unreadable: the bind says)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
        try:
            sock.bind(self.address)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class Notifier:
    """A producer's side: send wake-ups to the owner's socket, never blocking, never raising."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._target = SocketAddress(directory)
        self._address = self._target.address
        self._workers: dict[str, SocketAddress] = {}  # shared workers' sockets, by owner id
        self._socket: socket.socket | None = None
        with suppress(OSError):  # no socket: the owner's poll covers every event
            kind = socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
            self._socket = socket.socket(socket.AF_UNIX, kind)

    def wake(self, pool: str, index: int, owner: str | None = None) -> None:
        """Ask the owner to wake one instance; silently nothing if it cannot hear.

        ``owner``: the worker the instance's lease names, tried first; ``wake.sock``
        (an exclusive runtime's) if there is none, or if its socket is not there.
        """
        sock = self._socket
        if sock is None:
            return
        message = wake_message(pool, index)
        if owner is not None:
            target = self._workers.get(owner)
            if target is None:
                if len(self._workers) >= _MAX_WORKERS:  # owners come and go: forget them
                    self._forget_workers()
                target = self._workers[owner] = SocketAddress(self._directory, worker_socket(owner))
            try:
                sock.sendto(message, target.address)
            except (FileNotFoundError, ConnectionRefusedError):
                pass  # an exclusive runtime's lease: it listens on wake.sock
            except OSError:
                return  # a full buffer, say: the poll delivers
            else:
                return
        # No owner (ENOENT), a dead owner's file (ECONNREFUSED), a full buffer (EAGAIN),
        # a path too long for a socket address, a closed socket: the poll delivers.
        with suppress(OSError):
            sock.sendto(message, self._address)

    def _forget_workers(self) -> None:
        workers, self._workers = self._workers, {}
        for address in workers.values():
            address.close()

    def close(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()
        self._target.close()
        self._forget_workers()


class StoreWatcher:
    """The owning runtime's side: the socket's reader and the poll, on one daemon thread.

    Args:
        directory: the store directory, where the socket is bound.
        poll_interval: seconds between polls.
        store: the runtime's store, read by the poll, which also frees the reader
            slots of processes that died inside a read (``Store.clear_stale_readers``).
    """

    def __init__(
        self,
        directory: Path,
        poll_interval: float,
        store: WatchedStore,
        name: str = WAKE_SOCKET,
    ) -> None:
        """``name``: the socket's path in ``directory``."""
        self._address = SocketAddress(directory, name)
        self._interval = poll_interval
        self._store = store
        self._pools: dict[str, Cells] = {}  # replaced whole, read without a lock
        self._socket = self._bind()
        # Datagrams read since the socket was last found empty. A producer's wake-up is
        # dropped only while the queue is full, so when a run of reads reaches the queue's
        # limit one may have been: a poll then finds its instance at once.
        self._queue_limit = _queue_limit()
        self._unbroken = 0
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="dopool-watch", daemon=True)
        self._thread.start()

    @property
    def listening(self) -> bool:
        """Whether the wake-up socket is bound (else only the poll wakes instances)."""
        return self._socket is not None

    def watch(self, pool: str, cells: Cells) -> None:
        """Wake ``pool``'s instances from now on (one not running here yet is started)."""
        self._pools = {**self._pools, pool: cells}

    def _bind(self) -> socket.socket | None:
        """Bind the wake-up socket, replacing one a dead owner left; None if it cannot be.

        The runtime holds the store lock exclusively, or the name is its own owner id,
        so no live owner uses a socket found there.
        Anything there that is not a socket is left alone, and then there is none.
        """
        try:
            return self._address.bind(socket.SOCK_DGRAM)
        except OSError as exc:  # a read-only directory, a path too long, a file in the way
            logger.debug(
                "no wake-up socket at %r (%s): producers' events wait for the poll",
                self._address.path,
                exc,
            )
            return None

    def _run(self) -> None:
        sock = self._socket
        sources = [self._stop_read] if sock is None else [self._stop_read, sock.fileno()]
        due = time.monotonic() + self._interval
        while True:
            ready, _, _ = select.select(sources, [], [], max(0.0, due - time.monotonic()))
            if self._stop_read in ready:
                return
            if sock is not None and len(ready) > 0:
                self._receive(sock)
            if time.monotonic() >= due:
                self._poll()
                due = time.monotonic() + self._interval

    def _receive(self, sock: socket.socket) -> None:
        """Wake the instances the waiting datagrams name; anything else is ignored."""
        for _ in range(_BURST):
            try:
                data = sock.recv(_MAX_DATAGRAM)
            except BlockingIOError:  # none left
                unbroken, self._unbroken = self._unbroken, 0
                if unbroken >= self._queue_limit:  # the queue was full: a wake-up lost?
                    self._poll()
                return
            except OSError:  # the socket failed: the poll goes on
                return
            self._unbroken += 1
            target = parse_wake(data)
            if target is not None:
                self._wake(*target)

    def _wake(self, pool: str, index: int) -> None:
        """Send the instance an alarm, unless one it has not begun to handle is on its way:
        that one's transaction reads what was committed before. (So an instance busy in a
        long handler gets one alarm, not one per datagram or per poll.)"""
        cells = self._pools.get(pool)
        if cells is None or not 0 <= index < cells.concurrency:
            return  # a pool this runtime has not defined waits for one that does
        # Started (its recovery reads the store) if it was not running here, or put in line
        # for a slot; one another worker serves is not this one's to wake.
        cell = cells.get(index)
        if cell is None:
            cells.ready(index)
            return
        memory = cell.memory
        if memory.woken:
            return
        memory.woken = True  # before the send: the actor may begin on it at once
        if not cell.mailbox.fire_alarm():
            # Dropped: no actor here (another worker's instance, or one this worker is
            # only now taking). Marked woken, it would hold back every later wake-up
            # and poll of an instance the worker serves from the next moment on.
            memory.woken = False

    def _poll(self) -> None:
        """Wake every instance with work that is not running here, or whose stored meta is
        not what its last transaction left; free the reader slots that dead processes left."""
        try:
            cleared = self._store.clear_stale_readers()
        except Exception:  # the store closing under the poll, say: the next one retries
            logger.debug("the reader check failed", exc_info=True)
        else:
            if cleared:
                logger.info("freed %d reader slot(s) left by processes that died reading", cleared)
        for pool, cells in self._pools.items():
            try:
                with self._store.read() as txn:
                    stale = [index for index in _with_work(txn, pool) if _stale(txn, cells, index)]
            except Exception:  # the store closing under the poll, say: the next one retries
                logger.debug("the poll of pool %r failed", pool, exc_info=True)
                continue
            for index in stale:
                self._wake(pool, index)

    def close(self) -> None:
        """Stop the thread, then remove the socket (the store lock is still held)."""
        if self._stop_write < 0:
            return
        os.write(self._stop_write, b"\0")
        self._thread.join()
        os.close(self._stop_write)
        os.close(self._stop_read)
        self._stop_write = -1
        if self._socket is not None:
            self._socket.close()
            with suppress(OSError):
                os.unlink(self._address.path)
        self._address.close()


def _with_work(txn: Any, pool: str) -> list[int]:
    """The instances of ``pool`` the work index names, by index."""
    named = (parse_work_entry(key) for key in work_index(txn, pool))
    return [found[1] for found in named if found is not None]


def _stale(txn: Any, cells: Cells, index: int) -> bool:
    """Whether instance ``index`` is not running here, or another process changed its meta
    since its last transaction here."""
    if not 0 <= index < cells.concurrency:
        return False  # a stray entry (``dopool check`` reports it)
    cell = cells.get(index)
    return cell is None or Namespace(cells.name, index).meta_bytes(txn) != cell.memory.raw
