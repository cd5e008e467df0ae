"""A runtime as dopool's own tools drive it: the public runtime, and four calls more.

``dopool simulate`` (:mod:`dopool._sim`), ``dopool chaos`` (:mod:`dopool._chaos`) and
the offline store view (:mod:`dopool._ops.storeview`) open a :class:`ToolRuntime`
where a user opens a :class:`~dopool.Runtime`. It is the same runtime (a user's app
under ``dopool simulate --app`` defines its pools on it as on any other), with what
the tools need that docs/api.md does not offer:

- :meth:`~ToolRuntime.committed`: a read-only snapshot of the committed state, to read
  with :class:`dopool._store.layout.Namespace` and
  :func:`dopool._machine.invariants.read_instance`;
- :meth:`~ToolRuntime.submitter`: send one event (checked as ``enqueue`` checks it) to
  the instance it routes to, and get the reply without waiting for it (a simulator's
  arrival happens while the clock is being driven, when an instance may be asleep in
  its handler);
- :meth:`~ToolRuntime.send`: send a caller's request to one instance without waiting,
  likewise;
- :meth:`~ToolRuntime.store_calls`: store producers' requests as the call socket does
  (a Ray shard host's, :mod:`dopool._ray.host`).

A simulation's temporary store, which nobody opens after the run, is opened as a
:class:`ScratchRuntime`: LMDB then writes its pages in place.

So a tool holds only the runtime it opened and the pools it defined: it reads none
of the engine's attributes (tests/test_structure.py checks it), and nothing is
registered anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

from dopool._cluster.owner_wire import Request as OwnerRequest
from dopool._engine.call_store import Answers, Refusals
from dopool._engine.messages import Control, Reply
from dopool._engine.pool_instances import Instances
from dopool._errors import ConfigurationError, PoolClosedError, shown
from dopool._handles.pool import WorkerPool
from dopool._handles.runtime import Runtime
from dopool._machine.types import Item, Request
from dopool._store.txn import Txn

#: ``submit(event, partition_key, dedup_key, due)``: the instance it went to, and its reply.
Submit = Callable[[Any, str | None, str | None, float | None], tuple[int, Reply]]
Prepare = Callable[[Any, str | None, int], Item]


class ToolRuntime(Runtime):
    """A :class:`~dopool.Runtime` with the calls dopool's tools make (see the module)."""

    def committed(self) -> AbstractContextManager[Txn]:
        """A read-only snapshot of the committed state: a context manager yielding the
        read transaction. It never waits for writers.

        Raises:
            StorageError: the read failed (e.g. the runtime is closed).
        """
        return self._store.read()

    def submitter(self, pool: WorkerPool) -> Submit:
        """``submit(event, partition_key, dedup_key=None, due=None)`` for ``pool``: the
        event checked and encoded as ``pool.enqueue`` does (its schema), sent to the
        instance it routes to; returns at once, that instance's index and the reply,
        which answers what ``enqueue_many`` would for this one event. A simulator's
        dedup keys are its own, made valid, and ``due`` a finite clock time.

        Raises:
            ConfigurationError: ``pool`` is not one this runtime defined.
        """
        instances, prepare = self._parts(pool)

        def submit(
            event: Any,
            partition_key: str | None,
            dedup_key: str | None = None,
            due: float | None = None,
        ) -> tuple[int, Reply]:
            item = prepare(event, partition_key, 0)
            if dedup_key is not None or due is not None:
                item = Item(item.event, item.partition_key, item.priority, due, dedup_key)
            return instances.submit(item, partition_key)

        return submit

    def send(self, pool: WorkerPool, index: int, request: Request) -> Reply:
        """Send instance ``index`` of ``pool`` ``request`` (e.g. ``Pause()``); returns at once.

        Raises:
            ConfigurationError: ``pool`` is not one this runtime defined, or has no such
                instance.
        """
        instances, _ = self._parts(pool)
        return instances.send(instances.check(index), partial(Control, request))

    def store_calls(self, requests: list[OwnerRequest], refused: Refusals | None = None) -> Answers:
        """Store producers' requests in one transaction, as this runtime's call socket
        does (:class:`~dopool._engine.call_store.CallStore`), once durable; each one's
        answers. ``refused`` receives the refused calls' errors.

        Raises:
            PoolClosedError: the runtime is closed.
        """
        if self._closed:
            raise PoolClosedError("*")
        return self._call_store.store(requests, refused)

    def _parts(self, pool: WorkerPool) -> tuple[Instances, Prepare]:
        address = self._directory.get(pool.name)
        if address is None or address.handle() is not pool:
            raise ConfigurationError(f"{shown(pool)} is not a pool of this runtime")
        return self._pools[pool.name], address.prepare


class ScratchRuntime(ToolRuntime):
    """A :class:`ToolRuntime` on a store that is deleted after it, which nobody else
    opens: a simulation's temporary store (LMDB writes its pages in place; see
    :class:`dopool._store.environment.Store`'s ``scratch``)."""

    _scratch_store = True
