"""Enqueues made from the caller's own thread while the instance is free (no thread hop)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from typing import NoReturn

from dopool._engine.messages import CallMark, Enqueue, HandedOff, Reply
from dopool._engine.shell import Crash, InstanceShell
from dopool._errors import (
    DamagedRecordError,
    DopoolError,
    InstanceCrashedError,
    PoolClosedError,
    StorageError,
)
from dopool._machine.types import Effects, Item, Started
from dopool._store.layout import Meta
from dopool._store.txn import Txn
from dopool._types import EnqueueResult

#: An enqueue's transaction body, taken with the instance's turn (``DirectEnqueue.take``).
DirectBody = Callable[[Txn], tuple[Meta, Started | None]]

logger = logging.getLogger("dopool")


class DirectEnqueue(InstanceShell):
    """Enqueue from the caller's own thread while the instance is free: no thread hop.

    If nobody holds the instance's turn, the caller takes it and runs the
    instance's enqueue transaction itself, as the actor would; what it commits
    it publishes at once, still holding the turn, so subscribers and hooks see
    the same order. An attempt it starts on an idle instance is handed to the
    actor, which runs it before its next message. A busy instance gets a
    message instead: its actor takes it into the transaction of its current
    event's outcome.

    :meth:`enqueue` does it all; a caller that stores several instances' enqueues in
    one transaction of its own (producers' calls, ``_engine/call_store.py``) takes
    each with :meth:`take`, runs its body nested in that transaction, and settles it
    with :meth:`committed` or :meth:`failed`.
    """

    _reply: Reply  # the taken enqueue's: answered by its transaction
    _effects: Effects

    def enqueue(
        self, items: tuple[Item, ...], call: CallMark | None = None
    ) -> list[EnqueueResult] | None:
        """Store ``items`` atomically; None if the instance must be sent a message instead.

        That is the case while the instance is busy, killed or recovering (the
        message then queues behind the recovery), and once the runtime is closing.
        ``call``: a producer's call the owner takes (see :class:`Enqueue`).
        """
        body = self.take(items, call)
        if body is None:
            return None
        try:
            result = self._store.transact(body)
        except BaseException as exc:
            self.failed(exc)
        return self.committed(result)

    def take(self, items: tuple[Item, ...], call: CallMark | None = None) -> DirectBody | None:
        """Take the instance's turn for an enqueue of ``items``: the body of its write
        transaction, or None if the instance must be sent a message instead (nothing
        taken). Whoever runs the body hands its result to :meth:`committed`, or what it
        raised (or its commit) to :meth:`failed`; either gives the turn back."""
        memory = self._memory
        if not memory.turn.try_acquire():
            return None
        try:
            if not self._supervisor.takes_direct_calls():
                memory.turn.release()
                return None
            self._kill = self._supervisor.kill_flag  # this incarnation's (see InstanceShell)
            self._reply = Reply()
            self._taken = [Enqueue(items, self._reply, call)]
            self._effects = Effects()
            return self._guarded(self._enqueue_body(self._effects, self._mailbox.idle))
        except BaseException:
            memory.turn.release()
            raise

    def committed(self, result: tuple[Meta, Started | None]) -> list[EnqueueResult]:
        """The taken enqueue's transaction committed with ``result``: publish what it
        committed, hand any attempt it started to the actor; its results."""
        memory, mailbox = self._memory, self._mailbox
        try:
            self._committed()
            meta, started = result
            in_handler = self._env.in_handler
            caller = getattr(in_handler, "instance", None)
            outer = getattr(in_handler, "outer", ())
            if caller is not None:  # still blocked meanwhile: see ``_waits.acting``
                in_handler.outer = (*outer, caller)
            in_handler.instance = (self._spec.name, self._index)  # hooks act as the instance
            try:
                self._publish(meta, self._effects)
            finally:
                in_handler.instance = caller
                in_handler.outer = outer
            memory.last_active = self._clock.now()  # keeps the instance from eviction
            if started is not None:  # the actor runs it next
                memory.handed_off = started
                mailbox.send(HandedOff())  # if refused (closing), the actor's on_stop runs it
        finally:
            memory.turn.release()
        return self._reply.get(timeout=0)  # type: ignore[no-any-return]

    def failed(self, exc: BaseException) -> NoReturn:
        """The taken enqueue's transaction raised ``exc``, or did not commit: nothing of
        it is stored. Raises what the caller gets (a crash's :class:`InstanceCrashedError`,
        :class:`PoolClosedError` once the runtime closed the store, or ``exc``)."""
        try:
            try:
                self._rolled_back(exc)
            except Crash as crash:
                self._crash(crash.point)
            if isinstance(exc, Crash):
                self._crash(exc.point)
            if isinstance(exc, Exception):
                if self._mailbox.closed:  # the runtime closed the store under this call
                    self._taken = []
                    raise PoolClosedError(self._spec.name) from exc
                if isinstance(exc, StorageError) or not isinstance(exc, DopoolError):
                    logger.error("instance %s failed an enqueue", self._id, exc_info=exc)
                    self._crash(f"{type(exc).__name__}: {exc}", exc)
                self._taken = []
            raise exc
        finally:
            self._memory.turn.release()

    def _crash(self, reason: str, cause: BaseException | None = None) -> NoReturn:
        """Nothing was committed; the instance crashes as if it had failed this itself.

        The caller gets :class:`InstanceCrashedError`, or the damaged record's
        own error when that is the cause: it names what is wrong.
        """
        self._taken = []
        with suppress(PoolClosedError):
            self._supervisor.kill(reason)
        if isinstance(cause, DamagedRecordError):
            raise cause
        raise InstanceCrashedError(self._id) from cause
