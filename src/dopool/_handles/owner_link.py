"""A producer's side of the enqueues it sends to the owner of their instance.

A :class:`~dopool.Connection` made with ``via_owner=True`` (the default) sends each
enqueue whose events go to one instance to the process that serves it, on that
process's call socket (``_engine/owner_calls.py``): the worker its lease names, or an
exclusive runtime. The owner stores it in its own transaction, sharing the fsync with
its other work, and answers once that is durable. The wire is
:mod:`dopool._cluster.owner_wire`.

**Batches.** One socket per owner, and one call in flight on it at a time: the threads
that call while a frame is out queue their calls, and the first of them sends all the
queued ones in the next frame, as group commit gathers writers (so a process's threads
share one round trip, and the owner one transaction for them).

**When the owner does not answer.** No socket, a refused connection, a connection that
breaks, an answer that takes more than :data:`ANSWER_TIMEOUT` seconds, a call answered
nil: the producer stores the call itself, in its own transaction, as it did before
owners took calls. It must not store twice a call the owner stored, so every call sent
carries the connection's producer id and a call number, and the fallback's transaction
looks for the call's record first (``_store/layout/calls.py``): if the owner stored it,
the answer is the owner's. An owner that fails is left alone for :data:`RETRY_AFTER`
seconds (its calls go straight to the store meanwhile). Per-partition order holds on
both paths and across the switch: a thread's next call starts only once its last one is
stored, by either.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import suppress
from pathlib import Path

from dopool._cluster.call_numbers import CallNumbers
from dopool._cluster.owner_wire import (
    HEADER,
    MAX_CALLS,
    Answer,
    Call,
    Request,
    WireError,
    decode_answer,
    encode_request,
    frame_length,
)
from dopool._engine.owner_calls import call_socket
from dopool._engine.wakeups import SocketAddress

#: Seconds a producer waits for an owner's answer (connecting included) before it stores
#: its calls itself.
ANSWER_TIMEOUT = 5.0
#: Seconds an owner that failed a call is left alone.
RETRY_AFTER = 1.0
_MAX_OWNERS = 64  # owners' links a connection keeps at once


class OwnerLinks:
    """A connection's links to the owners of its instances, and its producer id and call
    numbers (``numbers``: each call takes one, and gives it back once its caller has its
    answer, by whichever path). Thread-safe."""

    def __init__(self, directory: Path, *, sync: bool) -> None:
        self.numbers = CallNumbers()
        self._directory = directory
        self._sync = sync
        self._lock = threading.Lock()
        self._links: dict[str | None, _Link] = {}
        self._closed = False

    def call(self, owner: str | None, call: Call) -> Answer:
        """``call`` stored by the worker ``owner`` (None: an exclusive runtime), and its
        results; None if it did not answer them (the caller stores the call itself); a
        :class:`Full` if it refused the call (its queue full: nothing stored)."""
        link = self._link(owner)
        return None if link is None else link.call(call, self)

    def _link(self, owner: str | None) -> _Link | None:
        with self._lock:
            if self._closed:
                return None
            link = self._links.get(owner)
            if link is None:
                if len(self._links) >= _MAX_OWNERS:  # owners come and go: forget them
                    for stale in self._links.values():
                        stale.close()
                    self._links.clear()
                # A lease names a shared worker, or an exclusive runtime (which listens on
                # the store's own socket, tried second).
                names = [call_socket(None)] if owner is None else [call_socket(owner)]
                if owner is not None:
                    names.append(call_socket(None))
                addresses = [SocketAddress(self._directory, name) for name in names]
                link = self._links[owner] = _Link(addresses, self._sync)
            return link

    def close(self) -> None:
        with self._lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()


class _Job:
    __slots__ = ("call", "done", "lead", "results")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.results: Answer = None
        self.done = False
        self.lead = False  # handed the next frame to send


class _Link:
    """One owner's socket: a frame out at a time, the calls queued meanwhile sent next."""

    def __init__(self, addresses: list[SocketAddress], sync: bool) -> None:
        self._addresses = addresses  # tried in order
        self._sync = sync
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Job] = []
        self._busy = False
        self._socket: socket.socket | None = None
        self._failed_at: float | None = None  # when it last failed (monotonic)
        self._closed = False

    def call(self, call: Call, links: OwnerLinks) -> Answer:
        job = _Job(call)
        with self._cond:
            if self._closed or self._resting():
                return None
            self._queue.append(job)
            if self._busy:
                self._cond.wait_for(lambda: job.done or job.lead)
                if job.done:
                    return job.results
            self._busy = True
        # This thread sends the next frame: its own call and those queued before it.
        with self._cond:
            batch, self._queue = self._queue[:MAX_CALLS], self._queue[MAX_CALLS:]
        answers = None
        try:
            answers = self._exchange([job.call for job in batch], links)
        finally:  # (a KeyboardInterrupt too: the others store their calls, none waits on)
            with self._cond:
                for queued in batch:
                    queued.results = None if answers is None else answers.get(queued.call.number)
                    queued.done = True
                if self._queue:
                    self._queue[0].lead = True
                else:
                    self._busy = False
                self._cond.notify_all()
        return job.results

    def _resting(self) -> bool:
        failed = self._failed_at
        return failed is not None and time.monotonic() - failed < RETRY_AFTER

    def _exchange(self, calls: list[Call], links: OwnerLinks) -> dict[int, Answer] | None:
        """Send ``calls`` in one frame and read the answer; None if the owner failed."""
        numbers = links.numbers
        request = Request(numbers.producer, numbers.done_below(), self._sync, calls)
        try:
            sock = self._connected()
            sock.sendall(encode_request(request))
            header = _read(sock, HEADER)
            return decode_answer(_read(sock, frame_length(header)))
        except (OSError, WireError):
            self._fail()
            return None

    def _connected(self) -> socket.socket:
        sock = self._socket
        if sock is not None:
            return sock
        last = self._addresses[-1]
        for address in self._addresses:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.settimeout(ANSWER_TIMEOUT)
            try:
                sock.connect(address.address)
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if address is last:
                    raise
                continue  # nobody there: the next
            except OSError:
                sock.close()
                raise
            self._socket = sock
            return sock
        raise AssertionError("a link has an address")  # pragma: no cover

    def _fail(self) -> None:
        """Drop the socket, and leave the owner alone for a while."""
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()
        self._failed_at = time.monotonic()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            sock, self._socket = self._socket, None
        if sock is not None:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for address in self._addresses:
            address.close()


def _read(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes (OSError: the connection closed or timed out first)."""
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionResetError("the owner closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
