"""A pool's calls to its instances: a message sent, its answer waited for.

One instance at a time, or all at once; from an instance's thread, each wait
recorded in the runtime's wait-for graph first (a cycle is refused); under a
simulated clock, a crash settled before it is raised, so the run is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dopool._engine.messages import Reply
from dopool._engine.pool_context import PoolContext
from dopool._engine.pool_instances import Instances
from dopool._engine.wait_graph import acting
from dopool._errors import InstanceCrashedError


class Calls:
    """How :class:`~dopool._handles.pool.WorkerPool` calls its instances and waits for them."""

    __slots__ = ("_cells", "_context", "_instances", "_name")

    def __init__(self, context: PoolContext, instances: Instances) -> None:
        self._context = context
        self._instances = instances
        self._cells = instances.cells
        self._name = instances.name

    def send_each(self, messages: list[tuple[int, Callable[[Reply], Any]]]) -> list[Any]:
        """Send each instance its message, one after another or all at once; the answers."""
        if self.one_at_a_time():
            return [self.call(i, message) for i, message in messages]
        futures = [self._instances.send(i, message) for i, message in messages]
        return [future.get() for future in futures]

    def one_at_a_time(self) -> bool:
        """Whether a call to several instances must message them one after another.

        Under a simulated clock, so that the run is reproducible; and from an
        instance's thread, which may wait for one instance at a time only (see
        ``call``).
        """
        return self._context.clock.orders_calls or bool(acting(self._context.in_handler))

    def call(self, index: int, message: Callable[[Reply], Any]) -> Any:
        """Send one instance a message and wait for its answer.

        From an instance's thread, the wait is recorded in the runtime's
        wait-for graph before the message is sent: if the instance addressed
        already waits, through a chain of others, for the calling one, the wait
        would never end, and :class:`DeadlockError` is raised with nothing sent.
        """
        waiters = acting(self._context.in_handler)
        if not waiters:
            return self.wait(self._instances.send(index, message))
        mailbox = self._cells[index].mailbox
        reply = mailbox.reply()
        with self._context.waits.waiting(waiters, (self._name, index), reply):
            mailbox.send(message(reply))
            return self.wait(reply)

    def wait(self, future: Reply) -> Any:
        """The answer to a call; under a simulated clock, a crash settles before it is raised.

        The restarted instance recovers on its own thread: waiting for it keeps
        the next call, and so the trace, in a reproducible order.
        """
        try:
            return future.get()
        except InstanceCrashedError:
            self.settle_crash()
            raise

    def settle_crash(self) -> None:
        """Where calls are ordered (a simulated clock), wait for a crashed instance's recovery."""
        if self._context.handler_running() is None:
            self._context.clock.settle()
