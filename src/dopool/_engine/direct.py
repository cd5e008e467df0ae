"""Enqueues made from the caller's own thread while the instance is free (no thread hop)."""

from __future__ import annotations

import logging
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
from dopool._machine.types import Effects, Item
from dopool._types import EnqueueResult

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
    """

    def enqueue(
        self, items: tuple[Item, ...], call: CallMark | None = None
    ) -> list[EnqueueResult] | None:
        """Store ``items`` atomically; None if the instance must be sent a message instead.

        That is the case while the instance is busy, killed or recovering (the
        message then queues behind the recovery), and once the runtime is closing.
        ``call``: a producer's call the owner takes (see :class:`Enqueue`).
        """
        mailbox, memory = self._mailbox, self._memory
        if not memory.turn.try_acquire():
            return None
        try:
            if not self._supervisor.takes_direct_calls():
                return None
            self._kill = self._supervisor.kill_flag  # this incarnation's (see InstanceShell)
            reply = Reply()
            self._taken = [Enqueue(items, reply, call)]
            effects = Effects()
            try:
                meta, started = self._transact(self._enqueue_body(effects, mailbox.idle))
            except Crash as crash:
                self._crash(crash.point)
            except Exception as exc:
                if mailbox.closed:  # the runtime closed the store under this call
                    self._taken = []
                    raise PoolClosedError(self._spec.name) from exc
                if isinstance(exc, StorageError) or not isinstance(exc, DopoolError):
                    logger.exception("instance %s failed an enqueue", self._id)
                    self._crash(f"{type(exc).__name__}: {exc}", exc)
                self._taken = []
                raise
            in_handler = self._env.in_handler
            caller = getattr(in_handler, "instance", None)
            outer = getattr(in_handler, "outer", ())
            if caller is not None:  # still blocked meanwhile: see ``_waits.acting``
                in_handler.outer = (*outer, caller)
            in_handler.instance = (self._spec.name, self._index)  # hooks act as the instance
            try:
                self._publish(meta, effects)
            finally:
                in_handler.instance = caller
                in_handler.outer = outer
            memory.last_active = self._clock.now()  # keeps the instance from eviction
            if started is not None:  # the actor runs it next
                memory.handed_off = started
                mailbox.send(HandedOff())  # if refused (closing), the actor's on_stop runs it
        finally:
            memory.turn.release()
        return reply.get(timeout=0)  # type: ignore[no-any-return]

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
