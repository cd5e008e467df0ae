"""The owner's side of a producer's enqueue sent to it: a socket, and the calls stored.

A runtime on a real clock that serves a store (an exclusive one, or a ``dopool worker``)
listens on a UNIX stream socket beside its wake-up socket: ``<store>/calls.sock``, or
``<store>/calls/<owner>.sock`` for a shared worker. A producer (``dopool.connect``,
``_handles/owner_link.py``) that finds it sends its enqueues there in frames
(:mod:`dopool._cluster.owner_wire`), as many as its threads have ready, and waits for
the answer.

One thread serves every connection here: it stores the frames that have come in one
write transaction of the runtime's store, through its committer
(:class:`~dopool._engine.call_store.CallStore`, which a Ray shard host shares): under
``durability="sync"`` that transaction joins the group commit of the runtime's own
instances and of the other connections' frames, so they share one fsync. Each call is
stored with its call record (:mod:`dopool._store.layout.calls`), its event started in
that commit if its instance runs here and is free. The answer goes back only once the
transaction is durable, under the producer's durability (a ``"sync"`` producer's calls
on an ``"async"`` store are fsynced before the answer).

A call is answered nil, and so stored by its producer instead, when its pool is not
defined here or its instance is not served here. One refused for a full queue (by this
runtime's ``max_queue_depth``) is answered with that refusal, and its producer raises
``QueueFullError`` with nothing stored, as an enqueue made here would. A frame that is
not what a producer sends closes its connection; a transaction that fails answers all
its calls nil. Nothing a producer sends can stop the runtime or another connection.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
from contextlib import suppress
from pathlib import Path

from dopool._clock.clocks import Clock
from dopool._cluster.owner_wire import (
    HEADER,
    Answer,
    Full,
    Request,
    WireError,
    decode_request,
    encode_answer,
    frame_length,
)
from dopool._engine.call_store import CallStore, Refusals
from dopool._engine.wakeups import SocketAddress
from dopool._errors import QueueFullError

logger = logging.getLogger("dopool")

#: The socket's name in the store directory (an exclusive runtime's), and the directory of
#: shared workers' sockets, ``<owner>.sock`` each.
CALL_SOCKET = "calls.sock"
CALL_DIRECTORY = "calls"
_BACKLOG = 64
_RECEIVE = 1 << 20  # bytes read from a connection at once
_UNSENT = 16 << 20  # answers a producer leaves unread before it is dropped


def call_socket(owner: str | None) -> str:
    """The owner's call socket, relative to the store directory."""
    return CALL_SOCKET if owner is None else f"{CALL_DIRECTORY}/{owner}.sock"


def serve_calls(
    clock: Clock, directory: Path, calls: CallStore, owner: str | None = None
) -> OwnerCalls | None:
    """The runtime's call socket, listening; None under a clock that does not watch its
    store (simulated), or where no socket can be bound (producers then store their calls
    themselves, as always)."""
    if not clock.watches_store:
        return None
    server = OwnerCalls(directory, calls, call_socket(owner))
    return server if server.listening else None


class OwnerCalls:
    """The call socket and its connections, served by one thread (see the module docstring).

    The thread waits for any connection to send; then it reads every frame that has come,
    from all of them, stores their calls in one transaction, and sends each its answer.
    """

    def __init__(self, directory: Path, calls: CallStore, name: str) -> None:
        self._calls = calls
        self._address = SocketAddress(directory, name)
        self._socket = self._bind()
        self._thread: threading.Thread | None = None
        self._stop_read, self._stop_write = os.pipe()
        if self._socket is not None:
            self._thread = threading.Thread(
                target=self._run, args=(self._socket,), name="dopool-calls", daemon=True
            )
            self._thread.start()

    @property
    def listening(self) -> bool:
        return self._socket is not None

    def _bind(self) -> socket.socket | None:
        """Bind and listen, replacing a socket a dead owner left (the store lock, or the
        owner id, says no live one uses it); None if that cannot be done."""
        sock = None
        try:
            sock = self._address.bind(socket.SOCK_STREAM)
            sock.listen(_BACKLOG)
        except OSError as exc:
            if sock is not None:
                sock.close()
            logger.debug(
                "no call socket at %r (%s): producers store their calls", self._address.path, exc
            )
            return None
        return sock

    def _run(self, listener: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._stop_read, selectors.EVENT_READ)
        selector.register(listener, selectors.EVENT_READ)
        peers: dict[int, _Peer] = {}
        try:
            while True:
                ready: list[tuple[_Peer, Request]] = []
                for key, mask in selector.select():
                    if key.fileobj == self._stop_read:
                        return
                    if key.fileobj is listener:
                        self._accept(listener, selector, peers)
                        continue
                    peer = peers[key.fd]
                    if mask & selectors.EVENT_WRITE and not peer.flush():
                        _drop(peer, selector, peers)
                        continue
                    if mask & selectors.EVENT_READ:
                        try:
                            requests = peer.receive()
                        except (OSError, WireError) as exc:
                            if isinstance(exc, WireError):
                                logger.warning("a producer's call frame was refused: %s", exc)
                            _drop(peer, selector, peers)
                            continue
                        ready.extend((peer, request) for request in requests)
                if ready:
                    for peer, answer in zip(
                        (peer for peer, _ in ready), self._store_all(ready), strict=True
                    ):
                        if peer.fd in peers and not peer.send(answer, selector):
                            _drop(peer, selector, peers)
        except Exception:  # never reached by a producer's bytes; the runtime goes on without
            logger.exception("the call socket failed; producers store their calls themselves")
        finally:
            for peer in list(peers.values()):
                _drop(peer, selector, peers)
            selector.close()
            # No one answers from now on: a producer's connect is refused at once, and it
            # stores its calls itself rather than wait for an answer that never comes.
            listener.close()

    def _accept(
        self, listener: socket.socket, selector: selectors.BaseSelector, peers: dict[int, _Peer]
    ) -> None:
        try:
            connection, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of descriptors, say: the producer falls back
            logger.debug("a producer's connection was not accepted: %s", exc)
            return
        connection.setblocking(False)
        peer = _Peer(connection)
        peers[peer.fd] = peer
        selector.register(connection, selectors.EVENT_READ)

    def _store_all(self, ready: list[tuple[_Peer, Request]]) -> list[bytes]:
        """Store every request's calls in one transaction; each request's answer frame, a
        call refused for a full queue answered with its refusal (the producer raises
        it), any other refusal nil (the producer's own transaction gives it its error)."""
        refused: Refusals = {}
        stored = self._calls.store([request for _, request in ready], refused)
        frames = []
        for position, answers in enumerate(stored):
            found: list[tuple[int, Answer]] = []
            for number, results in answers:
                error = refused.get((position, number))
                if isinstance(error, QueueFullError):
                    found.append((number, Full(error.depth, error.max_depth, error.incoming)))
                else:
                    found.append((number, results))
            frames.append(encode_answer(found))
        return frames

    def close(self, grace: float) -> None:
        """Stop listening and drop every connection (their producers store their calls
        themselves from then on), once the calls being stored are; wait for that at most
        ``grace`` seconds (a subscriber that never returns keeps the thread, a daemon)."""
        if self._stop_write < 0:
            return
        os.write(self._stop_write, b"\0")
        if self._thread is not None:
            self._thread.join(grace)
        os.close(self._stop_write)
        self._stop_write = -1
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()
            with suppress(OSError):
                os.unlink(self._address.path)
        self._address.close()


class _Peer:
    """A producer's connection: what it has sent of the next frame, what is left to send it."""

    __slots__ = ("fd", "inbound", "outbound", "sock", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.inbound = bytearray()
        self.outbound = bytearray()
        self.writing = False  # registered for writing: the last answer did not fit at once

    def receive(self) -> list[Request]:
        """Read what has come; the requests it completes (OSError: the connection closed)."""
        data = self.sock.recv(_RECEIVE)
        if not data:
            raise ConnectionResetError("the producer closed its connection")
        inbound = self.inbound
        inbound += data
        requests: list[Request] = []
        while len(inbound) >= HEADER:
            length = frame_length(bytes(inbound[:HEADER]))
            if len(inbound) < HEADER + length:
                break
            requests.append(decode_request(bytes(inbound[HEADER : HEADER + length])))
            del inbound[: HEADER + length]
        return requests

    def send(self, answer: bytes, selector: selectors.BaseSelector) -> bool:
        """Send ``answer``, what does not fit now later; False if the producer is gone or
        reads nothing (its unsent answers past :data:`_UNSENT`)."""
        self.outbound += answer
        if len(self.outbound) > _UNSENT:
            return False
        if not self.flush():
            return False
        if self.outbound and not self.writing:
            selector.modify(self.sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            self.writing = True
        return True

    def flush(self) -> bool:
        """Send what the socket takes now; False if the producer is gone."""
        try:
            while self.outbound:
                sent = self.sock.send(self.outbound)
                del self.outbound[:sent]
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return True


def _drop(peer: _Peer, selector: selectors.BaseSelector, peers: dict[int, _Peer]) -> None:
    peers.pop(peer.fd, None)
    with suppress(KeyError, ValueError):
        selector.unregister(peer.sock)
    peer.sock.close()
