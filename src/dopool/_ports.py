"""What the tools may do to a runtime and its pools beyond the public API.

``dopool simulate`` (:mod:`dopool._sim`), ``dopool chaos`` (:mod:`dopool._chaos`)
and the CLI's dead-letter actions need three things docs/api.md does not offer:

- :func:`committed`: a read-only snapshot of a runtime's committed state, to read
  with :class:`dopool._layout.Namespace` and :func:`dopool._invariants.read_instance`;
- :func:`submit`: send one event (checked as ``enqueue`` checks it) to the instance it
  routes to, and get the reply
  without waiting for it (a simulator's arrival happens while the clock is being
  driven, when an instance may be asleep in its handler);
- :func:`send`: send a control message to one instance without waiting, likewise.

A runtime registers what serves them when it opens, and for each pool when it
defines it (:func:`expose_runtime`, :func:`expose_pool`); a tool passes the public
objects. So no tool reads the engine's attributes, nor holds its store or
mailboxes (tests/test_structure.py checks the first). A registration is weakly
keyed, and what it holds does not lead back to its key: it ends with its runtime
or pool.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from dopool._messages import Item

if TYPE_CHECKING:
    from dopool._instances import Instances
    from dopool._messages import Control, Reply
    from dopool._pool import WorkerPool
    from dopool._runtime import Runtime
    from dopool._storage import Txn

Read = Callable[[], AbstractContextManager["Txn"]]

_readers: WeakKeyDictionary[Runtime, Read] = WeakKeyDictionary()
_instances: WeakKeyDictionary[WorkerPool, Instances] = WeakKeyDictionary()
_prepares: WeakKeyDictionary[WorkerPool, Callable[[Any, str | None, int], Item]] = (
    WeakKeyDictionary()
)


def expose_runtime(runtime: Runtime, read: Read) -> None:
    """Called by the runtime as it opens: ``read`` gives a snapshot of its store."""
    _readers[runtime] = read


def expose_pool(
    pool: WorkerPool, instances: Instances, prepare: Callable[[Any, str | None, int], Item]
) -> None:
    """Called by the runtime as it defines ``pool``, whose instances are ``instances``;
    ``prepare`` checks and encodes an event as the pool's ``enqueue`` does (its schema)."""
    _instances[pool] = instances
    _prepares[pool] = prepare


def committed(runtime: Runtime) -> AbstractContextManager[Txn]:
    """A read-only snapshot of ``runtime``'s committed state: a context manager
    yielding the read transaction. It never waits for writers.

    Raises:
        StorageError: the read failed (e.g. the runtime is closed).
    """
    return _readers[runtime]()


def submitter(
    pool: WorkerPool,
) -> Callable[[Any, str | None, str | None, float | None], tuple[int, Reply]]:
    """:func:`submit` for ``pool``, looked up once:
    ``submitter(pool)(event, partition_key, dedup_key, due)`` (a simulator submits every
    arrival; its dedup keys are its own, made valid, and ``due`` a finite clock time)."""
    prepare, instances = _prepares[pool], _instances[pool]

    def submit_to_pool(
        event: Any,
        partition_key: str | None,
        dedup_key: str | None = None,
        due: float | None = None,
    ) -> tuple[int, Reply]:
        item = prepare(event, partition_key, 0)
        if dedup_key is not None or due is not None:
            item = Item(item.event, item.partition_key, item.priority, due, dedup_key)
        return instances.submit(item, partition_key)

    return submit_to_pool


def submit(pool: WorkerPool, event: Any, partition_key: str | None) -> tuple[int, Reply]:
    """Send one event to the instance ``partition_key`` routes it to, checked and encoded
    as ``pool.enqueue`` does (the pool's schema included).

    Returns at once: that instance's index, and the reply. The reply answers what
    ``enqueue_many`` would for this one event (a list of one
    :class:`~dopool.EnqueueResult`), or raises its error.

    Raises:
        EventValidationError, EventTooLargeError: as ``enqueue`` would; nothing is sent.
    """
    item = _prepares[pool](event, partition_key, 0)
    return _instances[pool].submit(item, partition_key)


def send(pool: WorkerPool, index: int, message: Callable[[Reply], Control]) -> Reply:
    """Send instance ``index`` of ``pool`` ``message(reply)`` (e.g. ``Pause``); returns at once.

    Raises:
        ConfigurationError: the pool has no such instance.
    """
    instances = _instances[pool]
    return instances.send(instances.check(index), message)
